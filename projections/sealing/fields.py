"""Moving the personal fields of an event in and out of the seal. Pure.

Which fields of which event types are personal, the entity whose key seals them, what stands
in for them once they cannot be opened, and which value says where it was taken from: all
read from the marks on the contract's models (``topics.personal``), never listed here.

A sealed event is the validated event (already upcast to its current version) as given, the
fields its producer omitted still omitted, with its personal fields removed from the payload
and replaced by ``payload.sealed``:
``{"v": 2, "entity": "<type>:<id>", "fields": "<base64 AES-GCM of their JSON>"}``.

The associated data of formats 2 and 3 is the whole sealed event but the ciphertext
(``sealed_event_associated``): editing anything of a sealed event (its tenant, subject, times,
event type, schema version, ids, source, other payload fields) makes its fields fail to open,
and it is dead-lettered as ``unreadable_seal``. Events sealed before format 2 carry no ``v``:
they still open, with the event id alone as associated data, so only moving their ciphertext to
another event is detected, not an edit of their other fields.

Which keys seal an event (``sealing_keys``): the entity's data key, and for personal fields
whose event names a ``Source`` pointing into a conversation (a memory's proposal or correction:
its value was taken from there), that conversation's key too, combined (format 3). A memory's
versions taken from different conversations are then each readable only while both their
memory and their conversation are: erasing the conversation (or the subject who owns it)
shreds its key, and every version taken from it closes, while the memory's other versions, and
its own key, stay as they are. Format 2 events are sealed under the entity's key alone (every
event of an entity with one key, and every event sealed before format 3).

Format 4 (what the sealer writes now for such a value) combines the memory's key with the
conversation's **source key** (entity type ``conversation_source``), not with the key of the
conversation's own content: a retention erasure, which erases a conversation's content and
leaves the memories taken from it, shreds the content key alone, and those memories' values
still open on the sealed log (a rebuild keeps them). A full erasure of the conversation (or of
its owner) shreds both keys. Format 3 events are still read, under the content key.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from projections.sealing.crypto import Unreadable, derive_key, open_fields, seal_fields
from topics.envelope import source_conversation
from topics.personal import PERSONAL_EVENTS


class Shredded(Unreadable):
    """The event's data key was destroyed by a deletion: its personal fields are gone."""


EntityRef = tuple[str, str, str]  # (tenant_id, entity type, entity id)

# ``payload.sealed.v`` of what the sealer writes now: 2 under one key, 3 under two; events
# without ``v`` are format 1.
SEAL_FORMAT = 2
SEAL_FORMAT_SOURCED = 3
SEAL_FORMAT_SOURCE_KEY = 4
# The entity type of a conversation's source key: it seals (with the memory's key) the values
# taken from the conversation, and outlives the erasure of the conversation's content alone.
SOURCE_KEY_ENTITY = "conversation_source"
# What combines a memory's key and its source conversation's key into the key of a value, per
# the conversation key's entity type (format 3: the content key; format 4: the source key).
_SOURCED_PURPOSES = {
    "conversation": b"memproj/sealed-fields/memory-value-from-conversation/v3",
    SOURCE_KEY_ENTITY: b"memproj/sealed-fields/memory-value-from-conversation-source/v4",
}


def entity_of(event: dict[str, Any]) -> EntityRef | None:
    """The entity whose key seals this event, or None when it carries nothing personal."""
    spec = PERSONAL_EVENTS.get(str(event.get("event_type")))
    if spec is None:
        return None
    payload = event.get("payload")
    tenant_id = event.get("tenant_id")
    entity_id = payload.get(spec.entity_field) if isinstance(payload, dict) else None
    if not (isinstance(tenant_id, str) and isinstance(entity_id, str)):
        return None  # not an event of the contract: decoding says why, as a dead letter
    return entity_of_event(event["event_type"], tenant_id, entity_id)


def entity_of_event(event_type: str, tenant_id: str, entity_id: str) -> EntityRef | None:
    """``entity_of`` for a validated event, from its identity: no serialising needed."""
    spec = PERSONAL_EVENTS.get(event_type)
    return None if spec is None else (tenant_id, spec.entity_type, entity_id)


