"""The deletion ledger as a worker runs it: requests and acknowledgements in, tombstones,
nulls on ``memory.current`` and completion statuses out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

import orjson
from pydantic import ValidationError

from projections.deletion import erasers, guard, lifecycle, store
from projections.deletion import probes as deletion_probes
from projections.deletion.ledger import (
    HeldBy,
    LedgerBatch,
    LedgerEntry,
    LedgerEvent,
    RequestKey,
    RequestState,
    ResolvedTarget,
    reduce_ledger,
    request_key,
)
from projections.embeddings.embedder import Embedder
from projections.idempotency import EventKey
from projections.memory import store as memory_store
from projections.memory.current import current_message, erased_messages, sharing_old_key
from projections.outbox import OutboxMessage
from projections.retention import holds as legal_holds
from projections.sealing.probes import ProbeSealer
from projections.sql import Conn, KeyLookups
from projections.stores import STORES, StoreRegistry
from topics.codec import EventCodec, InvalidMessage, encode
from topics.deletion import Acknowledgement, DeletionRequested
from topics.envelope import EventLike
from topics.messages import InputMessage
from topics.outputs import DeadLetterReason
from topics.registry import (
    DELETION_ACKS,
    DELETION_REJECTIONS,
    DELETION_REQUESTS,
    DELETION_STATUS,
    DELETION_TOMBSTONES,
    MEMORY_CURRENT,
    TopicNames,
    is_key_of,
    output_key,
)
from topics.schemas import SchemaRegistry


class LedgerCodec:
    """Requests are contract events; acknowledgements are memproj's own records, each from
    one of ``stores``."""

    def __init__(
        self,
        schemas: SchemaRegistry,
        topics: TopicNames | None = None,
        stores: StoreRegistry = STORES,
    ) -> None:
        self._requests = EventCodec(schemas, frozenset({"deletion.requested"}))
        self._acks_topic = None if topics is None else topics.name(DELETION_ACKS)
        self._stores = stores.names

    def decode(self, key: bytes | None, value: bytes | None, topic: str | None = None) -> EventLike:
        # The topic decides what a message may be: a forged acknowledgement on the public
        # requests topic must never complete a deletion. Without a topic, the message's own
        # top-level event_type decides (a marker searched for in the raw bytes would also match
        # a request whose reason happens to quote it). Whatever is not an acknowledgement
        # (including invalid JSON) goes to the request decoder, which says what is wrong.
        if topic is not None and self._acks_topic is not None:
            is_ack_topic = topic == self._acks_topic
            if is_ack_topic and value is not None and not _is_acknowledgement(value):
                raise InvalidMessage(
                    DeadLetterReason.UNKNOWN_EVENT_TYPE,
                    f"only deletion.acknowledged belongs on {topic}",
                )
            if not is_ack_topic:
                return self._requests.decode(key, value)
        if value is None or not _is_acknowledgement(value):
            return self._requests.decode(key, value)
        try:
            ack = Acknowledgement.model_validate_json(value)
        except ValidationError as exc:
            raise InvalidMessage(DeadLetterReason.INVALID_EVENT, str(exc)[:500]) from exc
        if ack.store not in self._stores:
            raise InvalidMessage(
                DeadLetterReason.INVALID_EVENT, f"no derived store is named {ack.store!r}"
            )
        if not is_key_of(key, ack.tenant_id, ack.deletion_id):
            expected = output_key(ack.tenant_id, ack.deletion_id).encode()
            raise InvalidMessage(
                DeadLetterReason.KEY_MISMATCH, f"key {key!r} does not match {expected!r}"
            )
        return ack


def _is_acknowledgement(value: bytes) -> bool:
    try:
        raw = orjson.loads(value)
    except orjson.JSONDecodeError:
        return False
    return isinstance(raw, dict) and raw.get("event_type") == "deletion.acknowledged"


class CompletionObserver(Protocol):
    def deletion_completed(self, seconds: float) -> None: ...


@dataclass(frozen=True, slots=True)
class LedgerState:
    states: dict[RequestKey, RequestState]
    resolved: dict[RequestKey, ResolvedTarget]
    holds: dict[RequestKey, list[HeldBy]] = field(default_factory=dict)


class LedgerProjection:
    name = "deletion"
    input_specs = (DELETION_REQUESTS, DELETION_ACKS)
    rejections_spec = DELETION_REJECTIONS
    tracks_event_ids = True
    locks_late = False  # ``load`` takes the tenant locks first

    def __init__(
        self,
        schemas: SchemaRegistry,
        topics: TopicNames,
        embedder: Embedder,
        default_deadline: timedelta,
        observer: CompletionObserver,
        *,
        probes: ProbeSealer,
        lookups: KeyLookups,
        stores: StoreRegistry = STORES,
    ) -> None:
        self.codec = LedgerCodec(schemas, topics, stores)
        self._lookups = lookups
        self._stores = stores
        self._probes = probes
        self._topics = topics
        self._embedder = embedder
        self._default_deadline = default_deadline
        self._observer = observer

    async def prepare_decode(self, conn: Conn, messages: Sequence[InputMessage]) -> None:
        """Requests and acknowledgements carry nothing sealed."""

    async def load(self, conn: Conn, events: Sequence[LedgerEvent]) -> LedgerState:
        requests = [e for e in events if isinstance(e, DeletionRequested)]
        # Exclusive: no projection batch of these tenants runs between resolving the targets
        # and committing the erasure, so nothing written meanwhile escapes it.
        await guard.lock_tenants(conn, (e.tenant_id for e in requests), exclusive=True)
        states = await lifecycle.load_states(conn, (request_key(e) for e in events), self._lookups)
        resolved = {
            request_key(e): await store.resolve(
                conn, e.tenant_id, e.payload.target, content_only=e.payload.scope == "content"
            )
            for e in requests
            if request_key(e) not in states
        }
        held = {
            request_key(e): await legal_holds.on_request(
                conn, e.tenant_id, e.payload.target, resolved[request_key(e)]
            )
            for e in requests
            if request_key(e) in resolved
        }
        return LedgerState(states, resolved, held)

    async def lock(
        self, conn: Conn, events: Sequence[LedgerEvent], state: LedgerState
    ) -> LedgerState:
        """``load`` read under the exclusive tenant locks: ``state`` holds."""
        return state

    def reduce(
        self, events: Sequence[LedgerEvent], state: LedgerState, seen: dict[EventKey, bytes]
    ) -> LedgerBatch:
        return reduce_ledger(
            events,
            state.resolved,
            state.states,
            seen,
            self._default_deadline,
            self._stores.requirements,
            state.holds,
        )

    async def save(self, conn: Conn, outcome: LedgerBatch) -> None:
        await record_and_erase(conn, outcome.entries, self._embedder, self._probes)
        await lifecycle.save_states(conn, [s for s in outcome.states.values() if s.stores])
        # Read after the erasure: a memory it covers is gone, and none of these.
        sharing = {
            other
            for entry in outcome.entries
            for memory_id in entry.resolved.memories
            if (other := sharing_old_key((entry.tenant_id, memory_id))) is not None
        }
        outcome.republished = await memory_store.load_records(conn, sharing, self._lookups)

    def outputs(self, outcome: LedgerBatch) -> list[OutboxMessage]:
        messages = [tombstone_message(self._topics, entry) for entry in outcome.entries]
        current = self._topics.name(MEMORY_CURRENT)
        messages += [
            null
            for entry in outcome.entries
            for memory_id in entry.resolved.memories
            for null in erased_messages(current, (entry.tenant_id, memory_id))
        ]
        messages += [
            current_message(current, key, record) for key, record in outcome.republished.items()
        ]
        messages += [
            OutboxMessage(
                self._topics.name(DELETION_STATUS),
                output_key(state.tenant_id, state.deletion_id).encode(),
                encode(state.status("deletion.completed")),
            )
            for state in outcome.completed
        ]
        return messages

    def committed(self, outcome: LedgerBatch) -> None:
        for state in outcome.completed:
            assert state.completed_at is not None
            self._observer.deletion_completed(
                (state.completed_at - state.requested_at).total_seconds()
            )


async def record_and_erase(
    conn: Conn, entries: Sequence[LedgerEntry], embedder: Embedder, probes: ProbeSealer
) -> None:
    """Record ledger entries and, for erasures, keep probe vectors of the content and erase
    it from the authoritative projections, all in the caller's transaction."""
    await store.record_entries(conn, entries)
    for entry in entries:
        if entry.kind != "erasure":
            continue
        texts = await store.probe_texts(conn, entry)
        if texts:
            vectors = embedder.embed([text for _, _, text in texts])
            await deletion_probes.record_probes(
                conn,
                entry,
                [(t, i, v) for (t, i, _), v in zip(texts, vectors, strict=True)],
                probes,
            )
        await erasers.erase(conn, entry)


def tombstone_message(topics: TopicNames, entry: LedgerEntry) -> OutboxMessage:
    return OutboxMessage(
        topics.name(DELETION_TOMBSTONES),
        output_key(entry.tenant_id, entry.deletion_id).encode(),
        encode(entry.tombstone()),
    )
