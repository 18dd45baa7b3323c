"""The memory projection as a worker runs it: reducer, store and the messages it publishes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta

from projections.admission import store as admission_store
from projections.admission.policy import AdmissionObserver, Policy
from projections.deletion import guard as erasure_guard
from projections.deletion import store as deletion_store
from projections.deletion.erasure import ErasureIndex
from projections.deletion.ledger import RequiredStores
from projections.deletion.projection import tombstone_message
from projections.idempotency import EventKey
from projections.memory import store
from projections.memory.current import current_message
from projections.memory.evolve import MemoryKey, PolicyKey
from projections.memory.reducer import BatchResult, erasure_keys, reduce_batch
from projections.outbox import OutboxMessage
from projections.redaction import RedactionObserver
from projections.sealing.codec import SealedCodec
from projections.sealing.keys import KeyStore, shred_refused
from projections.sql import Conn, KeyLookups
from topics.codec import EventCodec
from topics.memory import MemoryEvent
from topics.messages import InputMessage
from topics.outputs import MemoryRecord
from topics.registry import (
    MEMORY_CURRENT,
    MEMORY_REJECTIONS,
    MEMORY_SEALED,
    TopicNames,
    TopicSpec,
)
from topics.schemas import SchemaRegistry


@dataclass(frozen=True, slots=True)
class MemoryState:
    records: Mapping[MemoryKey, MemoryRecord]
    erasures: ErasureIndex
    # What was read of the erasure index, for ``MemoryProjection.lock``'s re-check.
    read: erasure_guard.ErasuresRead = field(default_factory=erasure_guard.ErasuresRead)
    # The held or rejected heads above ``records`` (served versions).
    heads: Mapping[MemoryKey, MemoryRecord] = field(default_factory=dict)
    # The admission policies the events' stamps name.
    policies: Mapping[PolicyKey, Policy] = field(default_factory=dict)


class PolicyCache:
    """Admission policies by (tenant, version): immutable once stored, so kept once read."""

    def __init__(self, lookups: KeyLookups, limit: int = 10_000) -> None:
        self._lookups = lookups
        self._known: dict[PolicyKey, Policy] = {}
        self._limit = limit

    async def policies(self, conn: Conn, events: Sequence[MemoryEvent]) -> dict[PolicyKey, Policy]:
        wanted = {
            (e.tenant_id, e.admission.policy_version)
            for e in events
            if e.admission is not None and e.admission.policy_version
        }
        missing = wanted - self._known.keys()
        if missing:
            if len(self._known) > self._limit:
                self._known.clear()
            self._known.update(await admission_store.load_policies(conn, missing, self._lookups))
        return {key: self._known[key] for key in wanted if key in self._known}


class MemoryProjection:
    name = "memory"
    input_specs: tuple[TopicSpec, ...] = (MEMORY_SEALED,)
    rejections_spec = MEMORY_REJECTIONS
    tracks_event_ids = True

    def __init__(
        self,
        schemas: SchemaRegistry,
        topics: TopicNames,
        max_value_bytes: int,
        revocation_deadline: timedelta,
        keys: KeyStore,
        observer: RedactionObserver | None = None,
        stores: RequiredStores | None = None,
        admissions: AdmissionObserver | None = None,
    ) -> None:
        accepted = frozenset(t for t in schemas.event_types() if t.startswith("memory."))
        self.codec = SealedCodec(EventCodec(schemas, accepted, {"value": max_value_bytes}), keys)
        self._topics = topics
        self._current_topic = topics.name(MEMORY_CURRENT)
        self._revocation_deadline = revocation_deadline
        self._observer = observer
        self._stores = stores
        self._policies = PolicyCache(keys.lookups)
        self._admissions = admissions
        # How every store looks up a batch's keys: as the key store, built with the setting.
        self.lookups = keys.lookups

    async def prepare_decode(self, conn: Conn, messages: Sequence[InputMessage]) -> None:
        await self.codec.load_keys(conn, (m.value for m in messages))

    # The batch's state is read without the tenant locks; ``lock`` takes them before anything
    # is written and re-reads the erasures (see ``streams.runner``).
    locks_late = True

    async def load(self, conn: Conn, events: Sequence[MemoryEvent]) -> MemoryState:
        """The batch's state, read without the tenant locks: ``lock`` tells whether it still
        holds once they are taken."""
        keys = ((e.tenant_id, e.memory_id) for e in events)
        records = await store.load_records(conn, keys, self.lookups)
        heads = await store.load_heads(conn, records, self.lookups)
        return await self.state_of(conn, events, records, heads)

    async def lock(
        self, conn: Conn, events: Sequence[MemoryEvent], state: MemoryState
    ) -> MemoryState:
        """Take the shared tenant locks: a deletion of these tenants either committed before
        this point or waits until this batch commits. ``state`` if no erasure of its keys was
        recorded since it was read; else the state read again, under the locks.

        Every row an erasure removes that this batch reads (its memories' records) or writes
        (records, versions, revocations, rejections) is about a memory whose erasure key is
        recorded with it (the ledger records each erased memory's key, beside its subject's or
        conversation's), and those keys are among the ones ``state`` was read for."""
        await erasure_guard.lock_tenants(conn, (e.tenant_id for e in events), exclusive=False)
        if not await erasure_guard.erasures_changed(conn, state.read, self.lookups):
            # The stamps may name a policy version set since the state was read.
            policies = await self._policies.policies(conn, events)
            return state if policies == state.policies else replace(state, policies=policies)
        return await self.load(conn, events)

    async def state_of(
        self,
        conn: Conn,
        events: Sequence[MemoryEvent],
        records: Mapping[MemoryKey, MemoryRecord],
        heads: Mapping[MemoryKey, MemoryRecord],
    ) -> MemoryState:
        """The state of a batch whose current records are known (``records``; a rebuild holds
        them in memory): the erasures that may cover its events, read in its transaction
        (a rebuild's after its tenant locks)."""
        keys = [
            key for event in events for key in erasure_keys(event, _head(event, records, heads))
        ]
        read = await erasure_guard.read_erasures(conn, keys, self.lookups)
        policies = await self._policies.policies(conn, events)
        return MemoryState(records, read.index, read, heads, policies)

    def reduce(
        self, events: Sequence[MemoryEvent], state: MemoryState, seen: dict[EventKey, bytes]
    ) -> BatchResult:
        return reduce_batch(
            events,
            state.records,
            seen,
            state.erasures,
            self._revocation_deadline,
            self._stores,
            state.heads,
            state.policies,
        )

    async def save(self, conn: Conn, outcome: BatchResult) -> None:
        await store.save_batch(conn, outcome)
        await self.save_effects(conn, outcome)

    async def save_effects(self, conn: Conn, outcome: BatchResult) -> None:
        """What a batch writes beside the projection's own tables (a rebuild writes those
        its own way, and these the same way)."""
        # Revocations are recorded in the ledger with this batch: the tombstone is then
        # published at least once, through the outbox, like every other output.
        await deletion_store.record_entries(conn, outcome.revocations)
        await shred_refused(conn, "memory", outcome.keys_to_shred)

    def outputs(self, outcome: BatchResult) -> list[OutboxMessage]:
        """``memory.current`` gets each changed record once, as the batch left it; a memory no
        read path may serve (revoked, or its content erased) gets a null value (compaction
        removes what was there)."""
        return [
            current_message(self._current_topic, key, record)
            for key, record in outcome.records.items()
        ] + [tombstone_message(self._topics, entry) for entry in outcome.revocations]

    def committed(self, outcome: BatchResult) -> None:
        if self._observer is not None:
            for kind, count in outcome.redactions.items():
                self._observer.redacted(kind, count)
        if self._admissions is not None:
            for (decision, cause), count in outcome.admissions.items():
                self._admissions.admitted(decision, cause, count)
            for rule, count in outcome.instruction_matches.items():
                self._admissions.instruction_matched(rule, count)


def _head(
    event: MemoryEvent,
    records: Mapping[MemoryKey, MemoryRecord],
    heads: Mapping[MemoryKey, MemoryRecord],
) -> MemoryRecord | None:
    key = (event.tenant_id, event.memory_id)
    return heads.get(key) or records.get(key)
