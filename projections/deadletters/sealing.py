"""Sealing dead letters (pure): each letter's original under a data key of its own.

A letter's original (its value, key and the error's detail) is sealed with AES-256-GCM under
a fresh data key, bound to where its message was read (``Position``); the data key is wrapped
by a key derived from the newest master key and kept in the letter's key row (``LetterKey``),
which expires at the end of the DLQ retention (``DEAD_LETTER_RETENTION``).
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import orjson

from projections.deadletters.owner import LetterOwner, owner_of
from projections.outbox import OutboxMessage
from projections.sealing.crypto import (
    DEFAULT_MASTER_KEY_ID,
    KeyWrapping,
    MasterKeys,
    Unreadable,
    as_master_keys,
    encode_associated,
    new_data_key,
    open_bytes,
    seal_bytes,
)
from topics.outputs import KEY_MAX_CHARS, ORIGINAL_MAX_BYTES, SealedOriginal
from topics.registry import DEAD_LETTER_RETENTION_MS

LETTER_FORMAT = "memproj.dlq.aes256gcm.1"
DEAD_LETTER_RETENTION = timedelta(milliseconds=DEAD_LETTER_RETENTION_MS)


@dataclass(frozen=True, slots=True)
class LetterKey:
    """The key row of one dead letter: its data key wrapped, its owner and its expiry."""

    key_id: str
    wrapped_key: bytes
    topic: str
    partition: int
    offset: int
    owner: LetterOwner
    failed_at: datetime
    expires_at: datetime
    master_key_id: str = DEFAULT_MASTER_KEY_ID


@dataclass(frozen=True, slots=True)
class Opened:
    """What a letter's seal holds."""

    value: bytes
    key: bytes | None
    detail: str


@dataclass(frozen=True, slots=True)
class Position:
    """Where the message of a letter was read: bound to the seal, so that a sealed original
    cannot be moved to another letter."""

    topic: str
    partition: int
    offset: int


# The HKDF purpose of the key that wraps the letters' keys: the master key itself wraps none.
_WRAPPING_PURPOSE = b"memproj dead-letter keys v1"
_HEADER_LENGTH_BYTES = 4


class LetterSealer:
    """Seals letters under fresh data keys and opens them with their stored wrapped key."""

    def __init__(
        self, master_keys: bytes | MasterKeys, retention: timedelta = DEAD_LETTER_RETENTION
    ) -> None:
        self.master_keys = as_master_keys(master_keys)
        self._wrapping = KeyWrapping(self.master_keys, _WRAPPING_PURPOSE)
        self.retention = retention

    @property
    def key_id(self) -> str:
        """The id of the master key that wraps new letter keys: the newest."""
        return self.master_keys.newest_id

    def wrap(self, key_id: str, data_key: bytes) -> bytes:
        return self._wrapping.wrap(data_key, _wrapping_associated(key_id))

    def unwrap(self, key_id: str, wrapped_key: bytes, master_key_id: str) -> bytes:
        return self._wrapping.unwrap(wrapped_key, _wrapping_associated(key_id), master_key_id)

    def seal(
        self,
        at: Position,
        key: bytes | None,
        value: bytes | None,
        detail: str,
        failed_at: datetime,
    ) -> tuple[SealedOriginal, LetterKey]:
        """The sealed original (its first ORIGINAL_MAX_BYTES, the key's first KEY_MAX_CHARS
        bytes, the error's detail) and the key row it opens with."""
        key_id = str(uuid.uuid4())
        data_key = new_data_key()
        header = orjson.dumps(
            {
                "key": None if key is None else base64.b64encode(key[:KEY_MAX_CHARS]).decode(),
                "detail": detail,
            }
        )
        plaintext = (
            len(header).to_bytes(_HEADER_LENGTH_BYTES, "big")
            + header
            + (value or b"")[:ORIGINAL_MAX_BYTES]
        )
        ciphertext = seal_bytes(data_key, plaintext, _letter_associated(key_id, at))
        sealed = SealedOriginal(
            format=LETTER_FORMAT,
            key_id=key_id,
            ciphertext=base64.b64encode(ciphertext).decode(),
        )
        row = LetterKey(
            key_id=key_id,
            wrapped_key=self.wrap(key_id, data_key),
            topic=at.topic,
            partition=at.partition,
            offset=at.offset,
            owner=owner_of(key, value),
            failed_at=failed_at,
            expires_at=failed_at + self.retention,
            master_key_id=self.key_id,
        )
        return sealed, row

    def open(
        self,
        sealed: SealedOriginal,
        wrapped_key: bytes,
        at: Position,
        master_key_id: str = DEFAULT_MASTER_KEY_ID,
    ) -> Opened:
        """The letter's original, or ``Unreadable`` (tampered, moved, or not this key)."""
        if sealed.format != LETTER_FORMAT:
            raise Unreadable(f"unknown dead-letter format {sealed.format!r}")
        data_key = self.unwrap(sealed.key_id, wrapped_key, master_key_id)
        try:
            ciphertext = base64.b64decode(sealed.ciphertext, validate=True)
        except ValueError as exc:
            raise Unreadable("the sealed original is not base64") from exc
        plaintext = open_bytes(data_key, ciphertext, _letter_associated(sealed.key_id, at))
        length = int.from_bytes(plaintext[:_HEADER_LENGTH_BYTES], "big")
        header = orjson.loads(plaintext[_HEADER_LENGTH_BYTES : _HEADER_LENGTH_BYTES + length])
        key = header["key"]
        return Opened(
            value=plaintext[_HEADER_LENGTH_BYTES + length :],
            key=None if key is None else base64.b64decode(key),
            detail=header["detail"],
        )


def _letter_associated(key_id: str, at: Position) -> bytes:
    return encode_associated(LETTER_FORMAT, key_id, at.topic, at.partition, at.offset)


def _wrapping_associated(key_id: str) -> bytes:
    return encode_associated("dead-letter-key", key_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetterMessage(OutboxMessage):
    """A dead letter to publish, with the key row that must be durable before it is."""

    letter_key: LetterKey = field(compare=False)


def letter_keys(messages: Iterable[OutboxMessage]) -> list[LetterKey]:
    """The key rows of the dead letters among ``messages``."""
    return [m.letter_key for m in messages if isinstance(m, DeadLetterMessage)]
