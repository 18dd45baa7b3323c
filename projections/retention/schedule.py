"""Retention and expiry decisions. Pure: no I/O, no clock.

A conversation's retention period runs from its last message (its start when it has none);
a memory past ``expires_at`` is erased after the grace period. Each erasure the schedule
decides is a ``deletion.requested`` whose ids and time are functions of the target and its due
time alone, so that every replica (and every later round) builds the same event: the ledger's
idempotency drops a second copy.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from projections.deletion.ledger import HeldBy, held_by

TENANT_DEFAULT = "*"
"""The class name under which a tenant configures its default for classes it does not name."""

KEEP = None
"""A period of ``None``: kept, never erased by retention."""

Period = timedelta | None
RetentionReason = Literal["retention", "expired"]
_NAMESPACE = uuid.UUID("5b0c6a8e-2f0c-4c59-9b3e-6d3f0b7a1e42")


@dataclass(frozen=True, slots=True)
class Policy:
    """One tenant's classes (class -> period, ``None`` for keep), its own default (under
    ``TENANT_DEFAULT``), and the deployment's default for a tenant that has none."""

    classes: Mapping[str, Period]
    global_default: Period = KEEP

    def period(self, retention_class: str) -> Period:
        if retention_class in self.classes:
            return self.classes[retention_class]
        return self.classes.get(TENANT_DEFAULT, self.global_default)

    def configured(self, retention_class: str) -> str:
        """The class as a bounded label: its name when the tenant configures it, else
        ``default`` (the conversation got the default period)."""
        return retention_class if retention_class in self.classes else "default"


def released_after(holds: Iterable[HeldBy], due_at: datetime) -> datetime:
    """When an erasure due at ``due_at`` may happen, given holds that are all released: the
    due time, or the latest release of a hold that was in force at or after it."""
    when = due_at
    for hold in holds:
        if hold.released_at is not None and hold.released_at > when:
            when = max(when, hold.released_at)
    return when


@dataclass(frozen=True, slots=True)
class ConversationDue:
    """What the schedule reads of one live conversation."""

    tenant_id: str
    conversation_id: str
    retention_class: str
    started_at: datetime
    last_message_at: datetime | None


@dataclass(frozen=True, slots=True)
class MemoryDue:
    """What the schedule reads of one live memory with an expiry."""

    tenant_id: str
    memory_id: str
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class Issue:
    """One erasure the schedule decided: published as ``deletion.requested``."""

    tenant_id: str
    deletion_id: str
    event_id: str
    reason: RetentionReason
    target_type: Literal["conversation", "memory"]
    target_id: str
    retention_class: str | None
    due_at: datetime
    # The request's occurred_at (its cut-off): the due time, or a hold's release after it.
    requested_at: datetime


def conversation_due_at(conversation: ConversationDue, period: timedelta) -> datetime:
    return (conversation.last_message_at or conversation.started_at) + period


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


def deletion_id_of(
    reason: RetentionReason, tenant_id: str, target_id: str, due_at: datetime
) -> str:
    """The same for every replica and round that decides this target's erasure at this due
    time; a conversation that got a new message has a new due time, so a new id."""
    return f"{reason}-{_digest(tenant_id, target_id, due_at.isoformat())}"


def event_id_of(tenant_id: str, deletion_id: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"{tenant_id}\x00{deletion_id}"))


def plan_conversations(
    conversations: Iterable[ConversationDue],
    policies: Mapping[str, Policy],
    holds: Mapping[tuple[str, str], Sequence[HeldBy]],
    now: datetime,
    global_default: Period = KEEP,
) -> list[Issue]:
    """The retention erasures due by ``now``: conversations past their class's period and
    held by no hold now. ``holds``: per (tenant, conversation), the holds on it or its owner."""
    issues = []
    for conversation in conversations:
        tenant = conversation.tenant_id
        policy = policies.get(tenant, Policy({}, global_default))
        period = policy.period(conversation.retention_class)
        if period is None:
            continue
        due_at = conversation_due_at(conversation, period)
        if due_at > now:
            continue
        windows = holds.get((tenant, conversation.conversation_id), ())
        if held_by(windows, now) is not None:
            continue
        deletion_id = deletion_id_of("retention", tenant, conversation.conversation_id, due_at)
        issues.append(
            Issue(
                tenant_id=tenant,
                deletion_id=deletion_id,
                event_id=event_id_of(tenant, deletion_id),
                reason="retention",
                target_type="conversation",
                target_id=conversation.conversation_id,
                retention_class=conversation.retention_class,
                due_at=due_at,
                requested_at=released_after(windows, due_at),
            )
        )
    return issues


def plan_expiries(
    memories: Iterable[MemoryDue],
    grace: timedelta,
    holds: Mapping[tuple[str, str], Sequence[HeldBy]],
    now: datetime,
) -> list[Issue]:
    """The expiry erasures due by ``now``: memories ``grace`` past ``expires_at``, held by no
    hold now (``holds`` per (tenant, memory): those on its subject or source conversation)."""
    issues = []
    for memory in memories:
        due_at = memory.expires_at + grace
        if due_at > now:
            continue
        windows = holds.get((memory.tenant_id, memory.memory_id), ())
        if held_by(windows, now) is not None:
            continue
        deletion_id = deletion_id_of("expired", memory.tenant_id, memory.memory_id, due_at)
        issues.append(
            Issue(
                tenant_id=memory.tenant_id,
                deletion_id=deletion_id,
                event_id=event_id_of(memory.tenant_id, deletion_id),
                reason="expired",
                target_type="memory",
                target_id=memory.memory_id,
                retention_class=None,
                due_at=due_at,
                requested_at=released_after(windows, due_at),
            )
        )
    return issues


@dataclass(frozen=True, slots=True)
class ClassReceipt:
    """One line of the receipt: a tenant's class, what retention did and has to do."""

    tenant_id: str
    retention_class: str
    period_seconds: float | None
    inside_period: int = 0
    held: int = 0
    due: int = 0
    erased_on_time: int = 0
    erased_late: int = 0
    oldest_overdue_seconds: float = 0.0
