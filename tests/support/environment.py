"""One test's isolated slice of the real stack: its own settings, PostgreSQL schema, topics
and consumer groups, and the workers it starts (forked, ``support.worker_processes``), all
removed afterwards. The ``env`` fixture (tests/conftest.py) gives one to a test; a test that
needs two (a reference beside a cluster, say) opens them with ``isolated_env``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, TypeVar

import orjson
import psycopg
from confluent_kafka import Producer

from projections.deletion import purge
from projections.memory import store
from projections.migrate import migrate
from streams.cli.demo import read_topic
from streams.kafka import create_topics, delete_topics, producer_config
from streams.progress import SEALED, committed_offsets, end_offsets, wait_caught_up
from streams.sample import RawEvent, to_message
from streams.services import close_vector_pools
from streams.settings import Settings
from support.worker_processes import ForkedProcess
from topics.messages import InputMessage
from topics.registry import ALL_TOPICS, MEMORY_EVENTS, TopicSpec

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


@dataclass
class WorkerProcess:
    kind: str
    settings: Settings
    log_path: Path
    process: ForkedProcess | None = None

    def environment(self) -> dict[str, str]:
        """The worker's environment: this process's, with the worker's settings."""
        environment = child_environment()
        environment.update(settings_environment(self.settings))
        return environment

    def start(self) -> Self:
        self.process = ForkedProcess(["worker", self.kind], self.environment(), self.log_path, REPO)
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, no final commit."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def sigterm(self) -> None:
        """SIGTERM, as Kubernetes stops a pod: the worker drains, commits and leaves."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        stop_all([self])

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def stop_all(workers: Iterable[WorkerProcess]) -> None:
    """SIGTERM every worker still running at once, then wait for each (SIGKILL past 20 s):
    a worker's exit takes a second or more (mode's loop closes a second after its services
    stop), so stopping them one after another would cost that per worker."""
    stopping = [w.process for w in workers if w.process is not None and w.process.poll() is None]
    for process in stopping:
        process.terminate()
    deadline = time.monotonic() + 20
    for process in stopping:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def child_environment() -> dict[str, str]:
    """The environment of a process a test starts (a worker, the API), before its settings:
    this one's, but free to cache compiled modules. The API server is a fresh interpreter;
    with PYTHONDONTWRITEBYTECODE set (some shells and CI images set it), each start compiled
    every memproj module again. A forked worker (support.worker_processes) imports nothing of
    its own."""
    environment = dict(os.environ)
    environment.pop("PYTHONDONTWRITEBYTECODE", None)
    return environment


def settings_environment(settings: Settings) -> dict[str, str]:
    """The settings as a worker's environment (secrets as their values: a worker needs them)."""
    return settings.as_environment()


