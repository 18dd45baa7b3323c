"""The memory reducer: (event, current record) -> decision. Pure: no I/O, no clock.

Every time it needs comes from the events themselves, so replaying the same log always gives
the same projection. ``reduce_batch`` folds a batch over the records it touches and applies
the contract's idempotency rule (an ``event_id`` is applied once; reused with another body, it
is refused as ``duplicate_mismatch``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from functools import singledispatch

from projections.deletion.erasure import (
    NO_ERASURES,
    EntityKey,
    ErasureIndex,
    conversation_key,
    memory_key,
    source_conversation,
    subject_key,
)
from projections.deletion.ledger import LedgerEntry, plan_revocation
from projections.idempotency import (
    DUPLICATE_MISMATCH,
    EventKey,
    IdempotencyCheck,
    ProcessedEvent,
    Seen,
)
from projections.redaction import Redactions, redact_value
from topics.memory import (
    MemoryCorrected,
    MemoryEvent,
    MemoryProposed,
    MemoryRevoked,
    MemoryVerified,
)
from topics.outputs import MemoryRecord, Rejection, RejectionReason

MemoryKey = tuple[str, str]  # (tenant_id, memory_id)


@dataclass(frozen=True, slots=True)
class MemoryVersion:
    """One row of a memory's history: the record as this event left it."""

    record: MemoryRecord
    event_id: str
    event_type: str
    actor_type: str
    actor_id: str


@dataclass(frozen=True, slots=True)
class Applied:
    version: MemoryVersion


@dataclass(frozen=True, slots=True)
class Refused:
    rejection: Rejection


Decision = Applied | Refused


def _refuse(
    event: MemoryEvent,
    reason: RejectionReason,
    details: str,
    current: MemoryRecord | None = None,
) -> Refused:
    subject = current.subject if current is not None else None
    if subject is None and isinstance(event, MemoryProposed):
        subject = event.payload.subject
    return Refused(Rejection.of(event, reason, details, subject))


def _applied(event: MemoryEvent, record: MemoryRecord) -> Applied:
    return Applied(
        MemoryVersion(
            record=record,
            event_id=event.event_id,
            event_type=event.event_type,
            actor_type=event.actor.type,
            actor_id=event.actor.id,
        )
    )


def _check_existing(
    event: MemoryEvent, current: MemoryRecord | None, expected_version: int | None
) -> Refused | MemoryRecord:
    if current is None:
        return _refuse(event, RejectionReason.UNKNOWN_MEMORY, "no such memory")
    if current.status == "revoked":
        return _refuse(
            event, RejectionReason.REVOKED, f"memory was revoked: {current.revoked_reason}"
        )
    if expected_version is not None and expected_version != current.version:
        return _refuse(
            event,
            RejectionReason.VERSION_CONFLICT,
            f"expected_version {expected_version}, current version {current.version}",
            current,
        )
    return current


def _next_version(event: MemoryEvent, current: MemoryRecord, **changes: object) -> MemoryRecord:
    return current.model_copy(
        update={
            "version": current.version + 1,
            "updated_at": event.occurred_at,
            "last_event_id": event.event_id,
            **changes,
        }
    )


@singledispatch
def evolve(event: MemoryEvent, current: MemoryRecord | None) -> Decision:
    raise TypeError(f"no reducer for {type(event).__name__}")


@evolve.register
def _proposed(event: MemoryProposed, current: MemoryRecord | None) -> Decision:
    if current is not None:
        return _refuse(
            event,
            RejectionReason.VERSION_CONFLICT,
            f"memory already exists at version {current.version}",
            current,
        )
    payload = event.payload
    # Validated, not model_construct: pydantic's compiled validator is faster than
    # model_construct's Python loop (2.2 against 5.6 µs), and checks the record too.
    record = MemoryRecord(
        tenant_id=event.tenant_id,
        memory_id=payload.memory_id,
        subject=payload.subject,
        scope=payload.scope,
        kind=payload.kind,
        value=payload.value,
        source=payload.source,
        status="proposed",
        version=1,
        observed_at=payload.observed_at,
        expires_at=payload.expires_at,
        evidence_event_ids=payload.evidence_event_ids,
        created_at=event.occurred_at,
        updated_at=event.occurred_at,
        last_event_id=event.event_id,
    )
    return _applied(event, record)


@evolve.register
def _verified(event: MemoryVerified, current: MemoryRecord | None) -> Decision:
    checked = _check_existing(event, current, event.payload.expected_version)
    if isinstance(checked, Refused):
        return checked
    return _applied(
        event,
        _next_version(
            event,
            checked,
            status="verified",
            verification=event.payload.verification or checked.verification,
        ),
    )


@evolve.register
def _corrected(event: MemoryCorrected, current: MemoryRecord | None) -> Decision:
    checked = _check_existing(event, current, event.payload.expected_version)
    if isinstance(checked, Refused):
        return checked
    payload = event.payload
    # An omitted expires_at keeps the current expiry (a correction never makes a memory
    # permanent by omission); an explicit null removes it; a timestamp replaces it.
    expires_at = payload.expires_at if payload.expiry_given else checked.expires_at
    # A new value needs its own evidence: it is verified only if the correction says how.
    return _applied(
        event,
        _next_version(
            event,
            checked,
            value=payload.value,
            source=payload.source,
            observed_at=payload.observed_at,
            expires_at=expires_at,
            verification=payload.verification,
            status="verified" if payload.verification else "proposed",
        ),
    )


