"""What the embeddings store does with an index update. Pure: no I/O, no clock.

An update (a record on ``memory.current``, a message on ``conversation.messages``) is indexed
only when the authoritative projection still holds it at that version and no erasure covers
it. An update about something erased at or after the time it happened is refused as
``erased``: an index update that reaches the store after the tombstone never brings the
vector back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from projections.deletion.erasure import (
    EntityKey,
    Erasure,
    ErasureIndex,
    conversation_content_key,
    conversation_key,
    memory_key,
    subject_key,
)
from projections.embeddings.embedder import Embedder, memory_text, message_text
from projections.embeddings.vectors import (
    Match,
    VectorEntry,
    memory_entry_id,
    message_entry_id,
)
from topics.envelope import Subject
from topics.outputs import ELIGIBLE_STATUSES, MemoryRecord, Rejection, RejectionReason

MessageKey = tuple[str, str, str]  # (tenant_id, conversation_id, message_id)


@dataclass(frozen=True, slots=True)
class MemoryUpdate:
    tenant_id: str
    memory_id: str
    record: MemoryRecord | None  # None: the memory is gone (a null on memory.current)


@dataclass(frozen=True, slots=True)
class MessageUpdate:
    tenant_id: str
    conversation_id: str
    message_id: str
    owner: tuple[str, str]
    content: tuple[dict[str, Any], ...]
    occurred_at: datetime
    event_id: str


IndexUpdate = MemoryUpdate | MessageUpdate


@dataclass(frozen=True, slots=True)
class Authoritative:
    """What the authoritative projections hold for the updates of one batch."""

    memories: Mapping[tuple[str, str], tuple[int, str]]  # (tenant, memory) -> (version, status)
    messages: AbstractSet[MessageKey]
    erasures: ErasureIndex


@dataclass(slots=True)
class IndexPlan:
    upserts: dict[str, VectorEntry] = field(default_factory=dict)
    removals: list[Match] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    stale: int = 0


def erasure_keys(update: IndexUpdate) -> list[EntityKey]:
    if isinstance(update, MessageUpdate):
        return [
            conversation_key(update.tenant_id, update.conversation_id),
            conversation_content_key(update.tenant_id, update.conversation_id),
            subject_key(update.tenant_id, *update.owner),
        ]
    keys = [memory_key(update.tenant_id, update.memory_id)]
    record = update.record
    if record is not None:
        keys.append(subject_key(update.tenant_id, record.subject.type, record.subject.id))
        conversation = record.source.conversation_id
        if conversation is not None:
            keys.append(conversation_key(update.tenant_id, conversation))
    return keys


def plan_index(
    updates: Iterable[IndexUpdate], held: Authoritative, embedder: Embedder
) -> IndexPlan:
    plan = IndexPlan()
    pending: list[tuple[VectorEntry, str]] = []
    for update in updates:
        if isinstance(update, MemoryUpdate):
            _plan_memory(update, held, plan, pending)
        else:
            _plan_message(update, held, plan, pending)
    vectors = embedder.embed([text for _, text in pending])
    for (entry, _), vector in zip(pending, vectors, strict=True):
        if entry.id in plan.upserts:
            plan.upserts[entry.id] = _with_vector(entry, vector)
    return plan


def _refused(update: IndexUpdate, plan: IndexPlan, erasure: Erasure) -> None:
    if isinstance(update, MemoryUpdate):
        record = update.record
        assert record is not None
        event_id, entity_id, event_type = record.last_event_id, update.memory_id, "memory.current"
        occurred_at, subject = record.updated_at, record.subject
    else:
        event_id, entity_id = update.event_id, update.conversation_id
        event_type, occurred_at = "conversation.messages", update.occurred_at
        subject = Subject(type=update.owner[0], id=update.owner[1])
    plan.rejections.append(
        Rejection(
            event_id=event_id,
            reason=RejectionReason.ERASED,
            details=f"index update refused: {erasure.describe()}",
            tenant_id=update.tenant_id,
            entity_id=entity_id,
            event_type=event_type,
            occurred_at=occurred_at,
            subject=subject,
        )
    )


def _plan_memory(
    update: MemoryUpdate,
    held: Authoritative,
    plan: IndexPlan,
    pending: list[tuple[VectorEntry, str]],
) -> None:
    entry_id = memory_entry_id(update.tenant_id, update.memory_id)
    removal = Match(tenant_id=update.tenant_id, memory_ids=(update.memory_id,))
    record = update.record
    if record is None:
        plan.upserts.pop(entry_id, None)
        plan.removals.append(removal)
        return
    erasure = held.erasures.covering(erasure_keys(update), record.updated_at)
    if erasure is not None:
        _refused(update, plan, erasure)
        plan.upserts.pop(entry_id, None)
        plan.removals.append(removal)
        return
    current = held.memories.get((update.tenant_id, update.memory_id))
    servable = current is not None and current[1] in ELIGIBLE_STATUSES
    if not servable or current is None or current[0] != record.version:
        # Not (or no longer) what the projection holds: a later update, a revocation, a
        # status no read serves or an erasure decides this entry, not this one.
        plan.stale += 1
        if not servable:
            plan.upserts.pop(entry_id, None)
            plan.removals.append(removal)
        return
    entry = VectorEntry(
        id=entry_id,
        kind="memory",
        tenant_id=record.tenant_id,
        subject_type=record.subject.type,
        subject_id=record.subject.id,
        memory_id=record.memory_id,
        conversation_id=record.source.conversation_id,
        message_id=None,
        source_type=record.source.type,
        source_ref=record.source.ref,
        text=memory_text(record.value, record.kind),
        version=record.version,
        occurred_at=record.updated_at,
        vector=(),
        memory_kind=record.kind,
        scope=record.scope,
    )
    plan.upserts[entry_id] = entry
    pending.append((entry, entry.text))


def _plan_message(
    update: MessageUpdate,
    held: Authoritative,
    plan: IndexPlan,
    pending: list[tuple[VectorEntry, str]],
) -> None:
    entry_id = message_entry_id(update.tenant_id, update.conversation_id, update.message_id)
    erasure = held.erasures.covering(erasure_keys(update), update.occurred_at)
    if erasure is not None:
        _refused(update, plan, erasure)
        plan.upserts.pop(entry_id, None)
        plan.removals.append(Match(tenant_id=update.tenant_id, entry_ids=(entry_id,)))
        return
    if (update.tenant_id, update.conversation_id, update.message_id) not in held.messages:
        plan.stale += 1
        return
    text = message_text(update.content)
    entry = VectorEntry(
        id=entry_id,
        kind="message",
        tenant_id=update.tenant_id,
        subject_type=update.owner[0],
        subject_id=update.owner[1],
        memory_id=None,
        conversation_id=update.conversation_id,
        message_id=update.message_id,
        source_type="message",
        source_ref=f"{update.conversation_id}/{update.message_id}",
        text=text,
        version=1,
        occurred_at=update.occurred_at,
        vector=(),
        memory_kind=None,
        scope=None,
    )
    plan.upserts[entry_id] = entry
    pending.append((entry, text))


def _with_vector(entry: VectorEntry, vector: list[float]) -> VectorEntry:
    return replace(entry, vector=tuple(vector))