@dataclass
class Env:
    """One test's isolated slice of the stack."""

    settings: Settings
    schema: str
    tmp_path: Path
    workers: list[WorkerProcess] = field(default_factory=list)
    siblings: list[Env] = field(default_factory=list)
    parent: Env | None = None

    def topic(self, spec: TopicSpec) -> str:
        return self.settings.topics.name(spec)

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.settings.postgres_dsn, autocommit=True)

    def own_schemas(self) -> list[str]:
        """The test's schema and the shadow and retired schemas its replays registered in it
        (the rest of the database belongs to other tests)."""
        with psycopg.connect(self.settings.postgres_dsn, autocommit=True) as conn:
            registry = conn.execute(
                "SELECT to_regclass(%s)", (f'"{self.schema}".rebuild_schemas',)
            ).fetchone()
            if not (registry and registry[0]):
                return [self.schema]
            rows = conn.execute(f'SELECT schema_name FROM "{self.schema}".rebuild_schemas')
            return [self.schema, *sorted(str(name) for (name,) in rows)]

    def wait_vacuum_horizon(self) -> None:
        """Until every snapshot open on the server is younger than every transaction committed
        so far (the purge duty's own rule, ``projections.deletion.purge``): a VACUUM then
        removes what they deleted. Other tests' transactions, in the session's other process,
        hold the horizon back for a while."""

        async def mark_and_passed(mark: int | None) -> tuple[int, bool]:
            async with await psycopg.AsyncConnection.connect(
                self.settings.postgres_conninfo, autocommit=True
            ) as conn:
                mark = await purge.next_xid(conn) if mark is None else mark
                return mark, purge.horizon_passed(mark, await purge.horizon(conn))

        mark, _ = asyncio.run(mark_and_passed(None))
        self.wait_until(
            lambda: asyncio.run(mark_and_passed(mark))[1], "the vacuum horizon past the changes"
        )

    def produce(self, topic: str, messages: Iterable[tuple[bytes | None, bytes | None]]) -> int:
        producer = Producer(producer_config(self.settings.kafka_bootstrap))
        count = 0
        for key, value in messages:
            producer.produce(topic, value, key)
            producer.poll(0)
            count += 1
        assert producer.flush(30) == 0
        return count

    def produce_events(self, events: Iterable[RawEvent], spec: TopicSpec = MEMORY_EVENTS) -> int:
        return self.produce(self.topic(spec), (to_message(event) for event in events))

    def worker(self, kind: str = "memory", **overrides: Any) -> WorkerProcess:
        if self.parent is not None and kind in ("memory", "conversation"):
            # A sibling projects the sealed log its parent's workers write.
            overrides = {"projection_source": "sealed", **overrides}
        settings = self.settings.model_copy(update=overrides) if overrides else self.settings
        worker = WorkerProcess(
            kind, settings, self.tmp_path / f"worker-{kind}-{len(self.workers)}.log"
        )
        self.workers.append(worker)
        return worker.start()

    def wait_caught_up(
        self, spec: TopicSpec = MEMORY_EVENTS, projection: str = "memory", seconds: float = 90
    ) -> None:
        """Until ``projection`` has applied all of ``spec``'s topic: the memory and conversation
        workers read their raw topic (and seal it); a sibling reads the sealed log its parent
        writes, once the parent has written it."""

        async def wait() -> None:
            bootstrap = self.settings.kafka_bootstrap
            sealed = SEALED.get(spec.base_name)
            if self.parent is not None and sealed is not None:
                async with await psycopg.AsyncConnection.connect(
                    self.parent.settings.postgres_dsn
                ) as conn:
                    await wait_caught_up(conn, bootstrap, projection, self.topic(spec), seconds)
            read = sealed if self.parent is not None and sealed is not None else spec
            async with await psycopg.AsyncConnection.connect(self.settings.postgres_dsn) as conn:
                await wait_caught_up(conn, bootstrap, projection, self.topic(read), seconds)

        try:
            asyncio.run(wait())
        except TimeoutError:
            logs = "\n".join(f"--- {w.log_path.name}\n{w.log_tail()}" for w in self.workers)
            raise AssertionError(f"projection did not catch up:\n{logs}") from None

    def wait_group_committed(
        self, group: str, spec: TopicSpec = MEMORY_EVENTS, seconds: float = 90
    ) -> None:
        """Wait until a consumer group has committed at least the end ``spec``'s topic has now.

        At least, not exactly: records appended after this call (the deletion worker's
        segment-roll markers on ``memory.current``, for one) move the group past that end."""
        topic = self.topic(spec)
        ends = end_offsets(self.settings.kafka_bootstrap, topic)
        deadline = time.monotonic() + seconds

        def reached() -> bool:
            committed = committed_offsets(self.settings.kafka_bootstrap, group, topic)
            return all(committed.get(partition, 0) >= end for partition, end in ends.items())

        while not reached():
            if time.monotonic() > deadline:
                raise AssertionError(f"group {group} did not commit {ends} on {topic}")
            time.sleep(0.2)

    def read(self, spec: TopicSpec, suffix: str = "") -> list[tuple[bytes | None, Any]]:
        return [
            (message.key, orjson.loads(message.value) if message.value else None)
            for message in self.read_messages(spec, suffix)
        ]

    def read_messages(self, spec: TopicSpec, suffix: str = "") -> list[InputMessage]:
        return read_topic(self.settings, self.topic(spec) + suffix)

    def start(self, *kinds: str, **overrides: Any) -> dict[str, WorkerProcess]:
        return {kind: self.worker(kind, **overrides) for kind in kinds}

    def wait_until(self, check: Callable[[], T | None], what: str, seconds: float = 90) -> T:
        """Poll ``check`` until it returns something (a readiness check, never a sleep)."""
        deadline = time.monotonic() + seconds
        while True:
            found = check()
            if found:
                return found
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {w.log_path.name}\n{w.log_tail(15)}" for w in self.workers)
                raise AssertionError(f"timed out waiting for {what}\n{logs}")
            time.sleep(0.1)

    def run(self, work: Callable[[Any], Awaitable[T]]) -> T:
        """Run an async read against this test's schema."""

        async def run() -> T:
            async with await psycopg.AsyncConnection.connect(self.settings.postgres_dsn) as conn:
                return await work(conn)

        return asyncio.run(run())

    def sibling(self, name: str) -> Env:
        """Another projection of the same topics: its own schema and consumer groups, and
        this one's data keys (the sealed log is sealed with them)."""
        schema = f"{self.schema}_{name}"
        with psycopg.connect(self.settings.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        settings = self.settings.model_copy(
            update={
                "postgres_dsn": self.settings.postgres_dsn.replace(
                    f"search_path%3D{self.schema}", f"search_path%3D{schema}%2C{self.schema}"
                ),
                "group_prefix": f"{self.settings.group_prefix}-{name}",
            }
        )
        apply_migrations(settings.postgres_dsn)
        with psycopg.connect(self.settings.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE {schema}.entity_keys, {schema}.shredded_keys")
        sibling = Env(settings, schema, self.tmp_path / name, parent=self)
        sibling.tmp_path.mkdir()
        self.siblings.append(sibling)
        return sibling

    def checksums(self) -> dict[str, store.TenantChecksum]:
        async def compute() -> dict[str, store.TenantChecksum]:
            async with await psycopg.AsyncConnection.connect(self.settings.postgres_dsn) as conn:
                return await store.checksums(conn)

        return asyncio.run(compute())


NO_EXPIRY_ERASURE = 100 * 365 * 24 * 3600.0


def on_schema(dsn: str, schema: str) -> str:
    """``dsn`` (a URL) whose sessions make and find their tables in ``schema``."""
    return dsn + ("&" if "?" in dsn else "?") + f"options=-csearch_path%3D{schema}"


def isolated_settings(stack: Settings, name: str, data_dir: Path) -> tuple[Settings, str]:
    schema = f"t_{name}"
    dsn = on_schema(stack.postgres_dsn, schema)
    settings = stack.model_copy(
        update={
            "topic_prefix": f"{name}.",
            "group_prefix": f"memproj-{name}",
            "postgres_dsn": dsn,
            "metrics_port": 0,
            "batch_max_wait_seconds": 0.05,
            "data_dir": data_dir,
            "cache_namespace": f"memproj-{name}",
            "deletion_check_interval_seconds": 0.2,
            "deletion_redelivery_seconds": 1.0,
            # The broker's shortest allowed (group.min.session.timeout.ms): a SIGKILLed
            # worker's partitions pass to the others that much sooner, and members heartbeat
            # every 2 s, so that they also join a rebalance sooner.
            "kafka_session_timeout_seconds": 6.0,
            # The tests use the published development master key.
            "environment": "local",
            # The sample streams' clock is in the past: their expiring memories are long past
            # expiry and grace, and a retention round (the first comes a minute after the
            # deletion worker starts) would erase them in whichever test runs that long, so
            # that a test's outcome would depend on the machine's speed. A test of expiry
            # erasure sets its own grace (tests/streams/test_retention.py).
            "expiry_grace_seconds": NO_EXPIRY_ERASURE,
        }
    )
    return settings, schema


def apply_migrations(dsn: str) -> None:
    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await migrate(conn)

    asyncio.run(run())


@contextlib.contextmanager
def isolated_env(stack: Settings, tmp_path: Path, topic_prefix: str | None = None) -> Iterator[Env]:
    """A test's own schema, topics (under ``topic_prefix``, default a random one) and
    groups, removed afterwards with whatever its workers and replays left."""
    name = uuid.uuid4().hex[:10]
    settings, schema = isolated_settings(stack, name, tmp_path / "data")
    if topic_prefix is not None:
        settings = settings.model_copy(update={"topic_prefix": topic_prefix.format(name=name)})
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    create_topics(settings.kafka_bootstrap, settings.topics, ALL_TOPICS, settings.topic_replication)
    apply_migrations(settings.postgres_dsn)
    test_env = Env(settings, schema, tmp_path)
    try:
        yield test_env
    finally:
        every = [test_env, *test_env.siblings]
        stop_all(worker for each in every for worker in each.workers)
        close_vector_pools()
        # The test's own schemas, and the shadow and retired schemas its replays left (each
        # registered in its live schema): a dev stack that runs the suite every day must not
        # collect them (nor the topics below). Only those: another test session on the same
        # stack has schemas of its own.
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            left = {name for each in every for name in each.own_schemas()}
            for name in sorted(left):
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        delete_topics(stack.kafka_bootstrap, [settings.topics.name(s) for s in ALL_TOPICS])
