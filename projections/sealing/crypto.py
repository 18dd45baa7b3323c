"""AES-256-GCM (from ``cryptography``) for data keys, sealed fields and deletion probes. Pure.

A data key is generated per entity (one per memory, one per conversation) and stored wrapped
by the master key; the entity reference is the associated data of the wrapping, so a wrapped
key cannot be moved to another entity. What the associated data of sealed fields is (the whole
sealed event, or only its event id for the first format) is decided in ``fields``.

Keys for new purposes are derived from the master key with HKDF-SHA256, one per purpose
(``derive_key``): the master key itself then encrypts nothing new but format-1 wrapped keys.
"""

from __future__ import annotations

import base64
import os
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

NONCE_BYTES = 12
KEY_BYTES = 32


class Unreadable(ValueError):
    """The ciphertext cannot be opened: wrong key, tampered, or the key no longer exists."""


def new_data_key() -> bytes:
    return AESGCM.generate_key(bit_length=KEY_BYTES * 8)


def derive_key(master: bytes, purpose: bytes) -> bytes:
    """A key for one purpose, derived from the master key: knowing it reveals neither the
    master key nor the key of any other purpose."""
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=purpose).derive(master)


def encode_associated(*parts: str | int) -> bytes:
    """Associated data from its parts, unambiguously: a JSON array, so that no choice of ids
    (``:`` in a tenant, quotes, anything) makes two different part lists one encoding."""
    return orjson.dumps(parts)


def seal_bytes(key: bytes, plaintext: bytes, associated: bytes) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, associated)


def open_bytes(key: bytes, sealed: bytes, associated: bytes) -> bytes:
    try:
        return AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], associated)
    except (InvalidTag, ValueError) as exc:
        raise Unreadable("cannot open: wrong key or tampered data") from exc


def _bytes(associated: str | bytes) -> bytes:
    # A str is encoded as UTF-8: callers that bind a readable name pass it as it is.
    return associated.encode() if isinstance(associated, str) else associated


def wrap_key(master: bytes, data_key: bytes, associated: str | bytes) -> bytes:
    return seal_bytes(master, data_key, _bytes(associated))


def unwrap_key(master: bytes, wrapped: bytes, associated: str | bytes) -> bytes:
    return open_bytes(master, wrapped, _bytes(associated))


def seal_fields(data_key: bytes, fields: dict[str, Any], associated: str | bytes) -> str:
    """The fields as one base64 AES-GCM ciphertext of their JSON."""
    plaintext = orjson.dumps(fields)
    return base64.b64encode(seal_bytes(data_key, plaintext, _bytes(associated))).decode()


def open_fields(data_key: bytes, sealed: str, associated: str | bytes) -> dict[str, Any]:
    try:
        raw = base64.b64decode(sealed, validate=True)
    except ValueError as exc:
        raise Unreadable("sealed fields are not base64") from exc
    fields = orjson.loads(open_bytes(data_key, raw, _bytes(associated)))
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
