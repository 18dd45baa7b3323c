"""The memory projection as a worker runs it: reducer, store and the messages it publishes."""

from __future__ import annotations

from collections.abc import Sequence

from projections.bookkeeping import Conn, OutboxMessage
from projections.idempotency import EventKey
from projections.memory import store
from projections.memory.reducer import BatchResult, MemoryKey, reduce_batch
from topics.codec import EventCodec, encode
from topics.memory import MemoryEvent
from topics.outputs import MemoryRecord
from topics.registry import MEMORY_CURRENT, MEMORY_EVENTS, MEMORY_REJECTIONS, TopicNames, entity_key
from topics.schemas import SchemaRegistry

MemoryState = dict[MemoryKey, MemoryRecord]


class MemoryProjection:
    name = "memory"
    input_spec = MEMORY_EVENTS
    rejections_spec = MEMORY_REJECTIONS

    def __init__(self, schemas: SchemaRegistry, topics: TopicNames, max_value_bytes: int) -> None:
        accepted = frozenset(t for t in schemas.event_types() if t.startswith("memory."))
        self.codec = EventCodec(schemas, accepted, {"value": max_value_bytes})
        self._current_topic = topics.name(MEMORY_CURRENT)

    async def load(self, conn: Conn, events: Sequence[MemoryEvent]) -> MemoryState:
        return await store.load_records(conn, ((e.tenant_id, e.memory_id) for e in events))

    def reduce(
        self, events: Sequence[MemoryEvent], state: MemoryState, seen: dict[EventKey, bytes]
    ) -> BatchResult:
        return reduce_batch(events, state, seen)

    async def save(self, conn: Conn, outcome: BatchResult) -> None:
        await store.save_batch(conn, outcome)

    def outputs(self, outcome: BatchResult) -> list[OutboxMessage]:
        """``memory.current`` gets each changed record once, as the batch left it; a revoked
        memory is gone from recall, so its key gets a null value (compaction removes it)."""
        return [
            OutboxMessage(
                self._current_topic,
                entity_key(*key).encode(),
                None if record.status == "revoked" else encode(record),
            )
            for key, record in outcome.records.items()
        ]

    def committed(self, outcome: BatchResult) -> None:
        """Nothing memory-specific to report beyond what the runner counts."""
