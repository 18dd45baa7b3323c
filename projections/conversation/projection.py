"""The conversation projection as a worker runs it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from projections.conversation import store
from projections.conversation.context import ContextSettings
from projections.conversation.published import encode_record, entity_of_message
from projections.conversation.reducer import (
    BatchResult,
    ConversationState,
    erasure_keys,
    reduce_batch,
)
from projections.deletion import guard as erasure_guard
from projections.idempotency import EventKey
from projections.outbox import OutboxMessage
from projections.redaction import RedactionObserver
from projections.sealing.codec import SealedCodec
from projections.sealing.keys import KeyStore, shred_refused
from projections.sql import Conn
from topics.codec import EventCodec
from topics.conversation import ConversationEvent
from topics.messages import InputMessage
from topics.registry import (
    CONVERSATION_MESSAGES,
    CONVERSATION_REJECTIONS,
    CONVERSATION_SEALED,
    TopicNames,
    TopicSpec,
    output_key,
)
from topics.schemas import SchemaRegistry


class ConversationProjection:
    name = "conversation"
    input_specs: tuple[TopicSpec, ...] = (CONVERSATION_SEALED,)
    rejections_spec = CONVERSATION_REJECTIONS
    tracks_event_ids = True

    def __init__(
        self,
        schemas: SchemaRegistry,
        topics: TopicNames,
        context: ContextSettings,
        observer: RedactionObserver,
        keys: KeyStore,
    ) -> None:
        accepted = frozenset(t for t in schemas.event_types() if t.startswith("conversation."))
        self.codec = SealedCodec(EventCodec(schemas, accepted), keys)
        self._context = context
        self._observer = observer
        self._messages_topic = topics.name(CONVERSATION_MESSAGES)
        self._keys = keys
        # How every store looks up a batch's keys: as the key store, built with the setting.
        self._lookups = keys.lookups

    async def prepare_decode(self, conn: Conn, messages: Sequence[InputMessage]) -> None:
        await self.codec.load_keys(conn, (m.value for m in messages))

    # ``load`` takes the shared tenant locks before it reads (the order of every projection
    # before the memory stage's late locks; see ``streams.runner``).
    locks_late = False

    async def load(self, conn: Conn, events: Sequence[ConversationEvent]) -> ConversationState:
        # Shared tenant locks before the erasure index is read (see projections.deletion.guard).
        await erasure_guard.lock_tenants(conn, (e.tenant_id for e in events), exclusive=False)
        state = await store.load_state(conn, events, self._lookups)
        keys = [
            key
            for event in events
            for key in erasure_keys(
                event, state.records.get((event.tenant_id, event.conversation_id))
            )
        ]
        erasures = await erasure_guard.load_erasures(conn, keys, self._lookups)
        return replace(state, erasures=erasures)

    async def lock(
        self, conn: Conn, events: Sequence[ConversationEvent], state: ConversationState
    ) -> ConversationState:
        """``load`` read under the shared tenant locks: ``state`` holds."""
        return state

    def reduce(
        self,
        events: Sequence[ConversationEvent],
        state: ConversationState,
        seen: dict[EventKey, bytes],
    ) -> BatchResult:
        return reduce_batch(events, state, seen)

    async def save(self, conn: Conn, outcome: BatchResult) -> None:
        await store.save_batch(conn, outcome, self._context, self._lookups)
        await shred_refused(conn, "conversation", outcome.keys_to_shred)
        # After the shredding: a key this part destroys never seals anything. A message this
        # part applies is not erased, so its conversation has a key (or, when the part shreds
        # an older key of it, gets a fresh one for what is new after the deletion).
        outcome.message_keys = await self._keys.keys(
            conn, {entity_of_message(m) for m in outcome.messages}, create=True
        )

    def outputs(self, outcome: BatchResult) -> list[OutboxMessage]:
        """Each new message, redacted and sealed with its conversation's data key, for the
        derived stores that index messages (see projections.conversation.published)."""
        return [
            OutboxMessage(
                self._messages_topic,
                output_key(message.tenant_id, message.conversation_id).encode(),
                encode_record(message, outcome.message_keys[entity_of_message(message)]),
            )
            for message in outcome.messages
        ]

    def committed(self, outcome: BatchResult) -> None:
        for kind, count in outcome.redactions.items():
            self._observer.redacted(kind, count)
