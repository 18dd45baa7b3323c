"""Review of held writes as memproj's own surfaces give it: ``memproj review ...`` and the API's
``/v1/reviews``. One diff builder and one ``memory.reviewed`` builder, so that both show the
same material and publish the same event (validated against the contract before it leaves).
The memory worker decides what a review does (``projections/memory/reducer.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from projections.conversation import store as conversation_store
from projections.conversation.reducer import MessageRecord
from projections.memory import store as memory_store
from projections.memory.store import PendingReview
from projections.sql import Conn
from streams.own_events import InvalidEvent, build_event
from topics.api.models import EvidenceMessage, ReviewDiff
from topics.envelope import ActorType
from topics.memory import MemoryReviewed

Decision = Literal["approved", "rejected"]


class InvalidReview(ValueError):
    """The review would not pass the memory worker's codec (it would be a dead letter)."""


@dataclass(frozen=True, slots=True)
class ReviewMessage:
    event_id: str
    tenant_id: str
    memory_id: str
    produced_at: datetime
    key: bytes
    value: bytes


def build_review(
    tenant_id: str,
    memory_id: str,
    version: int,
    decision: Decision,
    note: str | None,
    reviewer: tuple[ActorType, str],
    now: datetime,
) -> ReviewMessage:
    """The ``memory.reviewed`` event of ``reviewer`` deciding on ``version`` of the memory, as
    the message to publish on memory.events (keyed ``tenant_id:memory_id``)."""
    payload: dict[str, Any] = {
        "memory_id": memory_id,
        "reviewed_version": version,
        "decision": decision,
    }
    if note:
        payload["note"] = note
    try:
        event = build_event(MemoryReviewed, "memory.reviewed", tenant_id, reviewer, now, payload)
    except InvalidEvent as exc:
        raise InvalidReview(str(exc)) from None
    return ReviewMessage(event.event_id, tenant_id, memory_id, now, event.key, event.value)


def _evidence_message(message: MessageRecord) -> EvidenceMessage:
    return EvidenceMessage(
        event_id=message.event_id,
        conversation_id=message.conversation_id,
        message_id=message.message_id,
        role=message.role,
        content=list(message.content),
        occurred_at=message.occurred_at,
        redactions=message.redactions,
    )


def diff_of(pending: PendingReview, messages: list[MessageRecord]) -> ReviewDiff:
    """The reviewer's compact diff of one held version and the cited messages found."""
    held = pending.held.record
    cited = set(held.evidence_event_ids)
    return ReviewDiff(
        memory_id=held.memory_id,
        version=held.version,
        kind=held.kind,
        scope=held.scope,
        subject={"type": held.subject.type, "id": held.subject.id},
        proposed_value=held.value,
        event_type=pending.held.event_type,
        proposed_by={"type": pending.held.actor_type, "id": pending.held.actor_id},
        proposed_at=pending.held.occurred_at,
        source={"type": held.source.type, "ref": held.source.ref},
        expires_at=held.expires_at,
        verification=held.verification,
        served=pending.served,
        review_rule=pending.held.review_rule,
        policy_version=pending.held.policy_version,
        evidence_event_ids=list(held.evidence_event_ids),
        evidence=[_evidence_message(m) for m in messages if m.event_id in cited],
    )


async def pending_diffs(
    conn: Conn, tenant_id: str, limit: int = 100, memory_id: str | None = None
) -> list[ReviewDiff]:
    """The tenant's held versions as reviewers' diffs, oldest first (of one memory, if named)."""
    pending = await memory_store.pending_reviews(conn, tenant_id, limit, memory_id)
    cited = {e for p in pending for e in p.held.record.evidence_event_ids}
    messages = await conversation_store.messages_by_event_id(conn, tenant_id, cited)
    return [diff_of(p, messages) for p in pending]


async def pending_diff(conn: Conn, tenant_id: str, memory_id: str) -> ReviewDiff | None:
    """The diff of the memory's held version, or None when nothing of it awaits review."""
    found = await pending_diffs(conn, tenant_id, 1, memory_id)
    return found[0] if found else None
