"""The conversation reducer: (event, state) -> decision. Pure: no I/O, no clock.

Messages and summaries are redacted here (their personal fields, as the contract marks them),
before they exist anywhere but the raw topic. A summary must cite messages the projection
holds; one that cites an unknown message is refused.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import singledispatch
from typing import Any

from projections.deletion.erasure import (
    NO_ERASURES,
    EntityKey,
    ErasureIndex,
    conversation_content_key,
    conversation_key,
    subject_key,
)
from projections.fold import BatchOutcome, BatchReducer, Covered, fold
from projections.idempotency import EventKey
from projections.redaction import Redactions
from projections.redaction_values import redact_personal
from topics.conversation import (
    ConversationEvent,
    ConversationStarted,
    MessageAdded,
    SummaryUpdated,
)
from topics.envelope import Subject
from topics.outputs import Rejection, RejectionReason

ConversationKey = tuple[str, str]  # (tenant_id, conversation_id)
MessageKey = tuple[str, str, str]  # (tenant_id, conversation_id, message_id)


@dataclass(frozen=True, slots=True)
class ConversationRecord:
    tenant_id: str
    conversation_id: str
    owner_type: str
    owner_id: str
    channel: str
    retention_class: str
    provider_conversation_ref: str | None
    started_at: datetime
    updated_at: datetime
    last_event_id: str
    message_count: int = 0
    summary_version: int = 0
    # Its retention period runs from here (``projections.retention``); None: no message yet.
    last_message_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class MessageRecord:
    tenant_id: str
    conversation_id: str
    message_id: str
    seq: int
    role: str
    content: tuple[dict[str, Any], ...]  # redacted content blocks, as JSON objects
    occurred_at: datetime
    event_id: str
    redactions: dict[str, int]
    owner_type: str
    owner_id: str


@dataclass(frozen=True, slots=True)
class SummaryRecord:
    tenant_id: str
    conversation_id: str
    summary_version: int
    text: str  # redacted
    source_message_ids: tuple[str, ...]
    occurred_at: datetime
    event_id: str
    redactions: dict[str, int]
    owner_type: str
    owner_id: str


@dataclass(frozen=True, slots=True)
class ConversationState:
    records: Mapping[ConversationKey, ConversationRecord]
    # The message ids already stored, among those this batch adds or cites.
    messages: frozenset[MessageKey] = frozenset()
    erasures: ErasureIndex = NO_ERASURES


@dataclass(frozen=True, slots=True)
class Started:
    record: ConversationRecord


@dataclass(frozen=True, slots=True)
class Appended:
    record: ConversationRecord
    message: MessageRecord


@dataclass(frozen=True, slots=True)
class Summarised:
    record: ConversationRecord
    summary: SummaryRecord


@dataclass(frozen=True, slots=True)
class Refused:
    rejection: Rejection


Decision = Started | Appended | Summarised | Refused


def _refuse(
    event: ConversationEvent,
    reason: RejectionReason,
    details: str,
    record: ConversationRecord | None = None,
) -> Refused:
    subject = None
    if record is not None:
        subject = Subject(type=record.owner_type, id=record.owner_id)
    elif isinstance(event, ConversationStarted):
        subject = event.payload.owner
    return Refused(Rejection.of(event, reason, details, subject))


@singledispatch
def evolve(
    event: ConversationEvent, record: ConversationRecord | None, known: AbstractSet[MessageKey]
) -> Decision:
    raise TypeError(f"no reducer for {type(event).__name__}")


@evolve.register
def _started(
    event: ConversationStarted, record: ConversationRecord | None, known: AbstractSet[MessageKey]
) -> Decision:
    if record is not None:
        return _refuse(event, RejectionReason.CONVERSATION_EXISTS, "already started", record)
    payload = event.payload
    return Started(
        ConversationRecord(
            tenant_id=event.tenant_id,
            conversation_id=payload.conversation_id,
            owner_type=payload.owner.type,
            owner_id=payload.owner.id,
            channel=payload.channel,
            retention_class=payload.retention_class,
            provider_conversation_ref=payload.provider_conversation_ref,
            started_at=event.occurred_at,
            updated_at=event.occurred_at,
            last_event_id=event.event_id,
        )
    )


@evolve.register
def _message_added(
    event: MessageAdded, record: ConversationRecord | None, known: AbstractSet[MessageKey]
) -> Decision:
    if record is None:
        return _refuse(event, RejectionReason.UNKNOWN_CONVERSATION, "conversation not started")
    payload = event.payload
    if (event.tenant_id, payload.conversation_id, payload.message_id) in known:
        return _refuse(
            event,
            RejectionReason.MESSAGE_EXISTS,
            f"message {payload.message_id} is already in the conversation",
            record,
        )
    found: Redactions = Counter()
    content = tuple(redact_personal(event, found)["content"])
    updated = replace(
        record,
        message_count=record.message_count + 1,
        updated_at=event.occurred_at,
        last_message_at=max(event.occurred_at, record.last_message_at or event.occurred_at),
        last_event_id=event.event_id,
    )
    return Appended(
        updated,
        MessageRecord(
            tenant_id=event.tenant_id,
            conversation_id=payload.conversation_id,
            message_id=payload.message_id,
            seq=updated.message_count,
            role=payload.role,
            content=content,
            occurred_at=event.occurred_at,
            event_id=event.event_id,
            redactions=dict(found),
            owner_type=record.owner_type,
            owner_id=record.owner_id,
        ),
    )


@evolve.register
def _summary_updated(
    event: SummaryUpdated, record: ConversationRecord | None, known: AbstractSet[MessageKey]
) -> Decision:
    if record is None:
        return _refuse(event, RejectionReason.UNKNOWN_CONVERSATION, "conversation not started")
    payload = event.payload
    if payload.summary_version <= record.summary_version:
        return _refuse(
            event,
            RejectionReason.STALE_SUMMARY,
            f"summary_version {payload.summary_version} is not newer than {record.summary_version}",
            record,
        )
    missing = [
        message_id
        for message_id in payload.source_message_ids
        if (event.tenant_id, payload.conversation_id, message_id) not in known
    ]
    if missing:
        return _refuse(
            event,
            RejectionReason.UNKNOWN_SOURCE_MESSAGE,
            f"cites messages the conversation does not hold: {', '.join(missing)}",
            record,
        )
    found: Redactions = Counter()
    text = redact_personal(event, found)["text"]
    updated = replace(
        record,
        summary_version=payload.summary_version,
        updated_at=event.occurred_at,
        last_event_id=event.event_id,
    )
    return Summarised(
        updated,
        SummaryRecord(
            tenant_id=event.tenant_id,
            conversation_id=payload.conversation_id,
            summary_version=payload.summary_version,
            text=text,
            source_message_ids=payload.source_message_ids,
            occurred_at=event.occurred_at,
            event_id=event.event_id,
            redactions=dict(found),
            owner_type=record.owner_type,
            owner_id=record.owner_id,
        ),
    )


def erasure_keys(
    event: ConversationEvent, record: ConversationRecord | None
) -> Iterator[EntityKey]:
    """The conversation itself (or its content) and its owner: erasing any covers the event."""
    yield conversation_key(event.tenant_id, event.conversation_id)
    yield conversation_content_key(event.tenant_id, event.conversation_id)
    if isinstance(event, ConversationStarted):
        owner = event.payload.owner
        yield subject_key(event.tenant_id, owner.type, owner.id)
    elif record is not None:
        yield subject_key(event.tenant_id, record.owner_type, record.owner_id)


@dataclass(slots=True)
class BatchResult(BatchOutcome):
    records: dict[ConversationKey, ConversationRecord] = field(default_factory=dict)
    messages: list[MessageRecord] = field(default_factory=list)
    summaries: list[SummaryRecord] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)
    redactions: Redactions = field(default_factory=Counter)
    # Filled by the projection's save, in the batch's transaction: the data keys that seal
    # the new messages' records on conversation.messages (its outputs read them from here).
    message_keys: dict[tuple[str, str, str], bytes] = field(default_factory=dict)

    def applied_event_types(self) -> list[str]:
        return self.applied


@dataclass(slots=True)
class _ConversationBatch(BatchReducer[ConversationEvent, ConversationRecord]):
    state: ConversationState
    known: set[MessageKey]
    result: BatchResult

    def current(self, key: ConversationKey) -> ConversationRecord | None:
        return self.result.records.get(key) or self.state.records.get(key)

    def refuse(
        self,
        event: ConversationEvent,
        reason: RejectionReason,
        details: str,
        current: ConversationRecord | None,
    ) -> Rejection:
        return _refuse(event, reason, details, current).rejection

    def covered(
        self, event: ConversationEvent, current: ConversationRecord | None
    ) -> Covered | None:
        """A conversation the deletion did not know yet may have got a data key from the
        sealer since: an erasure covers it whole."""
        erasure = self.state.erasures.covering(erasure_keys(event, current), event.occurred_at)
        return None if erasure is None else Covered(erasure)

    def apply(
        self, event: ConversationEvent, key: ConversationKey, current: ConversationRecord | None
    ) -> Rejection | None:
        decision = evolve(event, current, self.known)
        if isinstance(decision, Refused):
            return decision.rejection
        result = self.result
        result.records[key] = decision.record
        result.applied.append(event.event_type)
        if isinstance(decision, Appended):
            message = decision.message
            self.known.add((message.tenant_id, message.conversation_id, message.message_id))
            result.messages.append(message)
            result.redactions.update(message.redactions)
        elif isinstance(decision, Summarised):
            result.summaries.append(decision.summary)
            result.redactions.update(decision.summary.redactions)
        return None


def reduce_batch(
    events: Iterable[ConversationEvent],
    state: ConversationState,
    seen: Mapping[EventKey, bytes],
) -> BatchResult:
    """Fold ``events`` in order over ``state`` (``projections.fold``)."""
    result = BatchResult()
    fold(events, seen, _ConversationBatch(state, set(state.messages), result), result)
    return result
