"""A rolling restart: every worker kind SIGTERMed mid-stream and started again ends with the
projections of a run that was never interrupted, redelivers nothing it had applied, stops
within its bound and goes not ready, then ready again."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from projections.embeddings.vectors import Match
from projections.shadow import SPECS
from projections.shadow import checksums as table_checksums
from projections.stores import STORES
from streams.kafka import admin_config
from streams.sample import EventFactory, sample_conversation_stream, sample_memory_stream
from support.deletion_scenario import recent_factory, vectors
from support.ports import free_port
from support.probes import Answer, metric_sample, metric_total, probe, wait_probe
from topics.registry import (
    CONVERSATION_EVENTS,
    DELETION_ACKS,
    DELETION_REQUESTS,
    DELETION_TOMBSTONES,
    MEMORY_EVENTS,
)

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


def stop_gracefully(env: Any, kind: str, victim: Any, port: int) -> float:
    """SIGTERM ``victim`` and check its shutdown: within the bound, not ready while stopping,
    its batch in progress finished, out of its consumer group at once. The seconds it took."""
    assert victim.process is not None
    watch = ReadinessWatch(port, victim)
    started = time.monotonic()
    victim.sigterm()
    code = victim.process.wait(SHUTDOWN_BOUND_SECONDS)  # raises past the bound
    stopped_in = time.monotonic() - started
    watch.join()
    log = victim.log_tail(400)
    assert code == 0, log
    assert watch.saw_shutting_down(), watch.answers[-5:]
    assert "shutdown (a signal): not ready" in log
    if kind != "monitor":  # the monitor consumes nothing: no batch, no group
        assert "(0 abandoned and rolled back)" in log
        # It left its group: the group is empty at once, not after the session timeout.
        assert group_members(env, env.settings.group_id(kind)) == 0
    return stopped_in


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
        shutdowns[kind] = stop_gracefully(env, kind, workers[kind], ports[kind])

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


# The erasure path: the ledger, every derived store and the monitor, each restarted while
# deletions flow through it.
ERASURE_KINDS = ("deletion", *STORES.names, "monitor")
SUBJECTS_PER_PHASE, ERASED_PER_PHASE = 24, 16


def subject_of(phase: int, index: int) -> tuple[str, str]:
    return ("user", f"u{phase}_{index}")


def produce_subjects(env: Any, f: EventFactory, phase: int) -> None:
    """Each subject: two memories and a conversation with two messages and a summary."""
    memories, conversations = [], []
    for index in range(SUBJECTS_PER_PHASE):
        subject = subject_of(phase, index)
        conversation = f"c{phase}_{index}"
        for n in range(2):
            value = {"text": f"fact {n} of {subject[1]}"}
            memories.append(f.proposed("acme", f"m{phase}_{index}_{n}", subject, value))
        conversations += [
            f.started("acme", conversation, subject),
            f.message("acme", conversation, "m1", "user", f"hello from {subject[1]}"),
            f.message("acme", conversation, "m2", "assistant", "hello"),
            f.summary("acme", conversation, 1, f"{subject[1]} said hello", ["m1", "m2"]),
        ]
    env.produce_events(conversations, CONVERSATION_EVENTS)
    env.produce_events(memories)


def request_erasures(env: Any, f: EventFactory, phase: int) -> list[str]:
    requests = {f"d{phase}_{index}": subject_of(phase, index) for index in range(ERASED_PER_PHASE)}
    env.produce_events(
        [
            f.deletion("acme", deletion_id, {"type": "subject", "id": name, "subject_type": kind})
            for deletion_id, (kind, name) in requests.items()
        ],
        DELETION_REQUESTS,
    )
    return list(requests)


def progress_of(env: Any, kind: str) -> int:
    """What the ledger or a store has done so far: requests recorded by the ledger,
    acknowledgements by a store."""
    with env.connect() as conn:
        if kind == "deletion":
            row = conn.execute("SELECT count(*) FROM deletion_requests").fetchone()
        else:
            row = conn.execute(
                "SELECT count(*) FROM deletion_store_acks WHERE store = %s AND status = 'done'",
                (kind,),
            ).fetchone()
    return int(row[0])


def wait_working(env: Any, kind: str, before: int, port: int) -> None:
    """Until ``kind`` is at work on this phase's erasures: the monitor reporting the lag of
    the ledger's group and the ghost audit's counts, the others past ``before``."""
    if kind == "monitor":
        group = env.settings.group_id("deletion")
        env.wait_until(
            lambda: (
                metric_sample(port, "memproj_consumer_lag_messages", group=group)
                and metric_sample(port, "memproj_ghost_items")
            ),
            "the monitor reporting",
        )
    else:
        env.wait_until(lambda: progress_of(env, kind) > before, f"{kind} erasing")


def ledger_outcome(env: Any) -> dict[str, tuple[str, bool, frozenset[str]]]:
    """Per deletion: its status, whether its verification found nothing, and the stores that
    acknowledged it done."""
    with env.connect() as conn:
        rows = conn.execute(
            "SELECT r.deletion_id, r.status, coalesce((r.verification->>'clean')::boolean, false),"
            " array_agg(a.store ORDER BY a.store) FILTER (WHERE a.status = 'done')"
            " FROM deletion_requests r JOIN deletion_store_acks a USING (tenant_id, deletion_id)"
            " GROUP BY 1, 2, 3"
        ).fetchall()
    return {row[0]: (row[1], row[2], frozenset(row[3] or ())) for row in rows}


def test_a_rolling_restart_of_the_erasure_path_completes_every_deletion_once(env: Any) -> None:
    f = recent_factory()
    options: dict[str, Any] = {
        "batch_max_events": 4,  # small batches: a SIGTERM lands between and within them
        "shutdown_timeout_seconds": SHUTDOWN_BOUND_SECONDS,
        # No redelivery by the ledger: a tombstone handled twice would show as a second ack.
        "deletion_redelivery_seconds": 3600.0,
    }
    kinds = ("memory", "conversation", *ERASURE_KINDS)
    ports = {kind: free_port() for kind in kinds}
    workers = {kind: env.worker(kind, metrics_port=ports[kind], **options) for kind in kinds}
    for kind in kinds:
        grouped = {} if kind == "monitor" else {"group": True}
        wait_probe(env, ports[kind], "/readyz", 200, database=True, running=True, **grouped)

    requested: list[str] = []
    shutdowns = {}
    for phase, kind in enumerate(ERASURE_KINDS):
        produce_subjects(env, f, phase)
        wait_phase_done(env)
        before = 0 if kind == "monitor" else progress_of(env, kind)
        requested += request_erasures(env, f, phase)
        wait_working(env, kind, before, ports[kind])
        shutdowns[kind] = stop_gracefully(env, kind, workers[kind], ports[kind])
        workers[kind] = env.worker(kind, metrics_port=ports[kind], **options)
        grouped = {} if kind == "monitor" else {"group": True}
        wait_probe(env, ports[kind], "/readyz", 200, database=True, running=True, **grouped)

    everything = frozenset(STORES.names)

    def all_verified() -> dict[str, Any] | None:
        outcome = ledger_outcome(env)
        done = {d: o for d, o in outcome.items() if o == ("completed", True, everything)}
        return outcome if len(done) == len(requested) else None

    assert set(env.wait_until(all_verified, "every deletion completed and verified")) == set(
        requested
    )
    # Each deletion was published once, and each store acknowledged it done once: no restart
    # handed a worker a tombstone or a request its predecessor had already honoured.
    tombstones = Counter(
        value["deletion_id"] for _, value in env.read(DELETION_TOMBSTONES) if value
    )
    assert tombstones == Counter(requested)
    acks = Counter(
        (value["deletion_id"], value["store"])
        for _, value in env.read(DELETION_ACKS)
        if value and value["status"] == "done"
    )
    assert acks == Counter((d, store) for d in requested for store in STORES.names)
    # What was not erased is all there: every kept subject's memories, projected and indexed.
    kept = len(ERASURE_KINDS) * (SUBJECTS_PER_PHASE - ERASED_PER_PHASE)
    with env.connect() as conn:
        remaining = conn.execute(
            "SELECT count(*), count(DISTINCT subject_id) FROM memories WHERE tenant_id = 'acme'"
        ).fetchone()
    assert remaining == (2 * kept, kept)
    kept_memories = tuple(
        f"m{phase}_{index}_{n}"
        for phase in range(len(ERASURE_KINDS))
        for index in range(ERASED_PER_PHASE, SUBJECTS_PER_PHASE)
        for n in range(2)
    )
    indexed = vectors(env).find(Match(tenant_id="acme", memory_ids=kept_memories))
    assert len({entry.memory_id for entry in indexed}) == 2 * kept
    # The restarted monitor's ghost audit finds nothing in any store.
    for store in STORES.names:
        env.wait_until(
            lambda s=store: (
                metric_sample(ports["monitor"], "memproj_ghost_items", store=s)
                and metric_total(ports["monitor"], "memproj_ghost_items", store=s) == 0
            ),
            f"no ghosts in {store}",
        )
    print("shutdown seconds:", {kind: round(s, 2) for kind, s in shutdowns.items()})
