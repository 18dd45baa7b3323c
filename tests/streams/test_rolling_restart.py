"""A rolling restart: every worker kind SIGTERMed mid-stream and started again ends with the
projections of a run that was never interrupted, redelivers nothing it had applied, stops
within its bound and goes not ready, then ready again."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from projections.shadow import SPECS
from projections.shadow import checksums as table_checksums
from streams.kafka import admin_config
from streams.sample import EventFactory, sample_conversation_stream, sample_memory_stream
from support.probes import Answer, free_port, metric_total, probe, wait_probe
from topics.registry import CONVERSATION_EVENTS, MEMORY_EVENTS

pytestmark = pytest.mark.integration

KINDS = ("memory", "conversation")
SHUTDOWN_BOUND_SECONDS = 20.0
PHASE_MEMORIES, PHASE_CONVERSATIONS = 3000, 150


def applied_offsets(env: Any, projection: str) -> int:
    with env.connect() as conn:
        row = conn.execute(
            "SELECT coalesce(sum(next_offset), 0) FROM projection_offsets WHERE projection = %s",
            (projection,),
        ).fetchone()
    return int(row[0])


def conversation_checksums(env: Any) -> Any:
    async def compute() -> Any:
        async with await psycopg.AsyncConnection.connect(env.settings.postgres_conninfo) as conn:
            return await table_checksums(conn, SPECS["conversation"])

    return asyncio.run(compute())


def group_members(env: Any, group: str) -> int:
    admin = AdminClient(admin_config(env.settings.kafka_bootstrap))
    description = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
    return len(description.members)


class ReadinessWatch:
    """Polls /readyz from a thread until the worker exits, keeping every answer."""

    def __init__(self, port: int, worker: Any) -> None:
        self.answers: list[Answer | None] = []
        self._port, self._worker = port, worker
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while self._worker.alive():
            self.answers.append(probe(self._port, "/readyz"))

    def join(self) -> None:
        self._thread.join(30)

    def saw_shutting_down(self) -> bool:
        return any(
            answer is not None
            and answer[0] == 503
            and answer[1] is not None
            and answer[1]["checks"]["running"]["detail"] == "shutting down"
            for answer in self.answers
        )


def produce_phase(env: Any, phase: int) -> tuple[int, int]:
    seed = 100 + phase
    memories = [(m.key, m.value) for m in sample_memory_stream(PHASE_MEMORIES, 4, seed)]
    conversations = [
        (m.key, m.value) for m in sample_conversation_stream(PHASE_CONVERSATIONS, 4, seed)
    ]
    return env.produce(env.topic(MEMORY_EVENTS), memories), env.produce(
        env.topic(CONVERSATION_EVENTS), conversations
    )


def wait_phase_done(env: Any) -> None:
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")


def test_a_rolling_restart_ends_with_the_uninterrupted_projections(env: Any) -> None:
    options: dict[str, Any] = {
        "batch_max_events": 100,
        "shutdown_timeout_seconds": SHUTDOWN_BOUND_SECONDS,
    }
    ports = {kind: free_port() for kind in KINDS}
    workers = {kind: env.worker(kind, metrics_port=ports[kind], **options) for kind in KINDS}
    steady = env.sibling("steady")
    # Never stopped, and in batches of its own size: the same projections all the same.
    steady.worker("memory")
    steady.worker("conversation")
    for kind in KINDS:
        wait_probe(env, ports[kind], "/readyz", 200, group=True, database=True, running=True)

    shutdowns = {}
    for phase, kind in enumerate(KINDS):
        before = applied_offsets(env, kind)
        produce_phase(env, phase)
        env.wait_until(lambda k=kind, b=before: applied_offsets(env, k) > b, f"{kind} applying")
        victim = workers[kind]
        assert victim.process is not None
        watch = ReadinessWatch(ports[kind], victim)
        started = time.monotonic()
        victim.sigterm()
        code = victim.process.wait(SHUTDOWN_BOUND_SECONDS)  # raises past the bound
        shutdowns[kind] = time.monotonic() - started
        watch.join()
        log = victim.log_tail(400)
        assert code == 0, log
        assert watch.saw_shutting_down(), watch.answers[-5:]
        assert "shutdown (a signal): not ready" in log
        assert "(0 abandoned and rolled back)" in log
        # It left its group: the group is empty at once, not after the session timeout.
        assert group_members(env, env.settings.group_id(kind)) == 0

        workers[kind] = env.worker(kind, metrics_port=ports[kind], **options)
        wait_probe(env, ports[kind], "/readyz", 200, group=True, database=True, running=True)
        wait_phase_done(env)
        port = ports[kind]
        # Stopped mid-stream: its successor applied batches of the phase ...
        assert metric_total(port, "memproj_batch_seconds_count", projection=kind) > 0
        # ... and was handed nothing its predecessor had applied (committed to Kafka too).
        assert metric_total(port, "memproj_redeliveries_total", kind="offset") == 0

    steady.wait_caught_up(MEMORY_EVENTS, "memory")
    steady.wait_caught_up(CONVERSATION_EVENTS, "conversation")
    restarted, never_stopped = env.checksums(), steady.checksums()
    assert restarted == never_stopped
    assert sum(c.versions for c in restarted.values()) > 2 * PHASE_MEMORIES
    assert conversation_checksums(env) == conversation_checksums(steady)
    print("shutdown seconds:", {kind: round(s, 2) for kind, s in shutdowns.items()})


def test_a_batch_stuck_at_sigterm_is_rolled_back_within_the_bound(env: Any) -> None:
    f = EventFactory()
    env.produce_events([f.proposed("t1", "m0")])
    bound = 6.0  # 4 s for the batch in progress (``ShutdownBudget``), 2 s for the rest
    worker = env.worker("memory", shutdown_timeout_seconds=bound)
    env.wait_caught_up()
    assert worker.process is not None
    with env.connect() as lock:
        lock.execute("BEGIN")
        lock.execute("LOCK TABLE memories IN ACCESS EXCLUSIVE MODE")
        env.produce_events([f.proposed("t1", f"m{i}") for i in range(1, 20)])
        env.wait_until(lambda: waiting_for_lock(env, "memories"), "a batch waiting for the lock")
        started = time.monotonic()
        worker.sigterm()
        code = worker.process.wait(bound)  # raises past the bound
        stopped_in = time.monotonic() - started
        lock.execute("ROLLBACK")
    log = worker.log_tail(400)
    assert "memory: abandoning the batch in progress at shutdown" in log
    assert "(1 abandoned and rolled back)" in log
    print(f"exit {code} after {stopped_in:.1f} s")
    with env.connect() as conn:
        assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 1
    env.worker("memory")
    env.wait_caught_up()
    with env.connect() as conn:
        assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 20


def waiting_for_lock(env: Any, table: str) -> bool:
    with env.connect() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s::regclass",
            (table,),
        ).fetchone()
    return bool(row[0])
