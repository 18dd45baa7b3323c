"""The duty locks (``projections.coordination``): who leads, decided apart from the I/O, and
the lock sessions' contract on the in-memory fake and on PostgreSQL."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from projections.coordination import PostgresLockSession, leads, step
from support.contracts.locks import LockSessionContract, Sessions, run
from support.fakes.locks import InMemoryLocks


@pytest.mark.parametrize(
    ("leader", "seen", "change"),
    [
        (False, "acquired", "took"),
        (False, "refused", "waiting"),
        (False, "failed", "waiting"),
        (True, "alive", "kept"),
        (True, "acquired", "kept"),
        # The lock went with the session: another replica may hold it already.
        (True, "failed", "lost"),
        (True, "refused", "lost"),
    ],
)
def test_a_replica_leads_while_its_session_holds_the_lock(
    leader: bool, seen: Any, change: str
) -> None:
    assert step(leader, seen) == change
    assert leads(step(leader, seen)) == (change in ("took", "kept"))


class TestInMemoryLocks(LockSessionContract):
    @pytest.fixture
    def sessions(self) -> Sessions:
        return InMemoryLocks().session


@pytest.mark.integration
class TestPostgresLocks(LockSessionContract):
    @pytest.fixture
    def sessions(self, env: Any) -> Sessions:
        conninfo = env.settings.postgres_conninfo
        return lambda: PostgresLockSession.connect(conninfo)


@pytest.mark.integration
def test_locks_are_scoped_to_the_schema(env: Any) -> None:
    """Deployments (and tests) sharing a database but not a schema never contend."""
    other = env.sibling("other").settings.postgres_conninfo

    async def scenario() -> list[bool]:
        here = await PostgresLockSession.connect(env.settings.postgres_conninfo)
        there = await PostgresLockSession.connect(other)
        try:
            return [await here.try_hold("scoped"), await there.try_hold("scoped")]
        finally:
            await here.close()
            await there.close()

    assert run(scenario()) == [True, True]


@pytest.mark.integration
def test_a_session_that_is_killed_releases_its_duty(env: Any) -> None:
    """What a SIGKILLed replica's connection does: the server ends the session."""

    async def scenario() -> list[bool]:
        first = await PostgresLockSession.connect(env.settings.postgres_conninfo)
        second = await PostgresLockSession.connect(env.settings.postgres_conninfo)
        try:
            held = [await first.try_hold("killed"), await second.try_hold("killed")]
            with psycopg.connect(env.settings.postgres_conninfo, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (first.backend_pid,))
            with pytest.raises(psycopg.OperationalError):
                await first.alive()
            return [*held, await second.try_hold("killed")]
        finally:
            await second.close()

    assert run(scenario()) == [True, False, True]
