"""The memory stage reads its batch's state without the tenant locks and takes them only to
write (ops/decisions/erasure-latency.md): an erasure committed between a batch's first read
and its lock is honoured, as if it had committed before the batch started. Against the real
PostgreSQL: the interleaving is forced by a test double of the fused stage whose ``lock``
first commits the erasure through the ledger's own runner, on a connection of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from projections.bookkeeping import PostgresTracking
from projections.deletion.projection import LedgerProjection
from projections.embeddings.embedder import HashingEmbedder
from projections.memory.projection import MemoryProjection
from projections.sealing.fused import FusedState, SealingProjection
from projections.sealing.sealer import Sealer
from streams.isolation import CircuitBreaker, Isolation
from streams.metrics import Metrics
from streams.runner import ProjectionRunner
from streams.sample import EventFactory, RawEvent, to_message
from streams.services import make_pool
from streams.worker import memory_projection, probe_sealer, sealer
from support.deadletters import memory_dead_letters
from support.environment import Env
from support.fakes import Publisher
from topics.messages import InputMessage
from topics.registry import DELETION_REQUESTS, MEMORY_EVENTS
from topics.schemas import default_schemas

TENANT = "acme"
ALICE = ("user", "alice")


class ErasedMeanwhile(SealingProjection[Any, Any, Any]):
    """The fused memory stage, with ``erase`` run (and committed) after the batch's first
    read and before its tenant locks; records whether the lock handed back a new state."""

    def __init__(self, sealing: Sealer, projection: MemoryProjection) -> None:
        super().__init__(sealing, projection)
        self.erase: Any = None
        self.read_again: list[bool] = []

    async def lock(
        self, conn: Any, events: Sequence[Any], state: FusedState[Any]
    ) -> FusedState[Any]:
        if self.erase is not None:
            erase, self.erase = self.erase, None
            await erase()
        current = await super().lock(conn, events, state)
        self.read_again.append(current is not state)
        return current


def isolation(name: str) -> Isolation:
    return Isolation(CircuitBreaker(name), Metrics(CollectorRegistry()), memory_dead_letters())


def messages(env: Env, spec: Any, events: list[RawEvent], first: int) -> list[InputMessage]:
    topic = env.topic(spec)
    return [InputMessage(topic, 0, first + n, *to_message(event)) for n, event in enumerate(events)]


def run_interleaved(
    env: Env, before: list[RawEvent], batch: list[RawEvent], deletion: RawEvent | None
) -> tuple[ErasedMeanwhile, Publisher]:
    """``before`` applied by the memory stage; then ``batch``, with ``deletion`` applied by
    the ledger between the batch's first read and its tenant locks."""
    settings = env.settings
    metrics = Metrics(CollectorRegistry())
    stage = ErasedMeanwhile(sealer(settings, MEMORY_EVENTS), memory_projection(settings))
    ledger = LedgerProjection(
        default_schemas(),
        settings.topics,
        HashingEmbedder(settings.embedding_dim),
        timedelta(hours=1),
        metrics,
        probes=probe_sealer(settings),
        lookups=settings.key_lookups,
    )
    published = Publisher()

    async def run() -> None:
        dsn = settings.postgres_dsn
        async with make_pool(dsn, 1) as pool, make_pool(dsn, 1) as ledger_pool:
            tracking = PostgresTracking(settings.key_lookups)
            memory = ProjectionRunner(
                stage, pool, published, settings.topics, metrics, tracking=tracking
            )
            deletions = ProjectionRunner(
                ledger, ledger_pool, Publisher(), settings.topics, metrics, tracking=tracking
            )
            await memory.apply(messages(env, MEMORY_EVENTS, before, 0), isolation("memory"))
            if deletion is not None:

                async def erase() -> None:
                    requested = messages(env, DELETION_REQUESTS, [deletion], 0)
                    await deletions.apply(requested, isolation("deletion"))

                stage.erase = erase
            stage.read_again.clear()
            await memory.apply(messages(env, MEMORY_EVENTS, batch, len(before)), isolation("m"))

    asyncio.run(run())
    return stage, published


