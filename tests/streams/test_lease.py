"""The lease (``streams.coordination.Lease``) on the in-memory duty locks: one replica leads,
a survivor takes over when the leader's session ends, a leader whose session fails stands
down and undoes what only a leader exports."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, cast

from prometheus_client import CollectorRegistry

from streams.coordination import Lease
from streams.lag import PartitionLag
from streams.metrics import Metrics
from streams.monitoring import MonitorService
from support.fakes.locks import InMemoryLocks, InMemoryLockSession


def leader_gauge(metrics: Metrics, duty: str) -> float | None:
    return metrics.registry.get_sample_value("memproj_duty_leader", {"duty": duty})


class Opened:
    """The lock sessions a lease opened, the newest last."""

    def __init__(self, locks: InMemoryLocks) -> None:
        self._locks = locks
        self.sessions: list[InMemoryLockSession] = []

    async def __call__(self) -> InMemoryLockSession:
        session = await self._locks.session()
        self.sessions.append(session)
        return session


def lease(locks: InMemoryLocks, **kwargs: Any) -> tuple[Lease, Opened, Metrics]:
    opened = Opened(locks)
    metrics = Metrics(CollectorRegistry())
    return Lease(opened, "duty", metrics, **kwargs), opened, metrics


def test_one_replica_leads_and_a_survivor_takes_over_when_it_dies() -> None:
    async def scenario() -> None:
        locks = InMemoryLocks()
        (first, first_sessions, first_metrics) = lease(locks)
        (second, _, second_metrics) = lease(locks)
        assert [await first.leads(), await second.leads()] == [True, False]
        assert [await first.leads(), await second.leads()] == [True, False]
        assert leader_gauge(first_metrics, "duty") == 1
        assert leader_gauge(second_metrics, "duty") == 0
        first_sessions.sessions[-1].drop()  # SIGKILL: the server ends its session
        assert await second.leads()
        assert not await first.leads()  # its session is gone: it stands down
        assert not await first.leads()  # and waits, on a new session

    asyncio.run(scenario())


def test_a_leader_whose_session_fails_stands_down_once_and_can_lead_again() -> None:
    async def scenario() -> None:
        locks = InMemoryLocks()
        lost: list[str] = []
        (only, sessions, metrics) = lease(locks, on_lost=lambda: lost.append("lost"))
        assert await only.leads()
        sessions.sessions[-1].drop()
        assert not await only.leads()
        assert lost == ["lost"]
        assert leader_gauge(metrics, "duty") == 0
        # Nobody else took it: the next look, on a new session, leads again.
        assert await only.leads()
        assert lost == ["lost"] and len(sessions.sessions) == 2

    asyncio.run(scenario())


def test_a_stopped_leader_hands_the_duty_over() -> None:
    async def scenario() -> None:
        locks = InMemoryLocks()
        (first, _, _) = lease(locks)
        (second, _, _) = lease(locks)
        assert await first.leads()
        await first.on_stop()
        assert await second.leads()
        assert not first.leader

    asyncio.run(scenario())


def test_a_look_that_hangs_counts_as_failed() -> None:
    class Hanging:
        async def try_hold(self, duty: str) -> bool:
            await asyncio.sleep(60)
            return True

        async def alive(self) -> bool:
            return True

        async def close(self) -> None:
            return None

    async def connect() -> Hanging:
        return Hanging()

    async def scenario() -> None:
        hanging = Lease(connect, "duty", Metrics(CollectorRegistry()), timeout_seconds=0.05)
        assert not await hanging.leads()

    asyncio.run(scenario())


class Lags:
    """A lag collector that counts its collections."""

    def __init__(self) -> None:
        self.collected = 0

    def collect(self) -> list[PartitionLag]:
        self.collected += 1
        return [PartitionLag("memproj-memory", "memory.events", 0, 5, 7, 2, 1.5)]


def lag_series(metrics: Metrics) -> float | None:
    labels = {"group": "memproj-memory", "topic": "memory.events", "partition": "0"}
    return metrics.registry.get_sample_value("memproj_consumer_lag_messages", labels)


def test_only_the_leading_monitor_collects_and_exports_the_lag() -> None:
    async def scenario() -> None:
        locks = InMemoryLocks()
        monitors = []
        for _ in range(2):
            metrics = Metrics(CollectorRegistry())
            lags = Lags()
            monitor = MonitorService(
                cast(Any, lags),
                cast(Any, None),  # no database: the ghost audit fails, logged, and is retried
                [],
                metrics,
                timedelta(seconds=1),
                timedelta(hours=1),
                lease=Lease(Opened(locks), "monitor", metrics, metrics.monitor_standing_by),
            )
            monitors.append((monitor, lags, metrics))
        (leader, leader_lags, leader_metrics), (standby, standby_lags, standby_metrics) = monitors
        assert [await leader.round(), await standby.round()] == [True, False]
        assert (leader_lags.collected, standby_lags.collected) == (1, 0)
        assert lag_series(leader_metrics) == 2
        assert lag_series(standby_metrics) is None
        # The leader's session fails; the standby takes over, and the old leader's series go.
        (session,) = [s for s in locks.sessions if s.session_id == locks.holders["monitor"]]
        session.drop()
        assert [await standby.round(), await leader.round()] == [True, False]
        assert lag_series(standby_metrics) == 2
        assert lag_series(leader_metrics) is None

    asyncio.run(scenario())
