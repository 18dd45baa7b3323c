"""The deletion ledger's reducer. Pure: no I/O, no clock.

A deletion request (or a memory revocation) becomes a ledger entry: the items it covers, the
erasure index rows that keep them from coming back, the stores that must acknowledge it, its
deadline, and the tombstone every store receives. Acknowledgements then move each store's
state until every required store is done.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Literal

from projections.deletion.erasure import (
    EntityKey,
    conversation_content_key,
    conversation_key,
    memory_key,
    subject_key,
)
from projections.fold import BatchOutcome, BatchReducer, fold
from projections.idempotency import EventKey
from topics.deletion import (
    Acknowledgement,
    DeletionRequested,
    DeletionStatus,
    DeletionTarget,
    StoreName,
    StoreState,
    TargetType,
    Tombstone,
    TombstoneItem,
)
from topics.memory import MemoryRevoked
from topics.outputs import MemoryRecord, Rejection, RejectionReason

RequestKey = tuple[str, str]  # (tenant_id, deletion_id)


# Per deletion target, the derived stores that must acknowledge its deletion: those that hold
# copies of it (a memory has no summary or context view of its own). Plain data, taken from
# the store registry by the caller (``projections.stores.StoreRegistry.requirements``).
RequiredStores = Mapping[TargetType, tuple[StoreName, ...]]


@dataclass(frozen=True, slots=True)
class ResolvedTarget:
    """Everything a target covers, as found in the authoritative projections."""

    memories: tuple[str, ...] = ()
    conversations: tuple[str, ...] = ()
    messages: tuple[tuple[str, str], ...] = ()  # (conversation_id, message_id)
    summaries: tuple[tuple[str, int], ...] = ()  # (conversation_id, summary_version)
    contexts: tuple[str, ...] = ()

    def items(self) -> tuple[TombstoneItem, ...]:
        return (
            *(TombstoneItem(type="memory", id=m) for m in self.memories),
            *(TombstoneItem(type="conversation", id=c) for c in self.conversations),
            *(TombstoneItem(type="message", id=m, conversation_id=c) for c, m in self.messages),
            *(
                TombstoneItem(type="summary", id=str(v), conversation_id=c)
                for c, v in self.summaries
            ),
            *(TombstoneItem(type="context", id=c, conversation_id=c) for c in self.contexts),
        )


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    tenant_id: str
    deletion_id: str
    kind: str  # "erasure" or "revocation"
    target: DeletionTarget
    reason: str
    cut_off: datetime
    deadline_at: datetime
    required_stores: tuple[StoreName, ...]
    request_event_id: str
    resolved: ResolvedTarget
    # The erasure index rows; empty for a revocation, which removes derived copies only.
    erased: tuple[EntityKey, ...] = ()
    # "content": a conversation's content only, the memories taken from it are kept.
    scope: Literal["all", "content"] = "all"

    def tombstone(self) -> Tombstone:
        return Tombstone(
            deletion_id=self.deletion_id,
            tenant_id=self.tenant_id,
            kind="erasure" if self.kind == "erasure" else "revocation",
            target=self.target,
            items=self.resolved.items(),
            issued_at=self.cut_off,
            cut_off=self.cut_off,
            deadline_at=self.deadline_at,
            required_stores=self.required_stores,
            scope=self.scope,
        )


def plan_erasure(
    event: DeletionRequested,
    resolved: ResolvedTarget,
    default_deadline: timedelta,
    stores: RequiredStores,
) -> LedgerEntry:
    payload = event.payload
    target = payload.target
    tenant = event.tenant_id
    scope: Literal["all", "content"] = "content" if payload.scope == "content" else "all"
    # A content erasure has an index entry of its own: it covers the conversation's rows,
    # not the memories whose source points into it (``coverage``).
    of_conversation = conversation_content_key if scope == "content" else conversation_key
    erased: list[EntityKey] = [memory_key(tenant, m) for m in resolved.memories]
    erased += [of_conversation(tenant, c) for c in resolved.conversations]
    if target.type == "subject" and target.subject_type is not None:
        erased.append(subject_key(tenant, target.subject_type, target.id))
    elif target.type == "conversation":
        erased.append(of_conversation(tenant, target.id))
    else:
        erased.append(memory_key(tenant, target.id))
    return LedgerEntry(
        tenant_id=tenant,
        deletion_id=payload.deletion_id,
        kind="erasure",
        target=target,
        reason=payload.reason,
        cut_off=event.occurred_at,
        deadline_at=payload.deadline_at or event.occurred_at + default_deadline,
        required_stores=stores.get(target.type, ()),
        request_event_id=event.event_id,
        resolved=resolved,
        erased=tuple(dict.fromkeys(erased)),
        scope=scope,
    )


def revocation_id(tenant_id: str, event_id: str) -> str:
    digest = hashlib.sha256(f"{tenant_id}\x00{event_id}".encode()).hexdigest()[:32]
    return f"revocation-{digest}"


def plan_revocation(
    event: MemoryRevoked,
    record: MemoryRecord,
    default_deadline: timedelta,
    stores: RequiredStores,
) -> LedgerEntry:
    """A revoked memory leaves every derived store the way a deletion does; its authoritative
    row and history stay (further events on it are refused as ``revoked``). The revocation's
    own reason is free text from its producer: it stays with the memory's row and sealed on
    the sealed log, never in the ledger, which outlives an erasure."""
    return LedgerEntry(
        tenant_id=event.tenant_id,
        deletion_id=revocation_id(event.tenant_id, event.event_id),
        kind="revocation",
        target=DeletionTarget(type="memory", id=record.memory_id),
        reason="revoked",
        cut_off=event.occurred_at,
        deadline_at=event.occurred_at + default_deadline,
        required_stores=stores.get("memory", ()),
        request_event_id=event.event_id,
        resolved=ResolvedTarget(memories=(record.memory_id,)),
    )


@dataclass(frozen=True, slots=True)
class RequestState:
    tenant_id: str
    deletion_id: str
    kind: str
    target: DeletionTarget
    requested_at: datetime
    completed_at: datetime | None
    stores: Mapping[str, StoreState]

    @property
    def completed(self) -> bool:
        return self.completed_at is not None

    def status(
        self, event_type: Literal["deletion.completed", "deletion.overdue", "deletion.purged"]
    ) -> DeletionStatus:
        return DeletionStatus(
            event_type=event_type,
            deletion_id=self.deletion_id,
            tenant_id=self.tenant_id,
            kind="erasure" if self.kind == "erasure" else "revocation",
            target=self.target,
            requested_at=self.requested_at,
            stores=dict(self.stores),
            completed_at=self.completed_at,
        )


def apply_ack(ack: Acknowledgement, state: RequestState) -> RequestState:
    """A store's acknowledgement. Idempotent: a store that is done stays done, whatever is
    acknowledged again; the request completes when every required store is done."""
    current = state.stores.get(ack.store)
    if current is None or current.status == "done":
        return state
    if ack.status == "done":
        updated = current.model_copy(
            update={
                "status": "done",
                "acked_at": ack.acked_at,
                "removed_count": ack.removed_count,
                "attempts": current.attempts + 1,
                "error": None,
            }
        )
    else:
        updated = current.model_copy(
            update={"status": "failed", "attempts": current.attempts + 1, "error": ack.error}
        )
    stores = {**state.stores, ack.store: updated}
    completed_at = state.completed_at
    if completed_at is None and all(s.status == "done" for s in stores.values()):
        completed_at = max(s.acked_at for s in stores.values() if s.acked_at is not None)
    return replace(state, stores=stores, completed_at=completed_at)


LedgerEvent = DeletionRequested | Acknowledgement


@dataclass(slots=True)
class LedgerBatch(BatchOutcome):
    """What one batch of requests and acknowledgements decided."""

    entries: list[LedgerEntry] = field(default_factory=list)
    states: dict[RequestKey, RequestState] = field(default_factory=dict)
    completed: list[RequestState] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)
    # The current records of memories whose output key a null of this batch also hits: a key
    # written before 1.2 that is theirs too (``projections.memory.current``), published again.
    republished: dict[tuple[str, str], MemoryRecord] = field(default_factory=dict)

    def applied_event_types(self) -> list[str]:
        return self.applied


@dataclass(slots=True)
class _LedgerFold(BatchReducer[LedgerEvent, RequestState]):
    resolved: Mapping[RequestKey, ResolvedTarget]
    states: Mapping[RequestKey, RequestState]
    default_deadline: timedelta
    stores: RequiredStores
    holds: Mapping[RequestKey, Sequence[HeldBy]]
    batch: LedgerBatch

    def current(self, key: RequestKey) -> RequestState | None:
        return self.batch.states.get(key) or self.states.get(key)

    def refuse(
        self,
        event: LedgerEvent,
        reason: RejectionReason,
        details: str,
        current: RequestState | None,
    ) -> Rejection:
        return Rejection.of(event, reason, details)

    def apply(
        self, event: LedgerEvent, key: RequestKey, current: RequestState | None
    ) -> Rejection | None:
        batch = self.batch
        if isinstance(event, DeletionRequested):
            if current is not None:
                return Rejection.of(
                    event, RejectionReason.DELETION_EXISTS, "deletion_id already requested"
                )
            hold = held_by(self.holds.get(key, ()), event.occurred_at)
            if hold is not None:
                # Recorded as decided: a rebuild refuses it again from the same holds.
                batch.applied.append(event.event_type)
                return Rejection.of(
                    event, RejectionReason.LEGAL_HOLD, f"refused: {hold.description} is in force"
                )
            entry = plan_erasure(event, self.resolved[key], self.default_deadline, self.stores)
            batch.entries.append(entry)
            batch.states[key] = initial_state(entry)
        else:
            if current is None:
                return Rejection.of(event, RejectionReason.UNKNOWN_DELETION, "no such request")
            updated = apply_ack(event, current)
            batch.states[key] = updated
            if updated.completed and not current.completed:
                batch.completed.append(updated)
        batch.applied.append(event.event_type)
        return None


def reduce_ledger(
    events: Iterable[LedgerEvent],
    resolved: Mapping[RequestKey, ResolvedTarget],
    states: Mapping[RequestKey, RequestState],
    seen: Mapping[EventKey, bytes],
    default_deadline: timedelta,
    stores: RequiredStores,
    holds: Mapping[RequestKey, Sequence[HeldBy]] | None = None,
) -> LedgerBatch:
    """Fold requests and acknowledgements in order (``projections.fold``). ``holds``: per
    request, the legal holds on what it would erase (in force or released): a request that
    occurred while one was in force is refused, and recorded as refused (``legal_hold``),
    whenever the ledger decides it again."""
    batch = LedgerBatch()
    ledger = _LedgerFold(resolved, states, default_deadline, stores, holds or {}, batch)
    fold(events, seen, ledger, batch)
    return batch


@dataclass(frozen=True, slots=True)
class HeldBy:
    """A legal hold as the ledger weighs it: its time, and how a refusal names it."""

    held_at: datetime
    released_at: datetime | None
    description: str

    def holds_at(self, when: datetime) -> bool:
        return self.held_at <= when and (self.released_at is None or when < self.released_at)


def held_by(holds: Iterable[HeldBy], when: datetime) -> HeldBy | None:
    """The hold in force at ``when`` (the earliest placed), if any."""
    active = [hold for hold in holds if hold.holds_at(when)]
    return min(active, key=lambda hold: (hold.held_at, hold.description)) if active else None


def initial_state(entry: LedgerEntry) -> RequestState:
    return RequestState(
        tenant_id=entry.tenant_id,
        deletion_id=entry.deletion_id,
        kind=entry.kind,
        target=entry.target,
        requested_at=entry.cut_off,
        completed_at=None,
        stores={
            store: StoreState(status="pending", deadline_at=entry.deadline_at)
            for store in entry.required_stores
        },
    )


def request_key(event: LedgerEvent) -> RequestKey:
    return (event.tenant_id, event.entity_id)
