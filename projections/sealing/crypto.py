"""AES-256-GCM (from ``cryptography``) for data keys and sealed fields. Pure.

A data key is generated per entity (one per memory, one per conversation) and stored wrapped
by the master key; the entity reference is the associated data of the wrapping, so a wrapped
key cannot be moved to another entity. Sealed fields carry the event id as associated data,
so a ciphertext cannot be moved to another event.
"""

from __future__ import annotations

import base64
import os
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

NONCE_BYTES = 12
KEY_BYTES = 32


class Unreadable(ValueError):
    """The ciphertext cannot be opened: wrong key, tampered, or the key no longer exists."""


def new_data_key() -> bytes:
    return AESGCM.generate_key(bit_length=KEY_BYTES * 8)


def _seal(key: bytes, plaintext: bytes, associated: bytes) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, associated)


def _open(key: bytes, sealed: bytes, associated: bytes) -> bytes:
    try:
        return AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], associated)
    except (InvalidTag, ValueError) as exc:
        raise Unreadable("cannot open: wrong key or tampered data") from exc


def wrap_key(master: bytes, data_key: bytes, entity: str) -> bytes:
    return _seal(master, data_key, entity.encode())


def unwrap_key(master: bytes, wrapped: bytes, entity: str) -> bytes:
    return _open(master, wrapped, entity.encode())


def seal_fields(data_key: bytes, fields: dict[str, Any], event_id: str) -> str:
    """The fields as one base64 AES-GCM ciphertext of their JSON."""
    return base64.b64encode(_seal(data_key, orjson.dumps(fields), event_id.encode())).decode()


def open_fields(data_key: bytes, sealed: str, event_id: str) -> dict[str, Any]:
    try:
        raw = base64.b64decode(sealed, validate=True)
    except ValueError as exc:
        raise Unreadable("sealed fields are not base64") from exc
    fields = orjson.loads(_open(data_key, raw, event_id.encode()))
    if not isinstance(fields, dict):
        raise Unreadable("sealed fields are not a JSON object")
    return fields


def parse_master_key(text: str) -> bytes:
    try:
        key = base64.b64decode(text, validate=True)
    except ValueError as exc:
        raise ValueError("MEMPROJ_MASTER_KEY must be base64") from exc
    if len(key) != KEY_BYTES:
        raise ValueError(f"MEMPROJ_MASTER_KEY must be {KEY_BYTES} bytes, base64-encoded")
    return key