def source_field(event_type: str) -> str | None:
    """The payload field (a ``Source``) saying where this event type's personal value was
    taken from; None when it says nothing of it, or carries nothing personal."""
    spec = PERSONAL_EVENTS.get(event_type)
    return None if spec is None else spec.source_field


def sealing_keys(event: dict[str, Any]) -> tuple[EntityRef, ...]:
    """The data keys whose combination seals this event's personal fields (none when it
    carries nothing personal): its entity's, then, for a memory value whose source points into
    a conversation, that conversation's: its content key for an event sealed in format 3, its
    source key otherwise."""
    ref = entity_of(event)
    if ref is None:
        return ()
    field = source_field(event["event_type"])
    source = None if field is None else event["payload"].get(field)
    if not isinstance(source, dict):
        return (ref,)
    source_type, source_ref = source.get("type"), source.get("ref")
    if not (isinstance(source_type, str) and isinstance(source_ref, str)):
        return (ref,)  # not an event of the contract: decoding says why
    sealed = event["payload"].get("sealed")
    format_3 = isinstance(sealed, dict) and sealed.get("v") == SEAL_FORMAT_SOURCED
    return sealing_keys_of_event(
        ref,
        event["event_type"],
        source_conversation(source_type, source_ref),
        "conversation" if format_3 else SOURCE_KEY_ENTITY,
    )


def sealing_keys_of_event(
    ref: EntityRef,
    event_type: str,
    conversation_id: str | None,
    conversation_key: str = SOURCE_KEY_ENTITY,
) -> tuple[EntityRef, ...]:
    """``sealing_keys`` from an event's identity and the conversation its source points into
    (``conversation_key``: which of the conversation's keys)."""
    if source_field(event_type) is None or conversation_id is None:
        return (ref,)
    return (ref, (ref[0], conversation_key, conversation_id))


def combined_key(refs: Sequence[EntityRef], key_of: Callable[[EntityRef], bytes | None]) -> bytes:
    """The key that seals fields under every key of ``refs``: one key as it is, two derived
    together, so that destroying either closes the fields. Raises ``Shredded`` when one of the
    keys no longer exists."""
    keys = []
    for ref in refs:
        data_key = key_of(ref)
        if data_key is None:
            raise Shredded(f"the key of {entity_name(ref)} no longer exists")
        keys.append(data_key)
    if len(keys) == 1:
        return keys[0]
    return derive_key(b"".join(keys), _SOURCED_PURPOSES[refs[1][1]])


def entity_name(ref: EntityRef) -> str:
    return f"{ref[0]}:{ref[1]}:{ref[2]}"


def seal(
    event: dict[str, Any], keys: bytes | Callable[[EntityRef], bytes | None]
) -> dict[str, Any]:
    """``event`` with its personal fields sealed under the keys of ``sealing_keys``: each given
    by ``keys``, or ``keys`` itself for each."""
    refs = sealing_keys(event)
    if not refs:
        return event
    ref = refs[0]
    key_of = keys if callable(keys) else lambda _ref: keys
    data_key = combined_key(refs, key_of)
    names = PERSONAL_EVENTS[event["event_type"]].names
    payload = dict(event["payload"])
    personal = {name: payload.pop(name) for name in names if name in payload}
    version = SEAL_FORMAT if len(refs) == 1 else SEAL_FORMAT_SOURCE_KEY
    marker = {"v": version, "entity": f"{ref[1]}:{ref[2]}"}
    payload["sealed"] = marker
    sealed = {**event, "payload": payload}
    # ``sealed_event_associated(sealed)``, without its copies: there are no fields to leave
    # out yet: the same bytes, which the readers rebuild (tests/projections/test_sealing.py).
    associated = orjson.dumps(sealed, option=orjson.OPT_SORT_KEYS)
    marker["fields"] = seal_fields(data_key, personal, associated)
    return sealed


def sealed_event_associated(event: dict[str, Any]) -> bytes:
    """Format 2's associated data: the sealed event without its ciphertext, as JSON with
    sorted keys. JSON parsed back from the sealer's bytes gives the same bytes again (orjson
    writes the shortest float that reads back as the same float, and one spelling of each
    string), so the reader rebuilds exactly what the sealer bound."""
    payload = dict(event["payload"])
    payload["sealed"] = {k: v for k, v in payload["sealed"].items() if k != "fields"}
    return orjson.dumps({**event, "payload": payload}, option=orjson.OPT_SORT_KEYS)


