"""Events memproj's own surfaces produce (the CLI, the API): one envelope, with a fresh event
id, validated against the contract before it leaves, so that what is published is never a
dead letter."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from streams.sample import iso, to_message
from topics.envelope import ActorType, Envelope


class InvalidEvent(ValueError):
    """The event would not pass its worker's codec (it would be a dead letter)."""


@dataclass(frozen=True, slots=True)
class OwnEvent:
    event_id: str
    key: bytes
    value: bytes


def build_event(
    model: type[Envelope],
    event_type: str,
    tenant_id: str,
    actor: tuple[ActorType, str],
    now: datetime,
    payload: dict[str, Any],
    event_id: str | None = None,
) -> OwnEvent:
    """The ``event_type`` event of ``actor`` at ``now``, as the message to publish (keyed as
    the contract keys it), checked against ``model``; ``InvalidEvent`` names what is wrong.
    ``event_id``: a fresh one unless given (a producer that must build the same event twice)."""
    event_id = event_id or str(uuid.uuid4())
    event = {
        "event_id": event_id,
        "event_type": event_type,
        "schema_version": 1,
        "tenant_id": tenant_id,
        "occurred_at": iso(now),
        "actor": {"type": actor[0], "id": actor[1]},
        "payload": payload,
    }
    key, value = to_message(event)
    try:
        model.model_validate_json(value)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, error['loc']))}: {error['msg']}"
            for error in exc.errors(include_url=False, include_input=False)[:5]
        )
        raise InvalidEvent(problems) from None
    return OwnEvent(event_id, key, value)
