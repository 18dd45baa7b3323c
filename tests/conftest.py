"""Fixtures for the integration tests: the real Kafka, PostgreSQL and Redis of ops/stack.

One stack per session (started by ``ops/test`` or ``ops/stack up``); every test gets its own
topic prefix, consumer-group prefix and PostgreSQL schema, so tests never see each other's
data. A missing service fails the tests loudly: nothing here ever skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
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
import pytest
import redis
from _pytest.mark.expression import Expression
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from projections.cache.keys import glob_literal, key_part
from projections.deletion import purge
from projections.memory import store
from projections.migrate import migrate
from streams.cli.demo import read_topic
from streams.kafka import admin_config, create_topics, delete_topics, producer_config
from streams.progress import SEALED, committed_offsets, end_offsets, wait_caught_up
from streams.sample import RawEvent, to_message
from streams.services import close_vector_pools
from streams.settings import Settings
from support.service_guard import ServiceGuard, unmarked_service_users
from support.worker_processes import ForkedProcess
from topics.messages import InputMessage
from topics.registry import ALL_TOPICS, MEMORY_EVENTS, TopicSpec

# Fixtures of tests/support modules that several test modules use.
pytest_plugins = ["support.vector_entries"]

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")
BASE = Settings()


# -- no silent skips ---------------------------------------------------------------------

_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skipped:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _skipped:
        terminalreporter.write_line(
            f"FAILED: {len(_skipped)} tests were skipped; memproj's suite must run every "
            "test against the real services: " + ", ".join(_skipped),
            red=True,
        )


# -- no service outside the integration tests (support/service_guard.py) ----------------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    offenders = unmarked_service_users(items)
    if offenders:
        raise pytest.UsageError(
            "tests that use the stack must carry @pytest.mark.integration: " + ", ".join(offenders)
        )
    for item in items:
        if item.path.is_relative_to(API_TESTS):
            item.add_marker(pytest.mark.xdist_group("api"))


# -- several processes (ops/test runs pytest-xdist with --dist loadgroup) ------------------

# The API tests share one server and its workers (tests/streams/api/conftest.py): one process
# runs them all, so that the server is started once, not once per process.
API_TESTS = REPO / "tests" / "streams" / "api"


# Modules of integration tests only whose collection alone costs seconds: the fuzzing module
# builds a hypothesis test per operation of the API's document as it is collected. A run that
# deselects the integration tests does not import them.
COSTLY_INTEGRATION_MODULES = frozenset({REPO / "tests" / "streams" / "api" / "test_fuzz.py"})


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path in COSTLY_INTEGRATION_MODULES and not selects_integration(config):
        return True
    return None


def selects_integration(config: pytest.Config) -> bool:
    """Whether the run's ``-m`` expression keeps the integration tests."""
    markexpr = config.getoption("markexpr")
    if not markexpr:
        return True

    def marked(name: str, /, **kwargs: str | int | bool | None) -> bool:
        return name == "integration"

    return Expression.compile(markexpr).evaluate(marked)


@pytest.fixture(autouse=True)
def _no_service_outside_integration(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    if request.node.get_closest_marker("integration") is None:
        ServiceGuard(BASE).install(monkeypatch)


# -- the stack ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def stack() -> Settings:
    """Fails (never skips) when a service of ops/stack is not answering."""
    problems = []
    try:
        AdminClient(admin_config(BASE.kafka_bootstrap)).list_topics(timeout=10)
    except Exception as exc:
        problems.append(f"Kafka at {BASE.kafka_bootstrap}: {exc}")
    try:
        psycopg.connect(BASE.postgres_dsn, connect_timeout=5).close()
    except Exception as exc:
        problems.append(f"PostgreSQL at {BASE.postgres_dsn}: {exc}")
    if problems:
        pytest.fail("the local stack is not running (ops/stack up):\n" + "\n".join(problems))
    return BASE


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


def isolated_settings(stack: Settings, name: str, data_dir: Path) -> tuple[Settings, str]:
    schema = f"t_{name}"
    dsn = stack.postgres_dsn + ("&" if "?" in stack.postgres_dsn else "?")
    dsn += f"options=-csearch_path%3D{schema}"
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


@pytest.fixture(scope="session")
def redis_cluster(stack: Settings) -> Settings:
    """The stack's settings on a Redis Cluster of three masters (ops/redis/cluster), started
    here when it is not running: about three seconds, once, for a session that uses it;
    ``ops/stack down`` stops it with the rest."""
    script = str(REPO / "ops" / "redis" / "cluster")
    # Every test process of the session asks for the cluster; one ``up`` at a time, since an
    # ``up`` that finds a cluster half made by another starts it afresh.
    with one_at_a_time(stack_dir() / "redis-cluster.lock"):
        started = subprocess.run([script, "up"], capture_output=True, text=True, timeout=180)
    if started.returncode != 0:
        pytest.fail(f"ops/redis/cluster up failed:\n{started.stdout}{started.stderr}")
    exports = subprocess.run([script, "env"], capture_output=True, text=True, check=True).stdout
    variables = dict(
        line.removeprefix("export ").split("=", 1) for line in exports.splitlines() if "=" in line
    )
    return stack.model_copy(
        update={"redis_url": variables["MEMPROJ_REDIS_URL"], "redis_cluster": True}
    )


def stack_dir() -> Path:
    """Where ``ops/stack`` keeps this stack's state (MEMPROJ_STACK_DIR, as ops/stack reads it)."""
    return Path(os.environ.get("MEMPROJ_STACK_DIR", REPO / ".stack")).resolve()


@contextlib.contextmanager
def one_at_a_time(lock: Path) -> Iterator[None]:
    """Holds an exclusive lock on ``lock`` (shared by every process of the session)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def own_namespace(settings: Settings) -> Iterator[str]:
    """A namespace of Redis keys of the test's own, on the Redis (or the cluster) of
    ``settings``, its keys deleted afterwards."""
    client: redis.Redis | redis.RedisCluster
    try:
        if settings.redis_cluster:
            client = redis.RedisCluster.from_url(settings.redis_url)
        else:
            client = redis.Redis.from_url(settings.redis_url)
        client.ping()
    except (redis.ConnectionError, redis.RedisClusterException) as exc:
        pytest.fail(f"Redis at {settings.redis_url} is not answering (ops/stack up): {exc}")
    name = f"memproj-test-{uuid.uuid4().hex}"
    try:
        yield name
    finally:
        # On a cluster, SCAN walks every master and DEL is split by slot (redis-py).
        leftovers = list(client.scan_iter(match=glob_literal(key_part(name)) + ":*"))
        if leftovers:
            client.delete(*leftovers)
        client.close()


@pytest.fixture
def redis_namespace(stack: Settings) -> Iterator[str]:
    """A namespace of Redis keys of the test's own, its keys deleted afterwards."""
    with own_namespace(stack) as name:
        yield name


@pytest.fixture
def redis_cluster_namespace(redis_cluster: Settings) -> Iterator[str]:
    """``redis_namespace`` on the Redis Cluster."""
    with own_namespace(redis_cluster) as name:
        yield name


@pytest.fixture
def env(stack: Settings, tmp_path: Path) -> Iterator[Env]:
    with isolated_env(stack, tmp_path) as test_env:
        yield test_env