def _associated(event: dict[str, Any], sealed: dict[str, Any]) -> bytes:
    version = sealed.get("v")
    if version is None:
        # Format 1 (sealed before format 2): bound to the event id only.
        return str(event["event_id"]).encode()
    if (
        version in (SEAL_FORMAT, SEAL_FORMAT_SOURCED, SEAL_FORMAT_SOURCE_KEY)
        and type(version) is int
    ):
        return sealed_event_associated(event)
    raise Unreadable(f"unknown seal format {version!r}")


def seal_erased(event: dict[str, Any]) -> dict[str, Any]:
    """An event about something already erased: its personal fields are dropped, not sealed."""
    ref = entity_of(event)
    if ref is None:
        return event
    names = PERSONAL_EVENTS[event["event_type"]].names
    payload = {k: v for k, v in event["payload"].items() if k not in names}
    payload["sealed"] = {"entity": f"{ref[1]}:{ref[2]}", "erased": True}
    return {**event, "payload": payload}


def unseal(event: dict[str, Any], key_of: Callable[[EntityRef], bytes | None]) -> dict[str, Any]:
    """The event with its personal fields restored; raises ``Unreadable`` (or ``Shredded``)
    when they cannot be opened.

    Only the sealer writes the sealed log, and it seals every event with personal fields and
    no other: a seal on an event type without personal fields (an edited event type) and
    personal fields in plaintext are both refused as unreadable, never applied."""
    payload = event.get("payload")
    if not isinstance(payload, dict):
        return event  # decoding says why, as a dead letter
    event_type = str(event.get("event_type"))
    personal = PERSONAL_EVENTS.get(event_type)
    if "sealed" not in payload:
        # A field the sealer once wrote in plaintext is read as it is; any other is refused.
        plaintext = personal is not None and any(
            name in payload and name not in personal.legacy_plaintext for name in personal.names
        )
        if plaintext:
            raise Unreadable("personal fields in plaintext: not written by the sealer")
        return event
    if personal is None:
        raise Unreadable(f"a seal on {str(event.get('event_type'))[:100]!r}, which has none")
    ref = entity_of(event)
    if ref is None:
        return event  # ids of the wrong type: decoding says why, as a dead letter
    if not isinstance(payload["sealed"], dict):
        raise Unreadable("the sealed fields are not an object")
    if not isinstance(event.get("event_id"), str):
        raise Unreadable("the event_id is not a string")
    if payload["sealed"].get("erased"):
        raise Shredded(f"{entity_name(ref)} was erased before this event was sealed")
    sealed = payload["sealed"]
    # Formats 3 and 4 are sealed under the keys ``sealing_keys`` names; every earlier format
    # under the entity's key alone.
    sourced = sealed.get("v") in (SEAL_FORMAT_SOURCED, SEAL_FORMAT_SOURCE_KEY)
    refs = sealing_keys(event) if sourced else (ref,)
    if len(refs) != (2 if sourced else 1):
        raise Unreadable("a sourced seal on an event whose value has no conversation source")
    data_key = combined_key(refs, key_of)
    if not isinstance(sealed.get("fields"), str):
        raise Unreadable("the sealed fields are not a string")
    opened = open_fields(data_key, sealed["fields"], _associated(event, sealed))
    if not opened.keys() <= set(personal.names):
        raise Unreadable("the sealed fields are not this event type's personal fields")
    payload = {k: v for k, v in payload.items() if k != "sealed"}
    payload.update(opened)
    return {**event, "payload": payload}


def with_placeholders(event: dict[str, Any]) -> dict[str, Any]:
    """The sealed event with placeholders for the fields that cannot be opened any more."""
    payload = dict(event["payload"])
    payload.pop("sealed", None)
    spec = PERSONAL_EVENTS.get(str(event.get("event_type")))
    if spec is not None:
        payload.update(copy.deepcopy(dict(spec.placeholders)))
    return {**event, "payload": payload}
