"""Which failures are worth retrying, which stop the worker, and the retry itself.

Every failure is classified once, here:

- **transient** (``RETRYABLE``: PostgreSQL, the broker or Redis unreachable, a concurrent
  claim): the same work passes if tried again later; it is retried with backoff, and a batch
  is never dropped for it.
- **environment** (``ENVIRONMENT``: a table, column or function that is gone, a missing
  privilege, a read-only database, Kafka refusing memproj's credentials, certificate or
  ACLs; or the circuit breaker tripped): no message causes it and no retry mends it; the
  worker stops with that error, for its supervisor and its operator.
- **message** (anything else): what one message holds makes the work fail, and it would fail
  the same way forever. It is never retried, whatever its exception class says: the message
  is isolated and dead-lettered (``streams.isolation``). ``UNSTORABLE`` failures (what
  PostgreSQL or Kafka cannot hold) are message failures with a dead-letter code of their own.

What a log line says about a failure is decided here too (``loggable``): its class and a
content-free code, never its text unless memproj composed that text (``EXPLAINED``). An
exception's text may quote what failed (PostgreSQL's quotes the row), and a log is a place
memproj writes that no erasure reaches: the detail stays sealed with the dead letter.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg
from confluent_kafka import KafkaError, KafkaException
from pydantic import ValidationError
from redis import exceptions as redis_errors

from projections import bookkeeping
from projections.embeddings.vectors import VectorStoreRefused
from streams.kafka import PublishFailed
from streams.kafka_security import KafkaSecurityError, KafkaUnavailable
from topics.codec import InvalidMessage

log = logging.getLogger(__name__)

T = TypeVar("T")


class OversizedOutput(ValueError):
    """An output would be larger than a Kafka message may be."""


RETRYABLE: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    bookkeeping.ConcurrentClaim,
    PublishFailed,
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
)
# ProgramLimitExceeded is an OperationalError: UNSTORABLE is checked before RETRYABLE.
UNSTORABLE: tuple[type[BaseException], ...] = (
    psycopg.errors.DataError,
    psycopg.errors.ProgramLimitExceeded,
    OversizedOutput,
)
# memproj's SQL is fixed: these say the database is not what the workers were built for.
ENVIRONMENT: tuple[type[BaseException], ...] = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedColumn,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.UndefinedObject,
    psycopg.errors.InvalidSchemaName,
    psycopg.errors.InsufficientPrivilege,
    psycopg.errors.ReadOnlySqlTransaction,
    psycopg.InterfaceError,
    MemoryError,
    KafkaSecurityError,
)


class FailureKind(enum.Enum):
    TRANSIENT = "transient"
    ENVIRONMENT = "environment"
    MESSAGE = "message"


class Explained(Exception):
    """A failure whose text memproj composes from names, counts, codes and settings, never
    from what a message held: a log line may carry that text whole."""


class SystemicFailure(Explained, RuntimeError):
    """Not about one message: the worker stops (the breaker tripped, or an environment
    fault). Nothing of the failing batch was committed or acknowledged."""


# ``Explained``, and the failures of modules this one builds on whose text is composed so too
# (the broker's own error text included).
EXPLAINED: tuple[type[BaseException], ...] = (
    Explained,
    KafkaUnavailable,
    PublishFailed,
    OversizedOutput,
    VectorStoreRefused,
)


def error_code(exc: BaseException) -> str | None:
    """A code for ``exc`` that quotes nothing: PostgreSQL's SQLSTATE, librdkafka's error
    name, the contract's dead-letter code, an errno name, pydantic's error type."""
    if isinstance(exc, psycopg.Error):
        return exc.sqlstate
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return str(exc.args[0].name())
    if isinstance(exc, InvalidMessage):
        return exc.code.value
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno)
    if isinstance(exc, ValidationError) and exc.error_count():
        return exc.errors()[0]["type"]
    return None


def loggable(exc: BaseException) -> str:
    """What a log line may say about ``exc``: its class and content-free code (and those of
    its cause), and its text only if it is ``EXPLAINED``."""
    code = error_code(exc)
    said = f"{type(exc).__name__} [{code}]" if code else type(exc).__name__
    if isinstance(exc, EXPLAINED):
        return f"{said}: {exc}"
    if exc.__cause__ is not None:
        return f"{said} (from {loggable(exc.__cause__)})"
    return said


def classify(exc: BaseException) -> FailureKind:
    if isinstance(exc, SystemicFailure):
        return FailureKind.ENVIRONMENT
    if isinstance(exc, UNSTORABLE):
        return FailureKind.MESSAGE
    if isinstance(exc, RETRYABLE):
        return FailureKind.TRANSIENT
    if isinstance(exc, ENVIRONMENT):
        return FailureKind.ENVIRONMENT
    return FailureKind.MESSAGE


async def retry_transient(
    what: str,
    work: Callable[[], Awaitable[T]],
    max_backoff_seconds: float = 30.0,
    on_retry: Callable[[Exception], None] = lambda _: None,
) -> T:
    """Run ``work`` until it succeeds or fails with something other than a transient error."""
    attempt = 0
    while True:
        try:
            return await work()
        except Exception as exc:
            if classify(exc) is not FailureKind.TRANSIENT:
                raise
            attempt += 1
            delay = min(max_backoff_seconds, 0.1 * 2**attempt)
            on_retry(exc)
            log.warning("%s failed (%s), retry %d in %.1fs", what, loggable(exc), attempt, delay)
            await asyncio.sleep(delay)
