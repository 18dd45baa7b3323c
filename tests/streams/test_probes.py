"""/healthz and /readyz: the pure verdicts, the batch loop's drain, and real workers."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from streams.failures import SystemicFailure
from streams.isolation import Isolation
from streams.loop import Batch, StopOnce
from streams.metrics import Metrics
from streams.probes import (
    DATABASE_CHECK_TTL_SECONDS,
    DatabaseAnswer,
    GroupMembership,
    ShutdownBudget,
    liveness,
    needs_database_check,
    readiness,
)
from streams.sample import EventFactory
from streams.services import DatabaseProbe, ProbeService, WorkerState
from support.fakes import Stops, loop_for, message
from support.ports import free_port
from support.probes import probe, wait_probe
from topics.messages import InputMessage

UP = DatabaseAnswer(True, "SELECT 1 answered", 0.0)


def checks(verdict: Any) -> dict[str, bool]:
    return {name: check["ok"] for name, check in verdict.body()["checks"].items()}


# -- the verdicts --------------------------------------------------------------------------


def test_a_worker_is_ready_once_its_first_assignment_completed_even_if_empty() -> None:
    joining = GroupMembership()
    assert not readiness(joining, UP, False, None).ok
    assert readiness(joining.assigned_to([]), UP, False, None).ok  # more members than partitions
    assigned = joining.assigned_to([("t", 0), ("t", 1)])
    verdict = readiness(assigned, UP, False, None)
    assert verdict.status == 200
    assert verdict.body()["checks"]["group"]["detail"] == "2 partitions assigned"


def test_a_rebalance_makes_the_worker_not_ready_until_its_assignment_completes() -> None:
    rebalancing = GroupMembership().assigned_to([("t", 0)]).revoked()
    verdict = readiness(rebalancing, UP, False, None)
    assert (verdict.status, checks(verdict)) == (
        503,
        {"group": False, "database": True, "running": True},
    )
    assert readiness(rebalancing.assigned_to([("t", 1)]), UP, False, None).ok


def test_a_worker_of_several_consumers_is_ready_once_each_is_and_not_while_one_rebalances() -> None:
    state = WorkerState(None, in_group=True)
    tombstones, feed = state.member("tombstones"), state.member("feed")
    assert state.membership is not None and not state.membership.check().ok
    tombstones.assigned([("tombstones", 0)])
    assert not state.membership.check().ok  # the feed's consumer has not joined yet
    feed.assigned([("current", 0), ("current", 1)])
    assert state.membership.check().detail == "3 partitions assigned"
    feed.rebalancing()
    assert state.membership.check().detail == "rebalancing"
    feed.assigned([("current", 1)])
    assert state.membership.assigned == frozenset({("tombstones", 0), ("current", 1)})
    assert WorkerState(None, in_group=False).membership is None


def test_the_database_shutdown_and_a_failure_each_make_the_worker_not_ready() -> None:
    member = GroupMembership().assigned_to([("t", 0)])
    down = DatabaseAnswer(False, "unreachable (OperationalError)", 0.0)
    assert checks(readiness(member, down, False, None)) == {
        "group": True,
        "database": False,
        "running": True,
    }
    assert not readiness(member, None, False, None).ok  # never checked yet
    stopping = readiness(member, UP, True, None)
    assert stopping.body()["checks"]["running"] == {"ok": False, "detail": "shutting down"}
    failed = readiness(member, UP, True, RuntimeError("secret value in a message"))
    assert failed.body()["checks"]["running"] == {"ok": False, "detail": "stopped by RuntimeError"}


def test_a_worker_without_a_group_is_judged_on_the_database_and_running() -> None:
    verdict = readiness(None, UP, False, None)
    assert verdict.ok and set(checks(verdict)) == {"database", "running"}


def test_liveness_fails_once_the_heartbeat_is_stale() -> None:
    assert liveness(1.0, 5.0).status == 200
    assert liveness(5.5, 5.0).status == 503


def test_the_database_answer_is_reused_for_a_moment() -> None:
    assert needs_database_check(None, 0.0)
    assert not needs_database_check(UP, DATABASE_CHECK_TTL_SECONDS / 2)
    assert needs_database_check(UP, DATABASE_CHECK_TTL_SECONDS)


def test_the_shutdown_budget_leaves_time_to_commit_and_leave() -> None:
    assert (ShutdownBudget(30).drain_seconds, ShutdownBudget(30).reserve_seconds) == (20, 10)
    assert ShutdownBudget(6).drain_seconds == 4
    assert ShutdownBudget(90).reserve_seconds == 10


# -- the batch loop's drain ----------------------------------------------------------------


@dataclass
class EndlessSource:
    """Like a faust stream: hands out its batches, then waits for more forever."""

    batches_to_take: list[list[InputMessage]]
    acked: list[int] = field(default_factory=list)
    acked_first: asyncio.Event = field(default_factory=asyncio.Event)

    async def batches(self) -> AsyncIterator[Batch]:
        for messages in self.batches_to_take:
            yield Batch(messages)
        await asyncio.Event().wait()

    async def ack(self, batch: Batch) -> None:
        self.acked.extend(m.offset for m in batch.messages)
        self.acked_first.set()


@dataclass
class GatedHandler:
    """Applies a batch once ``release`` is set; ``started`` is set when one is handed over."""

    name: str = "gated"
    started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    applied: list[int] = field(default_factory=list)

    async def apply(self, messages: Sequence[InputMessage], isolation: Isolation) -> object:
        self.started.set()
        await self.release.wait()
        self.applied.extend(m.offset for m in messages)
        return None


async def drained(release_after_drain: bool, within: float) -> tuple[bool, GatedHandler, Any]:
    handler = GatedHandler()
    source = EndlessSource([[message(0), message(1)], [message(2)]])
    loop = loop_for(handler, Stops())
    running = asyncio.create_task(loop.run(source))
    await handler.started.wait()
    draining = asyncio.create_task(loop.drain(within))
    if release_after_drain:
        handler.release.set()
    finished = await draining
    running.cancel()
    await asyncio.wait((running,))
    return finished, handler, source


def test_a_drain_finishes_the_batch_in_progress_and_takes_no_other() -> None:
    finished, handler, source = asyncio.run(drained(release_after_drain=True, within=30))
    assert finished
    assert handler.applied == source.acked == [0, 1]  # batch 2 was queued, never started


def test_a_drain_past_its_deadline_abandons_the_batch_unacknowledged() -> None:
    finished, handler, source = asyncio.run(drained(release_after_drain=False, within=0.05))
    assert not finished
    assert handler.applied == source.acked == []


def test_a_drain_of_an_idle_loop_ends_at_once() -> None:
    async def run() -> bool:
        handler = GatedHandler()
        handler.release.set()
        source = EndlessSource([[message(0)]])
        loop = loop_for(handler, Stops())
        running = asyncio.create_task(loop.run(source))
        await source.acked_first.wait()
        finished = await loop.drain(30)
        running.cancel()
        return finished

    assert asyncio.run(run())


# -- real workers --------------------------------------------------------------------------


@pytest.mark.integration
def test_a_worker_is_live_then_ready_once_assigned_and_still_serves_metrics(env: Any) -> None:
    port = free_port()
    env.produce_events([EventFactory().proposed("t1", "m1")])
    env.worker("memory", metrics_port=port)
    ready = wait_probe(env, port, "/readyz", 200, group=True, database=True, running=True)
    assert ready["status"] == "ok"
    assert ready["checks"]["group"]["detail"].endswith("partitions assigned")
    live = probe(port, "/healthz")
    assert live is not None and live[0] == 200
    env.wait_caught_up()
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    assert b"memproj_events_applied_total" in metrics


@pytest.mark.integration
def test_a_worker_whose_database_is_unreachable_is_live_but_not_ready(env: Any) -> None:
    port, closed = free_port(), free_port()
    dsn = f"postgresql://memproj@127.0.0.1:{closed}/memproj"
    env.worker("memory", metrics_port=port, postgres_dsn=dsn)
    body = wait_probe(env, port, "/readyz", 503, database=False)
    assert body["checks"]["database"]["detail"] == "unreachable (OperationalError)"
    assert body["checks"]["group"]["ok"] is False  # it cannot consume without its database
    assert "memproj:memproj" not in orjson.dumps(body).decode()  # nothing of the DSN
    live = probe(port, "/healthz")
    assert live is not None and live[0] == 200


@pytest.mark.integration
def test_a_worker_the_breaker_stops_goes_not_ready_and_exits(env: Any) -> None:
    # The stop after a breaker trip takes milliseconds, too short to catch over HTTP: the
    # worker's log shows the shutdown began with the failure (the probe server's answer to
    # a fired StopOnce is the next test's).
    f = EventFactory()
    env.produce_events([f.proposed("t1", "m0")])
    worker = env.worker("memory")
    env.wait_caught_up()
    with env.connect() as conn:
        conn.execute("DROP TABLE memory_versions")
    env.produce_events([f.proposed("t1", f"m{i}") for i in range(1, 30)])
    assert worker.process is not None and worker.process.wait(60) != 0
    assert "shutdown (UndefinedTable): not ready" in worker.log_tail(400)


@pytest.mark.integration
def test_the_probe_server_answers_not_ready_once_the_worker_is_stopped(env: Any) -> None:
    async def run() -> list[tuple[int, dict[str, Any] | None] | None]:
        stops = Stops()
        state = WorkerState(StopOnce(stops), in_group=True)
        database = DatabaseProbe(env.settings.postgres_conninfo, 2)
        metrics = Metrics(CollectorRegistry())
        service = ProbeService(metrics, "127.0.0.1", port, state, database, 5.0)
        await service.start()
        state.member("agent").assigned([("t", 0)])
        answers = [await asyncio.to_thread(probe, port, "/readyz")]
        assert state.stop is not None
        await state.stop(SystemicFailure("the breaker tripped"))
        answers.append(await asyncio.to_thread(probe, port, "/readyz"))
        answers.append(await asyncio.to_thread(probe, port, "/healthz"))
        await service.stop()
        return answers

    port = free_port()
    ready, stopped, live = asyncio.run(run())
    assert ready is not None and ready[0] == 200
    assert stopped is not None and stopped[0] == 503 and stopped[1] is not None
    assert stopped[1]["checks"]["running"] == {"ok": False, "detail": "stopped by SystemicFailure"}
    assert live is not None and live[0] == 200  # its event loop still answers


@pytest.mark.integration
def test_the_monitor_has_no_group_check(env: Any) -> None:
    port = free_port()
    env.worker("monitor", metrics_port=port)
    body = wait_probe(env, port, "/readyz", 200, database=True, running=True)
    assert set(body["checks"]) == {"database", "running"}
