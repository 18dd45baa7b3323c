"""A deletion request as memproj's own producers build it: ``memproj delete ...`` and
``POST /v1/deletions``. One builder, so that both publish the same event to
``deletion.requests`` (validated against the contract before it leaves)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from streams.sample import iso, to_message
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
    event = {
        "event_id": event_id or str(uuid.uuid4()),
        "event_type": "deletion.requested",
        "schema_version": 1,
        "tenant_id": tenant_id,
        "occurred_at": iso(now),
        "actor": {"type": actor[0], "id": actor[1]},
        "payload": payload,
    }
    key, value = to_message(event)
    try:
        DeletionRequested.model_validate_json(value)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, error['loc']))}: {error['msg']}"
            for error in exc.errors(include_url=False, include_input=False)[:5]
        )
        raise InvalidDeletionRequest(problems) from None
    return DeletionRequest(deletion_id, tenant_id, now, key, value)
