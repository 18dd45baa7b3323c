"""memproj over the local broker's SASL_SSL listener with ACLs, against the real
Kafka of ``ops/stack``.

STACK PORTS: the topics, schemas and checks go through the PLAINTEXT listener
(``MEMPROJ_KAFKA_BOOTSTRAP``, 9092: ANONYMOUS, a super user); the workers and clients under
test connect to the SASL_SSL listener (``MEMPROJ_KAFKA_SECURE_PORT``, 9094) with the settings
``ops/stack env secure <user>`` prints for the same stack dir and ports. The listener exists
once the broker was started by an ``ops/stack up`` that has it (a fresh CI stack does).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from projections.outbox import OutboxMessage
from streams.cli import cli
from streams.failures import FailureKind, classify
from streams.isolation import CircuitBreaker, Isolation, stage
from streams.kafka import KafkaPublisher
from streams.kafka_security import KafkaSecurityError
from streams.metrics import Metrics
from streams.replay import replay_projection
from streams.sample import EventFactory
from streams.settings import Settings
from streams.worker import CONSUMING_KINDS, memory_projection
from support.deadletters import MemoryLetterKeys, memory_dead_letters
from support.deletion_scenario import ready, recent_factory, request, seed, wait_verified
from support.environment import REPO, Env, WorkerProcess, child_environment, isolated_env
from support.environment import settings_environment as plaintext_environment
from support.fakes import message
from support.kafka_users import secure_environment
from topics.messages import InputMessage
from topics.registry import MEMORY_EVENTS

pytestmark = pytest.mark.integration
ALICE = ("user", "alice")
# The bound for naming a wrong password or an untrusted CA; measured: about 1 s.
FAIL_FAST_SECONDS = 30.0


def secure_settings(base: Settings, user: str, **overrides: Any) -> Settings:
    names = {
        name.removeprefix("MEMPROJ_").lower(): v for name, v in secure_environment(user).items()
    }
    return Settings(**{**base_fields(base), **names, **overrides})


def base_fields(base: Settings) -> dict[str, Any]:
    """``base``'s values as settings input, secrets left out (each test names its own)."""
    return {
        name: value
        for name, value in base.model_dump().items()
        if value is not None and not isinstance(value, SecretStr) and "password" not in name
    }


class SecureWorker(WorkerProcess):
    """A worker process connecting over SASL_SSL as ``user`` (the rest as ``settings``)."""

    def __init__(self, kind: str, settings: Settings, log_path: Path, user: str) -> None:
        super().__init__(kind, settings, log_path)
        self.user = user

    def environment(self) -> dict[str, str]:
        environment = child_environment()
        environment.update(plaintext_environment(self.settings))
        environment.pop("MEMPROJ_KAFKA_PASSWORD", None)
        environment.update(secure_environment(self.user))
        return environment


@pytest.fixture
def secure_env(stack: Settings, tmp_path: Path) -> Iterator[Env]:
    """The ``env`` fixture's isolation, with topics under ``memproj.``: memproj's ACLs cover
    that prefix (and the unprefixed registry names), not the suite's random prefixes."""
    with isolated_env(stack, tmp_path, topic_prefix="memproj.{name}.") as test_env:
        yield test_env


def start_secure(env: Env, kind: str, user: str = "memproj") -> SecureWorker:
    worker = SecureWorker(kind, env.settings, env.tmp_path / f"secure-{kind}-{user}.log", user)
    env.workers.append(worker)
    return worker.start()


def exit_of(worker: WorkerProcess, seconds: float) -> int:
    assert worker.process is not None
    try:
        return worker.process.wait(seconds)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{worker.kind} still runs:\n{worker.log_tail()}") from None


def test_the_memory_projection_runs_as_memproj_over_sasl_ssl(secure_env: Env) -> None:
    f = EventFactory(id_prefix="sec", clock=datetime.now(UTC))
    secure_env.produce_events(
        [f.proposed("acme", f"mem_{i}", ALICE, {"text": f"value {i}"}) for i in range(5)]
    )
    start_secure(secure_env, "memory")
    secure_env.wait_caught_up(MEMORY_EVENTS, "memory")
    assert set(secure_env.checksums()) == {"acme"}
    assert all(worker.alive() for worker in secure_env.workers)
    password = Path(secure_environment("memproj")["MEMPROJ_KAFKA_PASSWORD_FILE"]).read_text()
    for worker in secure_env.workers:
        assert password.strip() not in worker.log_path.read_text(errors="replace")