@evolve.register
def _revoked(event: MemoryRevoked, current: MemoryRecord | None) -> Decision:
    checked = _check_existing(event, current, event.payload.expected_version)
    if isinstance(checked, Refused):
        return checked
    return _applied(
        event, _next_version(event, checked, status="revoked", revoked_reason=event.payload.reason)
    )


@dataclass(slots=True)
class BatchResult:
    records: dict[MemoryKey, MemoryRecord] = field(default_factory=dict)
    versions: list[MemoryVersion] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    processed: list[ProcessedEvent] = field(default_factory=list)
    # Events already decided (same event_id, same body): redeliveries, counted and skipped.
    redelivered: int = 0
    # Revocations fan out to the derived stores like deletions do.
    revocations: list[LedgerEntry] = field(default_factory=list)
    # Events whose data key a deletion destroyed, and that no erasure covers: skipped.
    shredded: int = 0
    # Memories refused as erased, by the deletion that covers them: the sealer may have given
    # them a data key (it cannot know every subject an event is about), and the deletion did
    # not know them, so their keys are destroyed with this batch. Only a memory the projection
    # does not hold, or one the erasure covers through its own current record (its memory
    # key, current subject or current source's conversation): a live memory refused only
    # because the event would move its source into an erased conversation keeps its key.
    keys_to_shred: dict[tuple[str, str], str] = field(default_factory=dict)
    # Credentials masked out of memory values before they were stored, by kind.
    redactions: Redactions = field(default_factory=Counter)

    def applied_event_types(self) -> list[str]:
        return [version.event_type for version in self.versions]


def erasure_keys(event: MemoryEvent, current: MemoryRecord | None) -> Iterator[EntityKey]:
    """Everything whose erasure covers this event: the memory, its subject, and the
    conversation its source (or its new source) points into."""
    tenant = event.tenant_id
    yield memory_key(tenant, event.memory_id)
    subject = event.payload.subject if isinstance(event, MemoryProposed) else None
    if subject is None and current is not None:
        subject = current.subject
    if subject is not None:
        yield subject_key(tenant, subject.type, subject.id)
    sources = [current.source] if current is not None else []
    if isinstance(event, MemoryProposed | MemoryCorrected):
        sources.append(event.payload.source)
    for source in sources:
        conversation = source_conversation(source.type, source.ref)
        if conversation is not None:
            yield conversation_key(tenant, conversation)


def current_erasure_keys(record: MemoryRecord) -> Iterator[EntityKey]:
    """Everything whose erasure covers the memory as the projection holds it: the memory, its
    subject and the conversation its current source points into."""
    tenant = record.tenant_id
    yield memory_key(tenant, record.memory_id)
    yield subject_key(tenant, record.subject.type, record.subject.id)
    conversation = source_conversation(record.source.type, record.source.ref)
    if conversation is not None:
        yield conversation_key(tenant, conversation)


def _redacted(event: MemoryEvent, found: Redactions) -> MemoryEvent:
    """The event with its value redacted as conversation content is: a memory value is stored
    and indexed, and a credential in it must not be. The original event (and its hash, for
    idempotency) is what arrived."""
    if not isinstance(event, MemoryProposed | MemoryCorrected):
        return event
    before = found.total()
    value = redact_value(event.payload.value, found)
    if found.total() == before:
        return event
    payload = event.payload.model_copy(update={"value": value})
    return event.model_copy(update={"payload": payload})


def reduce_batch(
    events: Iterable[MemoryEvent],
    records: Mapping[MemoryKey, MemoryRecord],
    seen: Mapping[EventKey, bytes],
    erasures: ErasureIndex = NO_ERASURES,
    revocation_deadline: timedelta = timedelta(hours=1),
) -> BatchResult:
    """Fold ``events`` in order over ``records``; ``seen`` maps processed event ids to hashes
    and ``erasures`` holds the erasures that may cover the batch's events.

    Only the records the batch changed are returned; the inputs are not modified.
    """
    result = BatchResult()
    idempotency = IdempotencyCheck(seen)
    for event in events:
        seen_before = idempotency.check(event)
        if seen_before is Seen.REDELIVERED:
            continue
        key = (event.tenant_id, event.memory_id)
        current = result.records.get(key) or records.get(key)
        if seen_before is Seen.MISMATCH:
            result.rejections.append(
                _refuse(
                    event, RejectionReason.DUPLICATE_MISMATCH, DUPLICATE_MISMATCH, current
                ).rejection
            )
            continue
        erasure = erasures.covering(erasure_keys(event, current), event.occurred_at)
        if erasure is not None:
            # A live memory keeps its data key unless the erasure covers the memory itself;
            # the event is refused as erased either way.
            covering_itself = (
                erasure
                if current is None
                else erasures.covering(current_erasure_keys(current), event.occurred_at)
            )
            if covering_itself is not None:
                result.keys_to_shred[key] = covering_itself.deletion_id
            result.rejections.append(
                _refuse(
                    event,
                    RejectionReason.ERASED,
                    erasure.describe(),
                    current,
                ).rejection
            )
            continue
        if not event.readable:
            result.shredded += 1
            continue
        decision = evolve(_redacted(event, result.redactions), current)
        if isinstance(decision, Refused):
            result.rejections.append(decision.rejection)
            continue
        result.records[key] = decision.version.record
        result.versions.append(decision.version)
        if isinstance(event, MemoryRevoked):
            result.revocations.append(
                plan_revocation(event, decision.version.record, revocation_deadline)
            )
    result.processed = idempotency.processed
    result.redelivered = idempotency.redelivered
    return result
