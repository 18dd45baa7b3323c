"""The store of dead-letter keys in PostgreSQL (``dead_letter_keys``).

A letter's key row is written before the letter is published (``LetterKeys``): in the
caller's transaction (the projections' batch) or in its own (the agents, before they
publish). An erasure destroys the keys of the letters its owner covers
(``shred_dead_letters``), a letter born after its owner's erasure is stored erased
(``save_keys``), and every key goes at its expiry (``destroy_expired``). The keys not wrapped
by the newest master key are re-wrapped in batches (``rewrap_letter_keys``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol

from psycopg_pool import AsyncConnectionPool

from projections.deadletters.owner import LetterOwner
from projections.deadletters.sealing import DEAD_LETTER_RETENTION, LetterKey, LetterSealer
from projections.deletion import guard as erasure_guard
from projections.deletion.erasure import ErasureScope
from projections.sealing.crypto import DEFAULT_MASTER_KEY_ID
from projections.sealing.rewrap import Rewrapped, rewrap_keys
from projections.sql import Conn, KeyLookups
from topics.envelope import Subject
from topics.registry import keys_of


class LetterKeys(Protocol):
    """Where letter keys become durable: in the caller's transaction, or in their own."""

    async def save_in(self, conn: Conn, keys: Sequence[LetterKey]) -> None: ...

    async def save(self, keys: Sequence[LetterKey]) -> None: ...


class PostgresLetterKeys:
    def __init__(self, pool: AsyncConnectionPool[Conn], lookups: KeyLookups) -> None:
        self._pool = pool
        self._lookups = lookups

    async def save_in(self, conn: Conn, keys: Sequence[LetterKey]) -> None:
        await save_keys(conn, keys, self._lookups)

    async def save(self, keys: Sequence[LetterKey]) -> None:
        if keys:
            async with self._pool.connection() as conn, conn.transaction():
                await save_keys(conn, keys, self._lookups)


class UnpublishedLetterKeys:
    """For a run that publishes no dead letter (a rebuild stops at its first instead): its
    letters are never read, so their keys are not kept."""

    async def save_in(self, conn: Conn, keys: Sequence[LetterKey]) -> None:
        return None

    async def save(self, keys: Sequence[LetterKey]) -> None:
        return None


_EPOCH = datetime.min.replace(tzinfo=UTC)


async def save_keys(conn: Conn, keys: Sequence[LetterKey], lookups: KeyLookups) -> None:
    """Store letter keys in the caller's transaction. A letter whose owner is already erased
    (at or after its event's time; any time, when the time is unreadable) is stored erased:
    the erasure came first and covers it. The owners' tenant locks are taken shared, as every
    projection write does, so that an erasure either commits first and is seen here, or
    comes after and destroys these keys."""
    if not keys:
        return
    tenants = {tenant for k in keys for tenant in k.owner.tenant_ids()}
    await erasure_guard.lock_tenants(conn, tenants, exclusive=False)
    erasures = await erasure_guard.load_erasures(
        conn, (entry for k in keys for entry in k.owner.erasure_keys()), lookups
    )
    rows = []
    for k in keys:
        erasure = erasures.covering(k.owner.erasure_keys(), k.owner.occurred_at or _EPOCH)
        owner = k.owner if erasure is None else LetterOwner(tenant_id=k.owner.tenant_id)
        rows.append(
            (
                k.key_id,
                None if erasure is not None else k.wrapped_key,
                k.topic,
                k.partition,
                k.offset,
                owner.tenant_id,
                owner.subject_type,
                owner.subject_id,
                owner.memory_id,
                owner.conversation_id,
                owner.message_key,
                k.failed_at,
                k.expires_at,
                None if erasure is None else erasure.deletion_id,
                None if erasure is None else k.failed_at,
                k.master_key_id,
            )
        )
    async with conn.cursor() as cursor:
        await cursor.executemany(
            'INSERT INTO dead_letter_keys (key_id, wrapped_key, topic, "partition", "offset",'
            " tenant_id, subject_type, subject_id, memory_id, conversation_id, message_key,"
            " failed_at, expires_at, erased_by, erased_at, master_key_id)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (key_id) DO NOTHING",
            rows,
        )


