"""A deletion request as memproj's own producers build it: ``memproj delete ...`` and
``POST /v1/deletions``. One builder, so that both publish the same event to
``deletion.requests`` (validated against the contract before it leaves)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from streams.own_events import InvalidEvent, build_event
from streams.sample import iso
from topics.deletion import DeletionRequested
from topics.envelope import ActorType


class InvalidDeletionRequest(ValueError):
    """The request would not pass the deletion worker's codec (it would be a dead letter)."""


@dataclass(frozen=True, slots=True)
class DeletionRequest:
    deletion_id: str
    tenant_id: str
    requested_at: datetime
    key: bytes
    value: bytes


def build_deletion_request(
    tenant_id: str,
    target: dict[str, str],
    reason: str,
    actor: tuple[ActorType, str],
    now: datetime,
    deadline: timedelta | None = None,
    deletion_id: str | None = None,
    *,
    event_id: str | None = None,
    scope: str | None = None,
) -> DeletionRequest:
    """The ``deletion.requested`` event for ``target`` of ``tenant_id`` (a fresh deletion id
    unless one is given), as the message to publish; ``deadline`` from ``now``, else the
    ledger's default (MEMPROJ_DELETION_DEADLINE_SECONDS). ``event_id``: given by a producer
    that must build the same event twice (the retention schedule); ``scope``: ``content`` to
    erase a conversation's content only."""
    deletion_id = deletion_id or f"del-{uuid.uuid4().hex}"
    payload: dict[str, Any] = {"deletion_id": deletion_id, "target": target, "reason": reason}
    if scope is not None:
        payload["scope"] = scope
    if deadline is not None:
        payload["deadline_at"] = iso(now + deadline)
    try:
        event = build_event(
            DeletionRequested, "deletion.requested", tenant_id, actor, now, payload, event_id
        )
    except InvalidEvent as exc:
        raise InvalidDeletionRequest(str(exc)) from None
    return DeletionRequest(deletion_id, tenant_id, now, event.key, event.value)
