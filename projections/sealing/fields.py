"""Which fields of which events are personal, and moving them in and out of the seal. Pure.

A sealed event is the validated event (already upcast to its current version) as given, the
fields its producer omitted still omitted, with its personal fields removed from the payload
and replaced by ``payload.sealed``:
``{"entity": "<type>:<id>", "fields": "<base64 AES-GCM of their JSON>"}``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from projections.sealing.crypto import Unreadable, open_fields, seal_fields


class Shredded(Unreadable):
    """The event's data key was destroyed by a deletion: its personal fields are gone."""


# event type -> (entity type, personal payload fields)
PERSONAL_FIELDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "memory.proposed": ("memory", ("value",)),
    "memory.corrected": ("memory", ("value",)),
    "conversation.message_added": ("conversation", ("content",)),
    "conversation.summary_updated": ("conversation", ("text",)),
}
ENTITY_FIELD = {"memory": "memory_id", "conversation": "conversation_id"}
# What stands in for personal fields that can no longer be opened: enough for the event to
# decode (its ids and times still matter), never applied.
PLACEHOLDERS: dict[str, dict[str, Any]] = {
    "memory.proposed": {"value": {}},
    "memory.corrected": {"value": {}},
    "conversation.message_added": {"content": []},
    "conversation.summary_updated": {"text": "[unreadable]"},
}

EntityRef = tuple[str, str, str]  # (tenant_id, entity type, entity id)


def entity_of(event: dict[str, Any]) -> EntityRef | None:
    """The entity whose key seals this event, or None when it carries nothing personal."""
    spec = PERSONAL_FIELDS.get(str(event.get("event_type")))
    if spec is None:
        return None
    payload = event.get("payload")
    tenant_id = event.get("tenant_id")
    entity_id = payload.get(ENTITY_FIELD[spec[0]]) if isinstance(payload, dict) else None
    if not (isinstance(tenant_id, str) and isinstance(entity_id, str)):
        return None  # not an event of the contract: decoding says why, as a dead letter
    return entity_of_event(event["event_type"], tenant_id, entity_id)


def entity_of_event(event_type: str, tenant_id: str, entity_id: str) -> EntityRef | None:
    """``entity_of`` for a validated event, from its identity: no serialising needed."""
    spec = PERSONAL_FIELDS.get(event_type)
    return None if spec is None else (tenant_id, spec[0], entity_id)


def entity_name(ref: EntityRef) -> str:
    return f"{ref[0]}:{ref[1]}:{ref[2]}"


def seal(event: dict[str, Any], data_key: bytes) -> dict[str, Any]:
    ref = entity_of(event)
    if ref is None:
        return event
    _, names = PERSONAL_FIELDS[event["event_type"]]
    payload = dict(event["payload"])
    personal = {name: payload.pop(name) for name in names if name in payload}
    payload["sealed"] = {
        "entity": f"{ref[1]}:{ref[2]}",
        "fields": seal_fields(data_key, personal, event["event_id"]),
    }
    return {**event, "payload": payload}


def seal_erased(event: dict[str, Any]) -> dict[str, Any]:
    """An event about something already erased: its personal fields are dropped, not sealed."""
    ref = entity_of(event)
    if ref is None:
        return event
    _, names = PERSONAL_FIELDS[event["event_type"]]
    payload = {k: v for k, v in event["payload"].items() if k not in names}
    payload["sealed"] = {"entity": f"{ref[1]}:{ref[2]}", "erased": True}
    return {**event, "payload": payload}


def unseal(event: dict[str, Any], key_of: Callable[[EntityRef], bytes | None]) -> dict[str, Any]:
    """The event with its personal fields restored; raises ``Unreadable`` (or ``Shredded``)
    when they cannot be opened."""
    payload = event.get("payload")
    if not isinstance(payload, dict) or "sealed" not in payload:
        return event
    ref = entity_of(event)
    if ref is None:
        return event
    if not isinstance(payload["sealed"], dict):
        raise Unreadable("the sealed fields are not an object")
    if not isinstance(event.get("event_id"), str):
        raise Unreadable("the event_id is not a string")
    if payload["sealed"].get("erased"):
        raise Shredded(f"{entity_name(ref)} was erased before this event was sealed")
    data_key = key_of(ref)
    if data_key is None:
        raise Shredded(f"the key of {entity_name(ref)} no longer exists")
    payload = dict(payload)
    sealed = payload.pop("sealed")
    if not isinstance(sealed.get("fields"), str):
        raise Unreadable("the sealed fields are not a string")
    payload.update(open_fields(data_key, sealed["fields"], event["event_id"]))
    return {**event, "payload": payload}


def with_placeholders(event: dict[str, Any]) -> dict[str, Any]:
    """The sealed event with placeholders for the fields that cannot be opened any more."""
    payload = dict(event["payload"])
    payload.pop("sealed", None)
    payload.update(PLACEHOLDERS.get(str(event.get("event_type")), {}))
    return {**event, "payload": payload}