def test_an_unprivileged_principal_fails_fast_with_an_authorization_error(
    secure_env: Env,
) -> None:
    started = time.monotonic()
    worker = start_secure(secure_env, "memory", user="intruder")
    assert exit_of(worker, FAIL_FAST_SECONDS) != 0
    elapsed = time.monotonic() - started
    log = worker.log_path.read_text(errors="replace")
    assert "not authorized for consumer group" in log, log  # one line, no traceback
    assert "'intruder'" in log
    print(f"intruder worker exited after {elapsed:.1f}s")


def test_intruder_clients_see_no_memproj_topic(secure_env: Env, stack: Settings) -> None:
    intruder = secure_settings(stack, "intruder")
    metadata = intruder.kafka.check_connection(timeout=FAIL_FAST_SECONDS)
    assert not [t for t in metadata.topics if t.startswith(secure_env.settings.topic_prefix)]
    memproj = secure_settings(stack, "memproj")
    seen = memproj.kafka.check_connection(timeout=FAIL_FAST_SECONDS).topics
    assert secure_env.topic(MEMORY_EVENTS) in seen


def test_a_wrong_password_fails_fast_naming_the_cause(stack: Settings) -> None:
    wrong = secure_settings(stack, "memproj", kafka_password_file=None)
    wrong = wrong.model_copy(update={"kafka_password": SecretStr("not-the-password")})
    started = time.monotonic()
    with pytest.raises(KafkaSecurityError, match="authentication failed") as raised:
        wrong.kafka.check_connection(timeout=FAIL_FAST_SECONDS)
    assert time.monotonic() - started < FAIL_FAST_SECONDS
    assert "not-the-password" not in str(raised.value)


def test_a_refusal_met_while_working_stops_the_worker_and_dead_letters_nothing(
    stack: Settings,
) -> None:
    """Kafka refusing a handler's publish is an environment fault, classified once
    (``streams.failures``): isolation lets it through to stop the worker, and the message is
    not dead-lettered as if it had caused it."""
    wrong = secure_settings(stack, "memproj", kafka_password_file=None)
    wrong = wrong.model_copy(update={"kafka_password": SecretStr("not-the-password")})
    publisher = KafkaPublisher(wrong.kafka)
    keys = MemoryLetterKeys()
    isolation = Isolation(
        CircuitBreaker("refused"), Metrics(CollectorRegistry()), memory_dead_letters(keys)
    )

    async def handle(_message: InputMessage) -> None:
        with stage("publish"):
            await publisher.publish([OutboxMessage("memproj.refused", b"k", b"v")])

    with pytest.raises(KafkaSecurityError, match="authentication failed") as refused:
        asyncio.run(isolation.each([message(0)], handle))
    assert classify(refused.value) is FailureKind.ENVIRONMENT
    assert keys.saved == []


def test_a_worker_with_a_wrong_password_exits_naming_the_cause(
    secure_env: Env, tmp_path: Path
) -> None:
    """The worker process, not only the check: it ends, and its output names the cause."""
    wrong_file = tmp_path / "wrong.password"
    wrong_file.write_text("not-the-password\n")
    environment = {**os.environ, **plaintext_environment(secure_env.settings)}
    environment.update(secure_environment("memproj"))
    environment["MEMPROJ_KAFKA_PASSWORD_FILE"] = str(wrong_file)
    log_path = tmp_path / "wrong-password.log"
    started = time.monotonic()
    process = subprocess.run(
        [sys.executable, "-m", "streams", "worker", "memory"],
        env=environment,
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
        cwd=REPO,
        timeout=FAIL_FAST_SECONDS + 30,
        check=False,
    )
    elapsed = time.monotonic() - started
    log = log_path.read_text(errors="replace")
    assert process.returncode != 0
    assert "authentication failed" in log, log
    assert "not-the-password" not in log
    print(f"wrong-password worker exited after {elapsed:.1f}s (interpreter start included)")


def test_an_untrusted_ca_fails_fast_naming_the_cause(stack: Settings, tmp_path: Path) -> None:
    other_ca = tmp_path / "other-ca.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=not the stack CA", "-keyout", str(tmp_path / "k.pem")),
            *("-out", str(other_ca)),
        ],
        check=True,
        capture_output=True,
    )
    untrusted = secure_settings(stack, "memproj", kafka_ca_file=str(other_ca))
    started = time.monotonic()
    with pytest.raises(KafkaSecurityError, match="TLS handshake failed"):
        untrusted.kafka.check_connection(timeout=FAIL_FAST_SECONDS)
    assert time.monotonic() - started < FAIL_FAST_SECONDS


