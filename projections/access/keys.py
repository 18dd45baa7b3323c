"""API keys: ``mpk_<key_id>_<secret>``, bound to one tenant, an actor and a set of purposes.

The secret is 32 random bytes (URL-safe base64); only its SHA-256 is stored. A presented key
is looked up by its key id and its secret's hash compared in constant time, so neither a
timing nor a leaked table gives the secret away. A revoked key stays in the table (its id is
what the audit names) and never authenticates again.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from projections.access.policy import WriteBounds
from projections.sql import Conn

PREFIX = "mpk"
SECRET_BYTES = 32
_KEY_ID = re.compile(r"^[0-9a-f]{16}$")
# The secret: URL-safe base64 of SECRET_BYTES without padding (it may contain '_' and '-').
_SECRET = re.compile(r"^[A-Za-z0-9_-]{43}$")


@dataclass(frozen=True, slots=True)
class PresentedKey:
    key_id: str
    # Never in a repr: a log line or a traceback's locals must not carry it.
    secret: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A stored key, without its secret."""

    key_id: str
    tenant_id: str
    actor: str
    purposes: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None
    # None: unbounded (any kind and scope), as every key was before bounds existed.
    write_bounds: WriteBounds | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


@dataclass(frozen=True, slots=True)
class CreatedKey:
    key: ApiKey
    token: str = field(repr=False)  # the whole `mpk_...` string: shown once, never stored


def parse_key(token: str) -> PresentedKey | None:
    """The key id and secret of a presented token; None if it is not of the key's form."""
    prefix, sep, rest = token.partition("_")
    key_id, sep2, secret = rest.partition("_")
    if prefix != PREFIX or not sep or not sep2:
        return None
    if not _KEY_ID.match(key_id) or not _SECRET.match(secret):
        return None
    return PresentedKey(key_id, secret)


def secret_digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def new_token() -> tuple[str, str, str]:
    """A fresh (token, key_id, secret)."""
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(SECRET_BYTES)
    return f"{PREFIX}_{key_id}_{secret}", key_id, secret


def _bounds_from_row(row: dict[str, Any]) -> WriteBounds | None:
    if row["write_kinds"] is None or row["write_scopes"] is None:
        return None
    return WriteBounds(frozenset(row["write_kinds"]), frozenset(row["write_scopes"]))


def _key_from_row(row: dict[str, Any]) -> ApiKey:
    return ApiKey(
        key_id=row["key_id"],
        tenant_id=row["tenant_id"],
        actor=row["actor"],
        purposes=tuple(row["purposes"]),
        created_at=row["created_at"],
        revoked_at=row["revoked_at"],
        write_bounds=_bounds_from_row(row),
    )


_COLUMNS = "key_id, tenant_id, actor, purposes, created_at, revoked_at, write_kinds, write_scopes"


def _bound_columns(bounds: WriteBounds | None) -> tuple[list[str] | None, list[str] | None]:
    if bounds is None:
        return None, None
    return sorted(bounds.kinds), sorted(bounds.scopes)


async def create_key(
    conn: Conn,
    tenant_id: str,
    actor: str,
    purposes: Sequence[str],
    now: datetime,
    write_bounds: WriteBounds | None = None,
) -> CreatedKey:
    if not purposes:
        raise ValueError("a key needs at least one purpose")
    token, key_id, secret = new_token()
    kinds, scopes = _bound_columns(write_bounds)
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            "INSERT INTO api_keys (key_id, tenant_id, actor, purposes, secret_sha256, created_at,"
            " write_kinds, write_scopes) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
            f" RETURNING {_COLUMNS}",
            (
                key_id,
                tenant_id,
                actor,
                list(dict.fromkeys(purposes)),
                secret_digest(secret),
                now,
                kinds,
                scopes,
            ),
        )
        row = await cursor.fetchone()
    assert row is not None
    return CreatedKey(_key_from_row(row), token)


async def authenticate(conn: Conn, token: str) -> ApiKey | None:
    """The key a token names, if its secret matches and it is not revoked; else None."""
    presented = parse_key(token)
    if presented is None:
        return None
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            f"SELECT {_COLUMNS}, secret_sha256 FROM api_keys WHERE key_id = %s",
            (presented.key_id,),
        )
        row = await cursor.fetchone()
    # The digest is compared even for an unknown id, so that both take the same time.
    stored = bytes(row["secret_sha256"]) if row is not None else b"\0" * 32
    matches = hmac.compare_digest(stored, secret_digest(presented.secret))
    if row is None or not matches:
        return None
    key = _key_from_row(row)
    return None if key.revoked else key


async def list_keys(conn: Conn, tenant_id: str | None = None) -> list[ApiKey]:
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            f"SELECT {_COLUMNS} FROM api_keys"
            " WHERE %(tenant)s::text IS NULL OR tenant_id = %(tenant)s"
            " ORDER BY tenant_id, created_at, key_id",
            {"tenant": tenant_id},
        )
        return [_key_from_row(row) for row in await cursor.fetchall()]


async def revoke_key(conn: Conn, key_id: str, now: datetime) -> ApiKey | None:
    """Revoke a key (a revoked one keeps its first revocation time); None: no such key."""
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            "UPDATE api_keys SET revoked_at = coalesce(revoked_at, %s) WHERE key_id = %s"
            f" RETURNING {_COLUMNS}",
            (now, key_id),
        )
        row = await cursor.fetchone()
    return _key_from_row(row) if row is not None else None


async def bound_key(conn: Conn, key_id: str, write_bounds: WriteBounds | None) -> ApiKey | None:
    """Set (or, with None, lift) a key's write bounds, from its next request on; None: no
    such key."""
    kinds, scopes = _bound_columns(write_bounds)
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            "UPDATE api_keys SET write_kinds = %s, write_scopes = %s WHERE key_id = %s"
            f" RETURNING {_COLUMNS}",
            (kinds, scopes, key_id),
        )
        row = await cursor.fetchone()
    return _key_from_row(row) if row is not None else None
