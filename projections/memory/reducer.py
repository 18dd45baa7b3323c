"""The memory reducer: a batch of events folded over the records it touches. Pure: no I/O, no
clock. Each event is decided by ``projections.memory.evolve`` (event + head -> decision).

Every time it needs comes from the events themselves, so replaying the same log always gives
the same projection. ``reduce_batch`` folds a batch over the records it touches and applies
the contract's idempotency rule (an ``event_id`` is applied once; reused with another body, it
is refused as ``duplicate_mismatch``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta

from projections.admission.policy import Policy
from projections.deletion.erasure import (
    NO_ERASURES,
    EntityKey,
    ErasureIndex,
    conversation_key,
    memory_key,
    subject_key,
)
from projections.deletion.ledger import LedgerEntry, RequiredStores, plan_revocation
from projections.fold import BatchOutcome, BatchReducer, Covered, fold
from projections.idempotency import EventKey
from projections.memory.evolve import (
    HELD_STATUSES,
    Applied,
    Decision,
    MemoryKey,
    MemoryVersion,
    PolicyKey,
    Refused,
    admission_of,
    evolve,
    refuse,
)
from projections.redaction import Redactions
from projections.redaction_values import redact_personal
from projections.stores import STORES
from topics.memory import (
    MemoryCorrected,
    MemoryEvent,
    MemoryProposed,
    MemoryRevoked,
)
from topics.outputs import MemoryRecord, Rejection, RejectionReason


@dataclass(slots=True)
class BatchResult(BatchOutcome):
    # The memories' served views (the rows of ``memories``): the served version, or the head
    # when none is served (see ``heads``).
    records: dict[MemoryKey, MemoryRecord] = field(default_factory=dict)
    # Per memory in ``records``, its head when that is not its row: a version held for review,
    # or rejected, above a version still served. None: the row is the head.
    heads: dict[MemoryKey, MemoryRecord | None] = field(default_factory=dict)
    versions: list[MemoryVersion] = field(default_factory=list)
    # Revocations fan out to the derived stores like deletions do.
    revocations: list[LedgerEntry] = field(default_factory=list)
    # Credentials masked out of memory values before they were stored, by kind.
    redactions: Redactions = field(default_factory=Counter)
    # Admission decisions of proposals and corrections, by (decision, what decided), and the
    # instruction rules their values matched.
    admissions: Counter[tuple[str, str]] = field(default_factory=Counter)
    instruction_matches: Counter[str] = field(default_factory=Counter)

    def place(self, key: MemoryKey, head: MemoryRecord, served: MemoryRecord | None) -> None:
        """Record ``head`` as the memory's latest version: its row unless it is held or
        rejected above a served version (``served``), which then stays the row."""
        if head.status in HELD_STATUSES and served is not None and served.servable:
            self.records[key] = served
            self.heads[key] = head
        else:
            self.records[key] = head
            self.heads[key] = None

    def applied_event_types(self) -> list[str]:
        return [version.event_type for version in self.versions]


def _count(result: BatchResult, decision: Decision) -> None:
    verdict = decision.verdict if isinstance(decision, Applied) else None
    if verdict is None and isinstance(decision, Refused):
        reason = decision.rejection.reason
        if reason in _ADMISSION_REASONS:
            result.admissions["refuse", _ADMISSION_REASONS[reason]] += 1
        return
    if verdict is None or verdict.cause == "no_policy":
        return
    result.admissions[verdict.decision, verdict.cause] += 1
    result.instruction_matches.update(verdict.instructions)


# Refusals by the admission decision, by what decided (the reducer keeps no verdict of them).
_ADMISSION_REASONS = {
    RejectionReason.KIND_NOT_ADMITTED: "rule",
    RejectionReason.EVIDENCE_UNAVAILABLE: "evidence",
    RejectionReason.DERIVED_EVIDENCE: "evidence",
    RejectionReason.INVALID_GRANT: "shape",
}


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


NO_HEADS: Mapping[MemoryKey, MemoryRecord] = {}
NO_POLICIES: Mapping[PolicyKey, Policy] = {}


@dataclass(slots=True)
class _MemoryBatch(BatchReducer[MemoryEvent, MemoryRecord]):
    records: Mapping[MemoryKey, MemoryRecord]
    heads: Mapping[MemoryKey, MemoryRecord]
    erasures: ErasureIndex
    policies: Mapping[PolicyKey, Policy]
    revocation_deadline: timedelta
    stores: RequiredStores
    result: BatchResult

    def _served(self, key: MemoryKey) -> MemoryRecord | None:
        if key in self.result.records:
            return self.result.records[key]
        return self.records.get(key)

    def current(self, key: MemoryKey) -> MemoryRecord | None:
        """The memory's head: as this batch left it, else as loaded (a held or rejected head
        above its served version, or that version)."""
        served = self._served(key)
        if key in self.result.records:
            return self.result.heads.get(key) or served
        return self.heads.get(key) or served

    def refuse(
        self,
        event: MemoryEvent,
        reason: RejectionReason,
        details: str,
        current: MemoryRecord | None,
    ) -> Rejection:
        return refuse(event, reason, details, current).rejection

    def covered(self, event: MemoryEvent, current: MemoryRecord | None) -> Covered | None:
        """An erasure of the memory itself (its id or its subject) covers it whole: its data
        key goes too. One of only the conversation the version is taken from covers its
        content: that value was sealed under the conversation's key too, now destroyed, and
        the memory keeps its own key."""
        whole = self.erasures.covering(memory_erasure_keys(event, current), event.occurred_at)
        if whole is not None:
            return Covered(whole)
        source_key = source_erasure_key(event, current)
        taken_from_erased = (
            None if source_key is None else self.erasures.covering([source_key], event.occurred_at)
        )
        return None if taken_from_erased is None else Covered(taken_from_erased, whole=False)

    def keep_erased(self, event: MemoryEvent, key: MemoryKey, current: MemoryRecord | None) -> None:
        """The version keeps its place in the history without its content, so that a later
        correction from elsewhere applies, live and in a rebuild alike."""
        decision = evolve(event, current, admission_of(event, self.policies))
        if isinstance(decision, Applied):
            self.result.place(key, _erased_version(decision.version), None)

    def apply(
        self, event: MemoryEvent, key: MemoryKey, current: MemoryRecord | None
    ) -> Rejection | None:
        served = self._served(key)
        admission = replace(admission_of(event, self.policies), served=served)
        decision = evolve(_redacted(event, self.result.redactions), current, admission)
        _count(self.result, decision)
        if isinstance(decision, Refused):
            return decision.rejection
        self.result.place(key, decision.version.record, served)
        self.result.versions.append(decision.version)
        if isinstance(event, MemoryRevoked):
            self.result.revocations.append(
                plan_revocation(
                    event, decision.version.record, self.revocation_deadline, self.stores
                )
            )
        return None


def reduce_batch(
    events: Iterable[MemoryEvent],
    records: Mapping[MemoryKey, MemoryRecord],
    seen: Mapping[EventKey, bytes],
    erasures: ErasureIndex = NO_ERASURES,
    revocation_deadline: timedelta = timedelta(hours=1),
    stores: RequiredStores | None = None,
    heads: Mapping[MemoryKey, MemoryRecord] = NO_HEADS,
    policies: Mapping[PolicyKey, Policy] = NO_POLICIES,
) -> BatchResult:
    """Fold ``events`` in order over ``records`` (the memories' rows: served versions) and
    ``heads`` (the held or rejected heads above them); ``seen`` maps processed event ids to
    hashes and ``erasures`` holds the erasures that may cover the batch's events. Each event
    is decided under the policy of its stamp's version (``policies``). A revocation waits for
    ``stores`` (by default memproj's derived stores).

    Only the records the batch changed are returned; the inputs are not modified.
    """
    result = BatchResult()
    required = STORES.requirements if stores is None else stores
    fold(
        events,
        seen,
        _MemoryBatch(records, heads, erasures, policies, revocation_deadline, required, result),
        result,
    )
    return result