async def shred_dead_letters(
    conn: Conn,
    tenant_id: str,
    subject: Subject | None,
    memory_ids: Sequence[str],
    conversation_ids: Sequence[str],
    deletion_id: str,
) -> int:
    """Destroy the keys of the letters an erasure covers: those naming its subject, its
    memories or conversations (in their value or as their key). Their rows stay, without key
    and owner, until they expire, so that ``memproj dlq`` can say the letter was erased."""
    entities = [*memory_ids, *conversation_ids]
    cursor = await conn.execute(
        "UPDATE dead_letter_keys SET wrapped_key = NULL, erased_by = %(deletion)s,"
        " erased_at = now(), subject_type = NULL, subject_id = NULL, memory_id = NULL,"
        " conversation_id = NULL, message_key = NULL"
        " WHERE wrapped_key IS NOT NULL AND ((tenant_id = %(tenant)s AND ("
        "(subject_type = %(subject_type)s AND subject_id = %(subject_id)s)"
        " OR memory_id = ANY(%(memories)s) OR conversation_id = ANY(%(conversations)s)))"
        " OR message_key = ANY(%(keys)s))",
        {
            "deletion": deletion_id,
            "tenant": tenant_id,
            "subject_type": subject.type if subject else None,
            "subject_id": subject.id if subject else None,
            "memories": list(memory_ids),
            "conversations": list(conversation_ids),
            "keys": [key for entity in entities for key in keys_of(tenant_id, entity)],
        },
    )
    return cursor.rowcount


async def erase(conn: Conn, scope: ErasureScope) -> None:
    """Dead letters naming what is erased (even malformed copies) no longer open."""
    await shred_dead_letters(
        conn,
        scope.tenant_id,
        scope.subject,
        scope.memories,
        scope.conversations,
        scope.deletion_id,
    )


async def destroy_expired(conn: Conn, now: datetime) -> int:
    """Delete every letter key past its expiry (and the rows of erased letters with it)."""
    cursor = await conn.execute("DELETE FROM dead_letter_keys WHERE expires_at <= %s", (now,))
    return cursor.rowcount


async def rewrap_letter_keys(conn: Conn, sealer: LetterSealer, limit: int) -> Rewrapped:
    """Re-wrap up to ``limit`` letter keys not wrapped by the newest master key, in the
    caller's transaction (``rewrap_keys``: rows held elsewhere are left to a later batch; an
    erased or expired key is not there to update, never brought back)."""

    def rewrap(row: tuple[Any, ...]) -> tuple[tuple[Any, ...], str]:
        key_id, wrapped, master_key_id = row
        data_key = sealer.unwrap(key_id, bytes(wrapped), master_key_id)
        return (sealer.wrap(key_id, data_key), sealer.key_id, key_id), master_key_id

    return await rewrap_keys(
        conn,
        "SELECT key_id::text, wrapped_key, master_key_id FROM dead_letter_keys"
        " WHERE wrapped_key IS NOT NULL AND master_key_id <> %s"
        " ORDER BY key_id LIMIT %s FOR UPDATE SKIP LOCKED",
        (sealer.key_id, limit),
        rewrap,
        "UPDATE dead_letter_keys SET wrapped_key = %s, master_key_id = %s"
        " WHERE key_id = %s::uuid AND wrapped_key IS NOT NULL",
    )


async def count_letter_keys_not_newest(conn: Conn, sealer: LetterSealer) -> dict[str, int]:
    cursor = await conn.execute(
        "SELECT master_key_id, count(*) FROM dead_letter_keys"
        " WHERE wrapped_key IS NOT NULL AND master_key_id <> %s GROUP BY master_key_id",
        (sealer.key_id,),
    )
    return {key_id: count for key_id, count in await cursor.fetchall()}


KeyState = Literal["open", "erased", "expired", "missing"]


@dataclass(frozen=True, slots=True)
class StoredKey:
    wrapped_key: bytes | None
    erased_by: str | None
    expires_at: datetime
    master_key_id: str = DEFAULT_MASTER_KEY_ID


async def load_keys(conn: Conn, key_ids: Iterable[str]) -> dict[str, StoredKey]:
    """The stored rows of these keys (a key id that is no UUID has none)."""
    wanted = sorted({key_id for key_id in key_ids if _is_uuid(key_id)})
    cursor = await conn.execute(
        "SELECT key_id::text, wrapped_key, erased_by, expires_at, master_key_id"
        " FROM dead_letter_keys WHERE key_id = ANY(%s::uuid[])",
        (wanted,),
    )
    return {
        key_id: StoredKey(
            None if wrapped is None else bytes(wrapped), erased_by, expires_at, master_key_id
        )
        for key_id, wrapped, erased_by, expires_at, master_key_id in await cursor.fetchall()
    }


def key_state(
    stored: StoredKey | None,
    failed_at: datetime,
    now: datetime,
    retention: timedelta = DEAD_LETTER_RETENTION,
) -> KeyState:
    """Whether a letter opens: its key is stored (open), was destroyed by an erasure, or is
    past its expiry (destroyed, or about to be); a letter inside its window without a key row
    is missing (not written by memproj, or its key was lost)."""
    if stored is not None and stored.wrapped_key is None:
        return "erased"
    if stored is not None:
        return "open" if stored.expires_at > now else "expired"
    return "expired" if failed_at + retention <= now else "missing"


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True
