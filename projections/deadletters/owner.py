"""The owner of a dead letter (pure): whom its message is about, as far as it can be read.

``owner_of`` reads any input, valid or not: the JSON value's tenant, subject, memory,
conversation and time, and the original key when it can be a contract key. The key store
files each letter's key under its owner, so that the owner's erasure reaches the letter.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from projections.deletion.erasure import (
    EntityKey,
    conversation_key,
    memory_key,
    subject_key,
)
from topics.envelope import source_conversation
from topics.registry import split_output_key

# Contract identifiers are at most 128 characters; anything longer names no owner. An output
# key's tenant id may be escaped to three times its length (contract 1.2).
_ID_MAX_CHARS = 128
_MESSAGE_KEY_MAX_CHARS = 4 * _ID_MAX_CHARS + 1


@dataclass(frozen=True, slots=True)
class LetterOwner:
    """Whom a dead letter is about, as far as its message can be read; None where not."""

    tenant_id: str | None = None
    subject_type: str | None = None
    subject_id: str | None = None
    memory_id: str | None = None
    conversation_id: str | None = None
    # The original key, when it can be a contract key ("<tenant_id>:<entity_id>").
    message_key: str | None = None
    # The event's occurred_at, for the erasure cut-off; None: not readable.
    occurred_at: datetime | None = None

    def erasure_keys(self) -> list[EntityKey]:
        """The erasure index entries that cover this letter: its subject, memory and
        conversation, and the entity its key names (either kind: erasing a letter too many is
        harmless, one too few is not)."""
        keys: list[EntityKey] = []
        tenant = self.tenant_id
        if tenant is not None:
            if self.subject_type is not None and self.subject_id is not None:
                keys.append(subject_key(tenant, self.subject_type, self.subject_id))
            if self.memory_id is not None:
                keys.append(memory_key(tenant, self.memory_id))
            if self.conversation_id is not None:
                keys.append(conversation_key(tenant, self.conversation_id))
        if self.message_key is not None:
            for key_tenant, entity_id in _key_splits(self.message_key):
                keys += [memory_key(key_tenant, entity_id), conversation_key(key_tenant, entity_id)]
        return keys

    def tenant_ids(self) -> set[str]:
        """Every tenant the letter can be of: its own, and each one its key can name."""
        tenants = {tenant for tenant, _ in _key_splits(self.message_key or "")}
        if self.tenant_id is not None:
            tenants.add(self.tenant_id)
        return tenants


def owner_of(key: bytes | None, value: bytes | None) -> LetterOwner:
    """The owner of a message as far as it can be read, from any input: the JSON value's
    tenant, subject (or conversation owner), memory, conversation (or the one a memory's source
    points into) and time, wherever in the envelope or a record they are; the key when it
    can be a contract key. Whatever is missing, of a wrong type or not an identifier is None."""
    message_key = _message_key(key)
    document = _json_object(value)
    places = [document]
    payload = document.get("payload")
    if isinstance(payload, dict):
        places.insert(0, payload)

    def found(name: str) -> Any:
        return next((place[name] for place in places if name in place), None)

    subject_type, subject_id = _pair(found("subject"))
    if subject_id is None:
        subject_type, subject_id = _pair(found("owner"))
    if subject_id is None:
        subject_type, subject_id = _ident(found("owner_type")), _ident(found("owner_id"))
    conversation_id = _ident(found("conversation_id"))
    if conversation_id is None:
        conversation_id = _source_conversation(found("source"))
    tenant_id = _ident(document.get("tenant_id"))
    if tenant_id is None and message_key is not None:
        # Only an unambiguous key names its tenant: with two colons, either part may be it,
        # and an escape reads one way in an input key and another in an output key (the
        # erasure still reaches the letter through every reading of its key).
        splits = _key_splits(message_key)
        tenant_id = splits[0][0] if len(splits) == 1 else None
    return LetterOwner(
        tenant_id=tenant_id,
        subject_type=subject_type if subject_id is not None else None,
        subject_id=subject_id if subject_type is not None else None,
        memory_id=_ident(found("memory_id")),
        conversation_id=conversation_id,
        message_key=message_key,
        occurred_at=_time(document.get("occurred_at")),
    )


def _json_object(value: bytes | None) -> dict[str, Any]:
    if not value:
        return {}
    try:
        document = orjson.loads(value)
    except (orjson.JSONDecodeError, RecursionError):
        return {}
    return document if isinstance(document, dict) else {}


def _ident(value: Any) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= _ID_MAX_CHARS and "\x00" not in value:
        return value
    return None


def _pair(value: Any) -> tuple[str | None, str | None]:
    if not isinstance(value, dict):
        return None, None
    return _ident(value.get("type")), _ident(value.get("id"))


def _source_conversation(value: Any) -> str | None:
    if not isinstance(value, dict):
        return None
    source_type, ref = value.get("type"), value.get("ref")
    if not isinstance(source_type, str) or not isinstance(ref, str) or len(ref) > 512:
        return None
    return _ident(source_conversation(source_type, ref))


def _message_key(key: bytes | None) -> str | None:
    if key is None or len(key) > 4 * _MESSAGE_KEY_MAX_CHARS:
        return None
    try:
        text = key.decode()
    except UnicodeDecodeError:
        return None
    if ":" not in text or len(text) > _MESSAGE_KEY_MAX_CHARS or "\x00" in text:
        return None
    return text


def _key_splits(message_key: str) -> list[tuple[str, str]]:
    """Every (tenant, entity) the key can be: an input key's tenant id may hold a colon
    itself, and an output key (contract 1.2) reads as its escaped tenant id's."""
    candidates = [
        (message_key[:at], message_key[at + 1 :])
        for at, char in enumerate(message_key)
        if char == ":"
    ]
    candidates.append(split_output_key(message_key.encode()))
    splits = []
    for tenant_text, entity_text in candidates:
        tenant, entity = _ident(tenant_text), _ident(entity_text)
        if tenant is not None and entity is not None and (tenant, entity) not in splits:
            splits.append((tenant, entity))
    return splits


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None
