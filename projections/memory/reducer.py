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
    subject_key,
)
from projections.deletion.ledger import LedgerEntry, RequiredStores, plan_revocation
from projections.idempotency import (
    DUPLICATE_MISMATCH,
    EventKey,
    IdempotencyCheck,
    ProcessedEvent,
    Seen,
)
from projections.redaction import Redactions, redact_personal
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
        # Not the revocation's reason: free text, and rejections outlive an erasure.
        return _refuse(event, RejectionReason.REVOKED, "memory was revoked")
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
    # not know them, so their keys are destroyed with this batch. Only when the erasure covers
    # the memory itself (its id or its subject): a version taken from an erased conversation
    # is closed by that conversation's key, and the memory keeps its own.
    keys_to_shred: dict[tuple[str, str], str] = field(default_factory=dict)
    # Credentials masked out of memory values before they were stored, by kind.
    redactions: Redactions = field(default_factory=Counter)

    def applied_event_types(self) -> list[str]:
        return [version.event_type for version in self.versions]


def erasure_keys(event: MemoryEvent, current: MemoryRecord | None) -> Iterator[EntityKey]:
    """Everything whose erasure may cover this event: the memory and its subject
    (``memory_erasure_keys``), and the conversation its source, or the memory's current source,
    points into (``source_erasure_key``)."""
    yield from memory_erasure_keys(event, current)
    sources = [current.source] if current is not None else []
    if isinstance(event, MemoryProposed | MemoryCorrected):
        sources.append(event.payload.source)
    for source in sources:
        conversation = source.conversation_id
        if conversation is not None:
            yield conversation_key(event.tenant_id, conversation)


def memory_erasure_keys(event: MemoryEvent, current: MemoryRecord | None) -> Iterator[EntityKey]:
    """What an erasure of the whole memory names: the memory itself, or its subject."""
    tenant = event.tenant_id
    yield memory_key(tenant, event.memory_id)
    subject = event.payload.subject if isinstance(event, MemoryProposed) else None
    if subject is None and current is not None:
        subject = current.subject
    if subject is not None:
        yield subject_key(tenant, subject.type, subject.id)


def source_erasure_key(event: MemoryEvent, current: MemoryRecord | None) -> EntityKey | None:
    """The conversation the version this event makes is taken from: the event's own source
    (a proposal or a correction), else the memory's current one."""
    if isinstance(event, MemoryProposed | MemoryCorrected):
        source = event.payload.source
    elif current is not None:
        source = current.source
    else:
        return None
    conversation = source.conversation_id
    return None if conversation is None else conversation_key(event.tenant_id, conversation)


def _erased_version(version: MemoryVersion) -> MemoryRecord:
    """A version whose content an erasure covered: its place in the memory's history (version,
    times, source, subject) without its value, never served (status ``erased``)."""
    return version.record.model_copy(
        update={"status": "erased", "value": {}, "revoked_reason": None, "verification": None}
    )


def _redacted(event: MemoryEvent, found: Redactions) -> MemoryEvent:
    """The event with its personal fields redacted (``redact_personal``) as conversation
    content is: a memory's value is stored and indexed, a revocation's reason stored, and a
    credential in either must not be. The original event (and its hash, for idempotency) is
    what arrived."""
    before = found.total()
    fields = redact_personal(event, found)
    if found.total() == before:
        return event
    payload = event.payload.model_copy(update=fields)
    return event.model_copy(update={"payload": payload})


def reduce_batch(
    events: Iterable[MemoryEvent],
    records: Mapping[MemoryKey, MemoryRecord],
    seen: Mapping[EventKey, bytes],
    erasures: ErasureIndex = NO_ERASURES,
    revocation_deadline: timedelta = timedelta(hours=1),
    stores: RequiredStores | None = None,
) -> BatchResult:
    """Fold ``events`` in order over ``records``; ``seen`` maps processed event ids to hashes
    and ``erasures`` holds the erasures that may cover the batch's events. A revocation waits
    for ``stores`` (by default memproj's derived stores).

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
        whole = erasures.covering(memory_erasure_keys(event, current), event.occurred_at)
        if whole is not None:
            # The erasure covers the memory itself: its data key goes too (the sealer may have
            # made one for this event, not knowing every subject an event is about).
            result.keys_to_shred[key] = whole.deletion_id
            result.rejections.append(
                _refuse(event, RejectionReason.ERASED, whole.describe(), current).rejection
            )
            continue
        source_key = source_erasure_key(event, current)
        taken_from_erased = (
            None if source_key is None else erasures.covering([source_key], event.occurred_at)
        )
        if taken_from_erased is not None:
            # The version's content came from an erased conversation, the memory is not erased:
            # the version keeps its place in the history without its content (so that a later
            # correction from elsewhere applies, live and in a rebuild alike) and is refused as
            # erased. Its value was sealed under that conversation's key too, now destroyed.
            decision = evolve(event, current)
            if isinstance(decision, Applied):
                result.records[key] = _erased_version(decision.version)
            result.rejections.append(
                _refuse(
                    event, RejectionReason.ERASED, taken_from_erased.describe(), current
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
                plan_revocation(event, decision.version.record, revocation_deadline, stores)
            )
    result.processed = idempotency.processed
    result.redelivered = idempotency.redelivered
    return result