def rows(env: Env, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with env.connect() as conn:
        return [tuple(row) for row in conn.execute(query, params).fetchall()]


def factory() -> EventFactory:
    return EventFactory(id_prefix="late", clock=datetime.now(UTC) - timedelta(minutes=10))


@pytest.mark.integration
def test_a_memory_erased_between_the_read_and_the_lock_is_not_written_back(env: Env) -> None:
    f = factory()
    before = [f.proposed(TENANT, "mem_allergy", ALICE, {"text": "allergic to peanuts"})]
    batch = [
        f.corrected(TENANT, "mem_allergy", 1, {"text": "allergic to peanuts and almonds"}),
        f.proposed(TENANT, "mem_other", ("user", "bob"), {"text": "plays tennis"}),
    ]
    target = {"type": "memory", "id": "mem_allergy"}
    stage, published = run_interleaved(env, before, batch, f.deletion(TENANT, "del_1", target))

    assert stage.read_again == [True]  # the erasure came between the read and the lock
    memories = rows(env, "SELECT memory_id, status FROM memories ORDER BY 1")
    assert memories == [("mem_other", "proposed")]
    assert rows(env, "SELECT memory_id FROM memory_versions WHERE memory_id = 'mem_allergy'") == []
    assert rows(env, "SELECT reason FROM rejections WHERE entity_id = 'mem_allergy'") == [
        ("erased",)
    ]
    # No key opens the erased memory's data; the sealed log has the event without its fields.
    assert rows(env, "SELECT 1 FROM entity_keys WHERE entity_id = 'mem_allergy'") == []
    values = [m.value for m in published.on("memory.current") if m.key == b"acme:mem_allergy"]
    assert values == [values[0]] and values[0] is not None  # only the first batch's record
    sealed = [
        orjson.loads(m.value or b"")["payload"]
        for m in published.on("memory.events.sealed")[1:]
        if m.key == b"acme:mem_allergy"
    ]
    assert [p["sealed"] for p in sealed] == [{"entity": "memory:mem_allergy", "erased": True}]
    assert "value" not in sealed[0]


@pytest.mark.integration
def test_a_subject_erased_between_the_read_and_the_lock_refuses_its_new_memory(env: Env) -> None:
    f = factory()
    before = [f.proposed(TENANT, "mem_city", ("user", "bob"), {"text": "lives in Porto"})]
    batch = [f.proposed(TENANT, "mem_new", ALICE, {"text": "born in Lisbon"})]
    target = {"type": "subject", "subject_type": "user", "id": "alice"}
    stage, published = run_interleaved(env, before, batch, f.deletion(TENANT, "del_2", target))

    assert stage.read_again == [True]
    assert rows(env, "SELECT memory_id FROM memories ORDER BY 1") == [("mem_city",)]
    assert rows(env, "SELECT reason FROM rejections WHERE entity_id = 'mem_new'") == [("erased",)]
    # The key the first read proposed for the new memory was never stored; the one made
    # under the locks was destroyed with the refusal, as before the late locks.
    assert rows(env, "SELECT 1 FROM entity_keys WHERE entity_id = 'mem_new'") == []
    assert not [m for m in published.on("memory.current") if m.key == b"acme:mem_new"]


@pytest.mark.integration
def test_without_an_erasure_meanwhile_the_first_read_is_written(env: Env) -> None:
    f = factory()
    before = [f.proposed(TENANT, "mem_a", ALICE, {"text": "likes tea"})]
    batch = [f.verified(TENANT, "mem_a", 1), f.proposed(TENANT, "mem_b", ALICE, {"text": "x"})]
    stage, _ = run_interleaved(env, before, batch, None)

    assert stage.read_again == [False]
    assert rows(env, "SELECT memory_id, status FROM memories ORDER BY 1") == [
        ("mem_a", "verified"),
        ("mem_b", "proposed"),
    ]
    # The key proposed without the locks is the one stored.
    assert len(rows(env, "SELECT 1 FROM entity_keys WHERE entity_id IN ('mem_a', 'mem_b')")) == 2
