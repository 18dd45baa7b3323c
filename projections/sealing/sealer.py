"""Sealing: raw input in, the long-retention sealed log out.

``Sealer`` is the one home of the per-event sealing logic. It validates every raw event under
the contract (invalid ones become dead letters, once), seals the personal fields with the
entity's data key, and makes the sealed event, in the same partition order, a message for
``<topic>.sealed``. An event about an entity erased at or after the time it happened is
written without its personal fields at all: it still reaches the projections (which refuse it
as ``erased``), and nothing of it was ever stored.

No worker runs it alone (ops/decisions/one-hop.md): the memory and conversation workers run it
with their projection in one stage (``projections.sealing.fused``), each on its own raw topic,
and the sealed log is one of their outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson

from projections.admission.evidence import Stamps, read_stamps
from projections.deletion import guard as erasure_guard
from projections.deletion.erasure import (
    EntityKey,
    ErasureIndex,
    conversation_content_key,
    conversation_key,
    memory_key,
)
from projections.idempotency import EventKey, ProcessedEvent
from projections.outbox import OutboxMessage
from projections.sealing.crypto import new_data_key
from projections.sealing.fields import (
    EntityRef,
    entity_of_event,
    seal,
    seal_erased,
    sealing_keys_of_event,
    source_field,
    with_placeholders,
)
from projections.sealing.keys import KeyStore
from projections.sql import Conn
from topics.codec import EventCodec
from topics.envelope import Envelope, Source
from topics.messages import InputMessage
from topics.outputs import Rejection
from topics.registry import (
    CONVERSATION_EVENTS,
    MEMORY_EVENTS,
    MEMORY_REJECTIONS,
    TopicNames,
    TopicSpec,
    input_key,
)
from topics.schemas import SchemaRegistry


@dataclass(frozen=True, slots=True)
class SealingState:
    keys: dict[EntityRef, bytes]
    erasures: ErasureIndex
    # Read without the tenant locks (``Sealer.read``): what was read of the erasure index, and
    # the keys made for entities that had none, not stored yet (``Sealer.confirm`` does).
    read: erasure_guard.ErasuresRead = field(default_factory=erasure_guard.ErasuresRead)
    proposed: dict[EntityRef, bytes] = field(default_factory=dict)
    # The admission stamps of the batch's memory events (``projections.admission.evidence``).
    stamps: Stamps = field(default_factory=dict)


@dataclass(slots=True)
class Sealed:
    messages: list[OutboxMessage] = field(default_factory=list)
    erased: int = 0
    # The positions in the batch of the events written without their personal fields.
    erased_at: list[int] = field(default_factory=list)
    # The sealer decides nothing about events: idempotency is the projections' job.
    processed: list[ProcessedEvent] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    redelivered: int = 0
    shredded: int = 0

    def applied_event_types(self) -> list[str]:
        return []


def _erasure_key(ref: EntityRef) -> tuple[str, str, str, str]:
    tenant, entity_type, entity_id = ref
    if entity_type == "memory":
        return memory_key(tenant, entity_id)
    return conversation_key(tenant, entity_id)


def erasure_keys_of(event: Envelope, refs: Sequence[EntityRef]) -> list[EntityKey]:
    """The erasure index keys that cover ``event``, sealed under ``refs``: its entities', and
    for a conversation's own event the erasure of the conversation's content too (which does
    not cover a memory taken from the conversation)."""
    keys = [_erasure_key(ref) for ref in refs]
    if event.event_type.startswith("conversation."):
        keys += [conversation_content_key(t, i) for t, kind, i in refs if kind == "conversation"]
    return keys


class Sealer:
    name = "sealer"
    input_specs: tuple[TopicSpec, ...]
    rejections_spec = MEMORY_REJECTIONS
    tracks_event_ids = False
    locks_late = False  # ``load`` takes the tenant locks first

    def __init__(self, schemas: SchemaRegistry, topics: TopicNames, keys: KeyStore,
                 max_value_bytes: int,
                 input_specs: tuple[TopicSpec, ...] = (MEMORY_EVENTS, CONVERSATION_EVENTS),
                 ) -> None:  # fmt: skip
        """``input_specs``: the raw topics it reads. The codec is the same whichever: an
        event type read on the other raw topic is a dead letter for the same reason."""
        self.input_specs = input_specs
        accepted = frozenset(
            t for t in schemas.event_types() if t.startswith(("memory.", "conversation."))
        )
        self.codec = EventCodec(
            schemas,
            accepted,
            {"value": max_value_bytes},
            {
                topics.name(MEMORY_EVENTS): "memory.",
                topics.name(CONVERSATION_EVENTS): "conversation.",
            },
        )
        self._topics = topics
        self._keys = keys

    async def prepare_decode(self, conn: Conn, messages: Sequence[InputMessage]) -> None:
        """Raw input is plaintext: nothing to prepare."""

    async def load(
        self, conn: Conn, events: Sequence[Envelope], locked: bool = False
    ) -> SealingState:
        """The erasures and data keys a batch needs, keys created where missing. After the
        shared tenant locks (``locked``: the caller took them in this transaction already),
        so that a deletion either committed before (its erasure is read, no key is created
        for what it erased) or waits for this batch."""
        if not locked:
            await erasure_guard.lock_tenants(conn, (e.tenant_id for e in events), exclusive=False)
        return await self.read(conn, events, locked=True)

    async def read(self, conn: Conn, events: Sequence[Envelope], *, locked: bool) -> SealingState:
        """The erasures and data keys a batch needs. ``locked``: the caller holds the shared
        tenant locks, and a key is created for each entity that has none. Otherwise nothing is
        written: such an entity gets a key in ``proposed``, which ``confirm`` stores once the
        caller holds the locks, if no erasure of these entities was recorded meanwhile."""
        read = await erasure_guard.read_erasures(
            conn,
            (key for event in events for key in erasure_keys_of(event, event_sealing_keys(event))),
            self._keys.lookups,
        )
        erasures = read.index
        wanted = keys_needed(events, erasures)
        stamps = await read_stamps(conn, events, self._keys.lookups)
        if locked:
            keys = await self._keys.keys(conn, wanted, create=True)
            return SealingState(keys, erasures, read, stamps=stamps)
        found = await self._keys.keys(conn, wanted)
        proposed = {ref: new_data_key() for ref in sorted(set(wanted)) if ref not in found}
        return SealingState(found | proposed, erasures, read, proposed, stamps)

    async def confirm(self, conn: Conn, state: SealingState) -> bool:
        """Under the shared tenant locks: whether ``state`` (from ``read`` without them) still
        holds, its proposed keys now stored. False if an erasure of its entities was recorded
        since (nothing is stored) or another worker gave one of them a key meanwhile: the
        caller reads again under the locks."""
        if await erasure_guard.erasures_changed(conn, state.read, self._keys.lookups):
            return False
        return await self._keys.add(conn, state.proposed) == set(state.proposed)

    async def lock(
        self, conn: Conn, events: Sequence[Envelope], state: SealingState
    ) -> SealingState:
        """``load`` read under the shared tenant locks: ``state`` holds."""
        return state

    def reduce(
        self, events: Sequence[Envelope], state: SealingState, seen: dict[EventKey, bytes]
    ) -> Sealed:
        sealed = Sealed()
        for index, event in enumerate(events):
            # As given: a field the producer omitted stays omitted (``exclude_unset``), so
            # that an omission that means something survives the sealed log (a correction
            # without ``expires_at`` keeps the expiry; ``"expires_at": null`` removes it).
            # Decoding fills every other omitted field with its default, as from the raw
            # topic. Events sealed before contract 1.1 wrote every default out, so they hold
            # an explicit ``"expires_at": null`` whether the producer sent null or nothing:
            # they are read as written (null removes the expiry), which is what memproj did
            # with both when they were applied, so replaying them rebuilds the same records.
            serializer = event.__pydantic_serializer__
            keys = event_sealing_keys(event)
            stamp = state.stamps.get((event.tenant_id, event.event_id))
            if stamp is not None:
                # memproj's own field of its sealed log, whatever a producer sent.
                raw = serializer.to_python(event, mode="json", exclude_unset=True)
                raw["admission"] = stamp.model_dump(mode="json")
                if keys and state.erasures.covering(map(_erasure_key, keys), event.occurred_at):
                    sealed.erased += 1
                    sealed.erased_at.append(index)
                    raw = seal_erased(raw)
                elif keys:
                    raw = seal(raw, state.keys.get)
                value = orjson.dumps(raw)
            elif not keys:
                # Nothing to seal: the event's JSON as it is (scalars and ids only: the same
                # JSON orjson writes of the dump below), without a dict in between.
                value = serializer.to_json(event, exclude_unset=True)
            else:
                # (``model_dump(mode="json", exclude_unset=True)``, without its Python wrapper.)
                raw = serializer.to_python(event, mode="json", exclude_unset=True)
                if state.erasures.covering(erasure_keys_of(event, keys), event.occurred_at):
                    sealed.erased += 1
                    sealed.erased_at.append(index)
                    raw = seal_erased(raw)
                else:
                    raw = seal(raw, state.keys.get)
                value = orjson.dumps(raw)
            topic = f"{self._topics.prefix}{_raw_topic(event)}.sealed"
            key = input_key(event.tenant_id, event.entity_id).encode()  # the input, sealed
            sealed.messages.append(OutboxMessage(topic, key, value))
        return sealed

    def stamped(self, event: Envelope, state: SealingState) -> Envelope:
        """``event`` as its projection reads it from the sealed log: with the admission stamp
        ``reduce`` wrote beside it (and none a producer sent)."""
        stamp = state.stamps.get((event.tenant_id, event.event_id))
        if stamp is None and getattr(event, "admission", None) is None:
            return event
        return event.model_copy(update={"admission": stamp})

    def seals(self, event: Envelope) -> bool:
        """Whether ``event`` has personal fields, sealed with its entity's data key."""
        return bool(event_sealing_keys(event))

    def as_read_from_the_log(self, message: OutboxMessage) -> Envelope:
        """An event sealed as erased, as every reader of the sealed log decodes it
        (``SealedCodec``): placeholders for its personal fields, marked never to be applied.
        The one-hop stage hands its projection this, so that what it decides (a rejection as
        ``erased``, a body hash without the personal fields) is what a replay decides."""
        raw = with_placeholders(orjson.loads(message.value or b"null"))
        return self.codec.decode(message.key, orjson.dumps(raw)).unreadable_copy()

    async def save(self, conn: Conn, outcome: Sealed) -> None:
        """Nothing to keep: the sealed log is the output."""

    def outputs(self, outcome: Sealed) -> list[OutboxMessage]:
        return outcome.messages

    def committed(self, outcome: Sealed) -> None:
        """Nothing sealer-specific to report."""


def keys_needed(events: Sequence[Envelope], erasures: ErasureIndex) -> list[EntityRef]:
    """The data keys that seal ``events``: only for what is not erased, since an erased
    event's fields are never written at all."""
    return [
        ref
        for event in events
        if (keys := event_sealing_keys(event))
        and erasures.covering(erasure_keys_of(event, keys), event.occurred_at) is None
        for ref in keys
    ]


def event_sealing_keys(event: Envelope) -> tuple[EntityRef, ...]:
    """``fields.sealing_keys`` of a validated event."""
    ref = entity_of_event(event.event_type, event.tenant_id, event.entity_id)
    if ref is None:
        return ()
    field = source_field(event.event_type)
    source = None if field is None else getattr(event.payload, field)
    conversation = source.conversation_id if isinstance(source, Source) else None
    return sealing_keys_of_event(ref, event.event_type, conversation)


def _raw_topic(event: Envelope) -> str:
    return (
        MEMORY_EVENTS if event.event_type.startswith("memory.") else CONVERSATION_EVENTS
    ).base_name
