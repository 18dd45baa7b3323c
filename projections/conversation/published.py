"""The records the conversation projection publishes on ``conversation.messages``. Pure.

A record is one projected (redacted) message. Its identity stays readable (tenant,
conversation, message, ``seq``, ``role``, owner, ``occurred_at``, ``event_id``): the
embeddings worker needs it to judge the record against the projection and the erasure index
before opening anything. Its personal fields (``content`` and the ``redactions`` counts, which
say what kinds of secrets the message held) are sealed with the conversation's data key, the
key the sealed log uses for that conversation:
``"sealed": {"entity": "conversation:<id>", "fields": "<base64 AES-GCM of their JSON>"}``.
When an erasure shreds that key, every copy of the message on the topic (and in its DLQ, and
in any backup) becomes unreadable, although the topic keeps its records for 30 days.

The associated data of the seal is every readable field of the record (canonical JSON, with
the topic's name): a record whose ids, owner or time were edited does not open. Records
written before the topic was sealed carry ``content`` and ``redactions`` in plaintext and are
read as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import orjson

from projections.conversation.reducer import MessageRecord
from projections.sealing.crypto import Unreadable, open_fields, seal_fields
from projections.sealing.fields import EntityRef, Shredded, entity_name

TOPIC = "conversation.messages"
SEALED_FIELDS = ("content", "redactions")
ENTITY_TYPE = "conversation"


@dataclass(frozen=True, slots=True)
class PublishedMessage:
    """A record of ``conversation.messages`` as read: ``content`` is None while it is sealed."""

    tenant_id: str
    conversation_id: str
    message_id: str
    owner: tuple[str, str]  # (owner_type, owner_id)
    occurred_at: datetime
    event_id: str
    content: tuple[dict[str, Any], ...] | None
    sealed: str | None = None  # the base64 ciphertext of the personal fields
    associated: str = ""  # what the seal is bound to (see ``_associated``)

    @property
    def entity(self) -> EntityRef:
        """The data key that seals it: the conversation's."""
        return (self.tenant_id, ENTITY_TYPE, self.conversation_id)

    def opened(self, data_key: bytes | None) -> PublishedMessage:
        """The record with its content readable; ``Shredded`` when the conversation's key no
        longer exists (an erasure destroyed it), ``Unreadable`` when the seal does not open
        (another key, or an edited record)."""
        if self.sealed is None:
            return self
        if data_key is None:
            raise Shredded(f"the key of {entity_name(self.entity)} no longer exists")
        fields = open_fields(data_key, self.sealed, self.associated)
        try:
            content = _blocks(fields.get("content"))
        except TypeError as exc:
            raise Unreadable(str(exc)) from exc
        return replace(self, content=content, sealed=None)


def entity_of_message(message: MessageRecord) -> EntityRef:
    """The data key that seals a message's record: its conversation's."""
    return (message.tenant_id, ENTITY_TYPE, message.conversation_id)


def encode_record(message: MessageRecord, data_key: bytes) -> bytes:
    """The record of ``message``, its personal fields sealed with ``data_key``."""
    readable: dict[str, Any] = {
        "tenant_id": message.tenant_id,
        "conversation_id": message.conversation_id,
        "message_id": message.message_id,
        "seq": message.seq,
        "role": message.role,
        "occurred_at": message.occurred_at.isoformat(),
        "event_id": message.event_id,
        "owner_type": message.owner_type,
        "owner_id": message.owner_id,
    }
    personal = {"content": list(message.content), "redactions": message.redactions}
    sealed = {
        "entity": f"{ENTITY_TYPE}:{message.conversation_id}",
        "fields": seal_fields(data_key, personal, _associated(readable)),
    }
    return orjson.dumps({**readable, "sealed": sealed})


def parse_record(value: bytes) -> PublishedMessage:
    """A record as read, sealed or (written before sealing) plaintext. Raises ``ValueError``,
    ``KeyError`` or ``TypeError`` when it is not a record of this topic."""
    data = orjson.loads(value)
    if not isinstance(data, dict):
        raise TypeError("a conversation.messages record is a JSON object")
    sealed = data.get("sealed")
    if sealed is None:
        content: tuple[dict[str, Any], ...] | None = _blocks(data["content"])
        fields, associated = None, ""
    else:
        if not (isinstance(sealed, dict) and isinstance(sealed.get("fields"), str)):
            raise TypeError("the sealed fields are not an object with a string of fields")
        readable = {name: part for name, part in data.items() if name != "sealed"}
        content, fields, associated = None, sealed["fields"], _associated(readable)
    occurred_at = datetime.fromisoformat(_text(data, "occurred_at"))
    if occurred_at.tzinfo is None:
        raise ValueError("occurred_at has no time zone")
    return PublishedMessage(
        tenant_id=_text(data, "tenant_id"),
        conversation_id=_text(data, "conversation_id"),
        message_id=_text(data, "message_id"),
        owner=(_text(data, "owner_type"), _text(data, "owner_id")),
        occurred_at=occurred_at,
        event_id=_text(data, "event_id"),
        content=content,
        sealed=fields,
        associated=associated,
    )


def _blocks(content: Any) -> tuple[dict[str, Any], ...]:
    if not (isinstance(content, list) and all(isinstance(block, dict) for block in content)):
        raise TypeError("the content is not a list of blocks")
    return tuple(content)


def _text(data: dict[str, Any], name: str) -> str:
    value = data[name]
    if not isinstance(value, str):
        raise TypeError(f"{name} is not a string")
    return value


def _associated(readable: dict[str, Any]) -> str:
    """Every readable field of the record, as canonical JSON under the topic's name: one text
    for one record, whatever its ids hold (no separator to confuse)."""
    return orjson.dumps([TOPIC, readable], option=orjson.OPT_SORT_KEYS).decode()
