"""Fixtures for the integration tests: the real Kafka, PostgreSQL and Redis of ops/stack.

One stack per session (started by ``ops/test`` or ``ops/stack up``); every test gets its own
topic prefix, consumer-group prefix and PostgreSQL schema, so tests never see each other's
data. A missing service fails the tests loudly: nothing here ever skips.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from _pytest.mark.expression import Expression
from confluent_kafka.admin import AdminClient

from projections.cache.keys import glob_literal, key_part
from streams.kafka import admin_config
from streams.settings import Settings
from support.environment import REPO, Env, isolated_env
from support.service_guard import ServiceGuard, unmarked_service_users

# Fixtures of tests/support modules that several test modules use.
pytest_plugins = ["support.vector_entries"]

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