def test_mutual_tls_with_the_stack_client_certificate(stack: Settings) -> None:
    ca = Path(secure_environment("memproj")["MEMPROJ_KAFKA_CA_FILE"])
    mutual = secure_settings(
        stack,
        "memproj",
        kafka_cert_file=str(ca.with_name("client.pem")),
        kafka_key_file=str(ca.with_name("client.key")),
    )
    assert mutual.kafka.check_connection(timeout=FAIL_FAST_SECONDS).topics is not None


# -- every operation, as memproj and as intruder ---------------------------------------------
# The sample of tests/support/deletion_scenario through every worker, a subject erasure, a
# rebuild and the CLI, all over SASL_SSL; then no worker log and no CLI output holds the Kafka
# password or the master key.

# The settings that say how a client reaches Kafka; everything else stays the test's own.
KAFKA_CLIENT_FIELDS = (
    "kafka_bootstrap",
    "kafka_security_protocol",
    "kafka_sasl_mechanism",
    "kafka_username",
    "kafka_password",
    "kafka_ca_file",
)


def over_sasl_ssl(settings: Settings, user: str) -> Settings:
    """``settings`` (schema, topics, groups, master key) with ``user``'s SASL_SSL client."""
    secure = secure_settings(settings, user)
    return settings.model_copy(update={name: getattr(secure, name) for name in KAFKA_CLIENT_FIELDS})


def run_cli(settings: Settings, *args: str) -> tuple[Result, float]:
    started = time.monotonic()
    result = CliRunner().invoke(cli, list(args), env=settings.as_environment())
    return result, time.monotonic() - started


def secrets_of(settings: Settings) -> dict[str, str]:
    password_file = Path(secure_environment("memproj")["MEMPROJ_KAFKA_PASSWORD_FILE"])
    found = {
        "kafka password": password_file.read_text().strip(),
        "master key": settings.master_key.get_secret_value(),
    }
    if settings.master_keys is not None:
        found["master keys"] = settings.master_keys.get_secret_value()
    return {name: value for name, value in found.items() if value}


def test_every_operation_runs_as_memproj_over_sasl_ssl_and_leaks_no_secret(
    secure_env: Env,
) -> None:
    memproj = over_sasl_ssl(secure_env.settings, "memproj")
    f = recent_factory()
    seed(secure_env, f)
    for kind in CONSUMING_KINDS:
        start_secure(secure_env, kind)
    ready(secure_env)

    request(
        secure_env,
        f,
        "acme",
        "d_alice",
        {"type": "subject", "id": ALICE[1], "subject_type": ALICE[0]},
    )
    erased = wait_verified(secure_env, "acme", "d_alice")
    assert erased["status"] == "completed" and erased["verification"]["clean"], erased

    report = asyncio.run(replay_projection(memproj, memory_projection(memproj), swap="never"))
    assert report.events > 0 and report.differences == {} and not report.swapped, report.to_json()

    top, top_seconds = run_cli(memproj, "top", "--once", "--interval", "0.2")
    assert top.exit_code == 0, top.output
    shown, _ = run_cli(memproj, "offsets", "show", "memory")
    assert shown.exit_code == 0, shown.output
    assert memproj.group_id("memory") in shown.output
    assert all(worker.alive() for worker in secure_env.workers), [
        worker.log_tail() for worker in secure_env.workers
    ]

    outputs = {
        f"worker log {w.log_path.name}": w.log_path.read_text(errors="replace")
        for w in secure_env.workers
    }
    outputs |= {"top --once": top.output, "offsets show": shown.output}
    for secret_name, secret in secrets_of(memproj).items():
        leaked = [where for where, text in outputs.items() if secret in text]
        assert not leaked, f"the {secret_name} is in {leaked}"
    print(f"top --once took {top_seconds:.1f}s; rebuild: {report.to_json()}")


def test_offsets_show_as_intruder_fails_fast_with_an_authorization_error(
    secure_env: Env,
) -> None:
    intruder = over_sasl_ssl(secure_env.settings, "intruder")
    refused, seconds = run_cli(intruder, "offsets", "show", "memory")
    assert refused.exit_code != 0, refused.output
    assert seconds < FAIL_FAST_SECONDS, (seconds, refused.output)
    # What a user sees: the output, and the exception the command ended with (``memproj``
    # prints it as one line: tests/streams/test_cli_kafka.py).
    seen = f"{refused.output}\n{refused.exception!r}"
    assert isinstance(refused.exception, KafkaSecurityError), seen
    assert "not authorized for consumer group" in seen and "ACLs" in seen, seen
    intruder_password = intruder.kafka_password
    assert intruder_password is not None
    assert intruder_password.get_secret_value() not in seen
    print(f"intruder's offsets show failed after {seconds:.1f}s: {seen.strip()}")
