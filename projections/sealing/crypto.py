"""AES-256-GCM (from ``cryptography``) for data keys, sealed fields and deletion probes. Pure.

A data key is generated per entity (one per memory, one per conversation) and stored wrapped
by the master key; the entity reference is the associated data of the wrapping, so a wrapped
key cannot be moved to another entity. What the associated data of sealed fields is (the whole
sealed event, or only its event id for the first format) is decided in ``fields``.

Keys for new purposes are derived from the master key with HKDF-SHA256, one per purpose
(``derive_key``): the master key itself then encrypts nothing new but format-1 wrapped keys.

Several master keys can be configured (``MasterKeys``, newest first): the newest wraps every new
key, each of them unwraps what it wrapped, named by its id, until a rotation has re-wrapped it.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from pydantic import SecretStr

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


def parse_master_key(text: str | SecretStr, setting: str = "MEMPROJ_MASTER_KEY") -> bytes:
    """A master key from its base64; the errors name the setting, never the value."""
    if isinstance(text, SecretStr):
        text = text.get_secret_value()
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except ValueError:
        raise ValueError(f"{setting} must be base64") from None
    if len(key) != KEY_BYTES:
        raise ValueError(f"{setting} must be {KEY_BYTES} bytes, base64-encoded")
    return key


# -- several master keys (rotation) -----------------------------------------------------------

# The id of the key given alone (MEMPROJ_MASTER_KEY), and of every key wrapped before key ids.
DEFAULT_MASTER_KEY_ID = "default"
_KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class UnknownMasterKey(ValueError):
    """A key was wrapped by a master key that is not configured (any more)."""


@dataclass(frozen=True, slots=True)
class MasterKeys:
    """The configured master keys by id, newest first: the newest wraps, each unwraps what it
    wrapped. Its repr names the ids only."""

    by_id: tuple[tuple[str, bytes], ...]

    def __post_init__(self) -> None:
        if not self.by_id:
            raise ValueError("no master key configured")
        ids = [key_id for key_id, _ in self.by_id]
        if len(set(ids)) != len(ids):
            raise ValueError(f"master key ids must be distinct: {', '.join(ids)}")
        for key_id, key in self.by_id:
            if not _KEY_ID.fullmatch(key_id):
                raise ValueError(
                    f"master key id {key_id!r}: 1-64 letters, digits, '_', '.', '-' (first a"
                    " letter or digit)"
                )
            if len(key) != KEY_BYTES:
                raise ValueError(f"master key {key_id!r} must be {KEY_BYTES} bytes")

    @classmethod
    def single(cls, key: bytes, key_id: str = DEFAULT_MASTER_KEY_ID) -> MasterKeys:
        return cls(((key_id, key),))

    @property
    def newest_id(self) -> str:
        return self.by_id[0][0]

    @property
    def ids(self) -> list[str]:
        return [key_id for key_id, _ in self.by_id]

    def key(self, key_id: str) -> bytes:
        for known, key in self.by_id:
            if known == key_id:
                return key
        raise UnknownMasterKey(
            f"wrapped by master key {key_id!r}, which is not configured (configured:"
            f" {', '.join(self.ids)}); keep it in MEMPROJ_MASTER_KEYS until `memproj keys"
            " rotate` reports nothing left under it"
        )

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        return iter(self.by_id)

    def __contains__(self, key: object) -> bool:
        return any(key == known for _, known in self.by_id)

    def __repr__(self) -> str:
        return f"MasterKeys(ids={self.ids})"

    __str__ = __repr__


def as_master_keys(master: bytes | MasterKeys) -> MasterKeys:
    """A single key (bytes) is the ring of one key with the default id."""
    return master if isinstance(master, MasterKeys) else MasterKeys.single(master)


class KeyWrapping:
    """Data keys wrapped under one key per master key, derived from it for one ``purpose``
    (``None``: the master key itself, the entity keys' first format only). The newest master
    key wraps; a key opens with the master key that wrapped it. The one wrapping routine of
    every stored data key (the entities' and the dead letters')."""

    def __init__(self, master_keys: MasterKeys, purpose: bytes | None) -> None:
        self.master_keys = master_keys
        self._keys = {
            key_id: key if purpose is None else derive_key(key, purpose)
            for key_id, key in master_keys
        }

    def wrap(self, data_key: bytes, associated: bytes) -> bytes:
        """``data_key`` wrapped by the newest master key."""
        return wrap_key(self._keys[self.master_keys.newest_id], data_key, associated)

    def unwrap(self, wrapped: bytes, associated: bytes, master_key_id: str) -> bytes:
        self.master_keys.key(master_key_id)  # names a missing master key clearly
        return unwrap_key(self._keys[master_key_id], wrapped, associated)


def parse_master_keys(text: str | SecretStr, setting: str = "MEMPROJ_MASTER_KEYS") -> MasterKeys:
    """``id:base64`` entries separated by commas or whitespace (a mounted file may hold one a
    line), newest first."""
    if isinstance(text, SecretStr):
        text = text.get_secret_value()
    entries = [entry for entry in re.split(r"[,\s]+", text) if entry]
    if not entries:
        raise ValueError(f"{setting} names no key")
    keys = []
    for number, entry in enumerate(entries, 1):
        key_id, colon, encoded = entry.partition(":")
        if not colon:
            raise ValueError(f"{setting}: entry {number} is not id:base64")
        keys.append((key_id, parse_master_key(encoded, f"{setting} key {key_id!r}")))
    return MasterKeys(tuple(keys))
