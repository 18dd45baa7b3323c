"""What memproj logs about a failure: the class and a content-free code, never the exception's
text, which may quote the message that failed. Pure parts, then a worker on the real stack
whose failing event's marker is in no worker's log once its subject is erased."""

from __future__ import annotations

import logging
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from confluent_kafka import KafkaError, KafkaException

from streams import logs
from streams.failures import SystemicFailure, error_code, loggable
from streams.isolation import CircuitBreaker, Failure, StageFailed
from streams.kafka_security import KafkaSecurityError
from streams.sample import EventFactory
from streams.worker import CONSUMING_KINDS
from support.deadletters import open_topic_letters
from support.deletion_scenario import wait_verified
from support.environment import Env, stop_all
from topics.outputs import DeadLetterReason
from topics.registry import DELETION_REQUESTS, MEMORY_EVENTS

ROW = "MARKER-in-a-row"


def test_a_log_says_the_class_and_code_never_the_text() -> None:
    said = loggable(psycopg.errors.CheckViolation(f"Failing row contains ({ROW})"))
    assert said == "CheckViolation [23514]"
    refused = KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, f"{ROW} too large"))
    assert loggable(refused) == "KafkaException [MSG_SIZE_TOO_LARGE]"
    assert loggable(ValueError(ROW)) == "ValueError"
    # What memproj composes itself is said whole: it quotes no message.
    assert loggable(KafkaSecurityError("Kafka at b:1: authentication failed")).endswith(
        "Kafka at b:1: authentication failed"
    )
    assert "tripped" in loggable(SystemicFailure("w: circuit breaker tripped"))
    # A wrapper is said with its cause, each by class and code.
    wrapped = StageFailed("write", ValueError(ROW))
    wrapped.__cause__ = wrapped.cause
    assert loggable(wrapped) == "StageFailed (from ValueError)" and ROW not in str(wrapped)


def test_error_codes_quote_nothing() -> None:
    assert error_code(FileNotFoundError(2, ROW, ROW)) == "ENOENT"
    assert error_code(ValueError(ROW)) is None


def test_a_failure_is_logged_without_its_detail_and_sealed_with_it() -> None:
    failure = Failure.of(StageFailed("write", ValueError(f"Failing row contains ({ROW})")))
    assert ROW in failure.describe()  # the dead letter's sealed detail
    assert failure.loggable() == "write: ValueError"
    breaker = CircuitBreaker("memory", min_failures=1)
    with pytest.raises(SystemicFailure) as tripped:
        breaker.check(1, [failure])
    assert ROW not in str(tripped.value)


@pytest.fixture
def content_free_logging() -> Iterator[None]:
    factory = logging.getLogRecordFactory()
    hooks = (sys.excepthook, threading.excepthook)
    logs.install()
    try:
        yield
    finally:
        logging.setLogRecordFactory(factory)
        sys.excepthook, threading.excepthook = hooks


def test_every_record_of_the_process_says_exceptions_content_free(
    content_free_logging: None, caplog: pytest.LogCaptureFixture
) -> None:
    log = logging.getLogger("third.party")
    try:
        try:
            raise ValueError(f"inner {ROW}")
        except ValueError as inner:
            raise RuntimeError(f"outer {ROW}") from inner
    except RuntimeError as exc:
        log.exception("Crashed reason=%r", exc)  # as mode logs a crash
        log.error(exc)
    text = caplog.text
    assert ROW not in text, text
    assert "RuntimeError" in text and "ValueError" in text and "test_logs.py" in text


def test_an_uncaught_exception_is_printed_content_free(
    content_free_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        raise KeyError(ROW)
    except KeyError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    printed = capsys.readouterr().err
    assert "KeyError" in printed and ROW not in printed


@pytest.mark.integration
def test_a_failing_events_text_is_in_no_worker_log_after_its_subject_is_erased(
    env: Env,
) -> None:
    """An event PostgreSQL refuses with a message quoting the row (a check constraint, the
    test's failpoint) is dead-lettered with that text sealed; every worker logs the failure
    by class and code; after the subject's erasure the marker is in no worker's output."""
    marker = f"MARKER{uuid.uuid4().hex}"
    subject = ("user", f"alice-{marker}")
    with env.connect() as conn:
        conn.execute(
            "ALTER TABLE memories ADD CONSTRAINT refuses_the_marker"
            f" CHECK (value::text NOT LIKE '%{marker} refused%')"
        )
    f = EventFactory(id_prefix="logs", clock=datetime.now(UTC) - timedelta(minutes=5))
    env.produce_events(
        [
            f.proposed("acme", "mem_kept", subject, {"text": f"{marker} kept"}),
            f.proposed("acme", "mem_refused", subject, {"text": f"{marker} refused"}),
            f.proposed("acme", "mem_after", subject, {"text": f"{marker} after"}),
        ]
    )
    env.start(*CONSUMING_KINDS)
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    [letter] = open_topic_letters(env, MEMORY_EVENTS)
    assert letter.letter.error_code == DeadLetterReason.PROCESSING_FAILED
    assert letter.letter.error == "write: CheckViolation (detail sealed)"
    assert letter.opened is not None and marker in letter.opened.detail  # sealed with it

    target = {"type": "subject", "id": subject[1], "subject_type": subject[0]}
    env.produce_events([f.deletion("acme", "d_logs", target)], DELETION_REQUESTS)
    erased = wait_verified(env, "acme", "d_logs")
    assert erased["verification"]["clean"], erased
    stop_all(env.workers)  # their last words count too

    outputs = {w.log_path.name: w.log_path.read_text(errors="replace") for w in env.workers}
    assert [name for name, text in outputs.items() if marker in text] == []
    memory_log = next(text for name, text in outputs.items() if "-memory-" in name)
    assert "write: CheckViolation [23514]" in memory_log, memory_log[-3000:]
