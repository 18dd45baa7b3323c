"""The conversation projection as a worker runs it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from projections.bookkeeping import Conn, OutboxMessage
from projections.conversation import store
from projections.conversation.context import ContextSettings
from projections.conversation.reducer import BatchResult, ConversationState, reduce_batch
from projections.idempotency import EventKey
from topics.codec import EventCodec
from topics.conversation import ConversationEvent
from topics.registry import CONVERSATION_EVENTS, CONVERSATION_REJECTIONS
from topics.schemas import SchemaRegistry


class RedactionObserver(Protocol):
    def redacted(self, kind: str, count: int) -> None: ...


class ConversationProjection:
    name = "conversation"
    input_spec = CONVERSATION_EVENTS
    rejections_spec = CONVERSATION_REJECTIONS

    def __init__(
        self, schemas: SchemaRegistry, context: ContextSettings, observer: RedactionObserver
    ) -> None:
        accepted = frozenset(t for t in schemas.event_types() if t.startswith("conversation."))
        self.codec = EventCodec(schemas, accepted)
        self._context = context
        self._observer = observer

    async def load(self, conn: Conn, events: Sequence[ConversationEvent]) -> ConversationState:
        return await store.load_state(conn, events)

    def reduce(
        self,
        events: Sequence[ConversationEvent],
        state: ConversationState,
        seen: dict[EventKey, bytes],
    ) -> BatchResult:
        return reduce_batch(events, state, seen)

    async def save(self, conn: Conn, outcome: BatchResult) -> None:
        await store.save_batch(conn, outcome, self._context)

    def outputs(self, outcome: BatchResult) -> list[OutboxMessage]:
        return []  # conversations publish only their rejections (added by the runner)

    def committed(self, outcome: BatchResult) -> None:
        for kind, count in outcome.redactions.items():
            self._observer.redacted(kind, count)
