"""The guard every projection write passes: the tenant locks, and the erasure index
(``erased_entities``) read under them.

Consistency with the projections rests on one lock per tenant: a deletion takes it
exclusively for its transaction; every projection batch, index update and cache fill takes it
shared before it writes, and reads the erasure index under it: most before they read anything,
the memory stage's batches after a first read without it, re-read under it (``read_erasures``,
``erasures_changed``: the batch is read and reduced again if an erasure of its keys was
recorded since). A write either commits before the deletion (and the deletion then removes
it) or sees the erasure (and is refused).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from projections.deletion.erasure import (
    EntityKey,
    ErasureIndex,
    ErasureRow,
    erasure_row,
    latest_erasures,
)
from projections.sql import Conn, KeyLookups, copy_new_rows


async def lock_tenants(conn: Conn, tenants: Iterable[str], *, exclusive: bool) -> None:
    """Take the tenant locks for this transaction, in a fixed order (no deadlocks).

    Exclusive tenant locks are taken to erase, so they come after the erasures lock, shared:
    a rebuild's swap holds that one exclusively while it sweeps and swaps.
    """
    ordered = sorted(set(tenants))
    if not ordered:
        return
    if exclusive:
        await conn.execute(
            "SELECT pg_advisory_xact_lock_shared(hashtextextended(%s, 0))", (_ERASURES_LOCK,)
        )
    function = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
    await conn.execute(
        f"SELECT {function}(hashtextextended('memproj:tenant:' || t, 0))"
        " FROM unnest(%s::text[]) WITH ORDINALITY AS x(t, n) ORDER BY n",
        (ordered,),
    )


async def try_lock_tenants_shared(conn: Conn, tenants: Iterable[str]) -> bool:
    """Take the shared tenant locks for this transaction if every one is free now (no
    deletion of these tenants holds or awaits its exclusive lock); False, with some perhaps
    taken, if not: the caller rolls back."""
    ordered = sorted(set(tenants))
    if not ordered:
        return True
    cursor = await conn.execute(
        "SELECT bool_and(pg_try_advisory_xact_lock_shared("
        "hashtextextended('memproj:tenant:' || t, 0))) FROM unnest(%s::text[]) AS x(t)",
        (ordered,),
    )
    row = await cursor.fetchone()
    return bool(row and row[0])


_ERASURES_LOCK = "memproj:erasures"


async def hold_erasures(conn: Conn) -> None:
    """Until this transaction ends, no erasure commits: one that committed before is visible
    to whatever this transaction reads next, and one that starts waits. A rebuild's swap
    takes it so that its sweep of erased items and the swap see the same erasures."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (_ERASURES_LOCK,))


@dataclass(frozen=True, slots=True)
class ErasuresRead:
    """What one read of the erasure index found for a batch's keys: every row, so that a
    read of the same keys later tells whether an erasure was recorded (or forgotten) since."""

    keys: tuple[EntityKey, ...] = ()
    rows: frozenset[ErasureRow] = frozenset()

    @property
    def index(self) -> ErasureIndex:
        return ErasureIndex(latest_erasures(self.rows))


async def read_erasures(conn: Conn, keys: Iterable[EntityKey], lookups: KeyLookups) -> ErasuresRead:
    wanted = tuple(sorted(set(keys)))
    if not wanted:
        return ErasuresRead()
    return ErasuresRead(wanted, await _erasure_rows(conn, wanted, lookups))


async def erasures_changed(conn: Conn, read: ErasuresRead, lookups: KeyLookups) -> bool:
    """Whether an erasure of ``read``'s keys was recorded or forgotten since ``read``."""
    if not read.keys:
        return False
    return await _erasure_rows(conn, read.keys, lookups) != read.rows


async def _erasure_rows(
    conn: Conn, wanted: Sequence[EntityKey], lookups: KeyLookups
) -> frozenset[ErasureRow]:
    rows = await lookups.fetch(
        conn,
        "SELECT e.tenant_id, e.entity_type, e.subject_type, e.entity_id, e.deletion_id, e.cut_off"
        " FROM erased_entities e JOIN {keys}"
        " USING (tenant_id, entity_type, subject_type, entity_id) WHERE e.tenant_id = {tenant}",
        ("tenant_id", "entity_type", "subject_type", "entity_id"),
        wanted,
    )
    return frozenset(erasure_row(row) for row in rows)


async def load_erasures(conn: Conn, keys: Iterable[EntityKey], lookups: KeyLookups) -> ErasureIndex:
    return (await read_erasures(conn, keys, lookups)).index


async def record_erasures(conn: Conn, erasures: Iterable[tuple[EntityKey, datetime, str]]) -> None:
    """Erasure index rows: (key, cut-off, deletion id). Idempotent."""
    await copy_new_rows(
        conn,
        "erased_entities",
        ("tenant_id", "entity_type", "subject_type", "entity_id", "cut_off", "deletion_id"),
        ((*key, cut_off, deletion_id) for key, cut_off, deletion_id in erasures),
    )


async def erasure_digest(conn: Conn) -> tuple[int, int]:
    """Changes whenever an erasure is recorded or forgotten (the ledger has no sequence)."""
    cursor = await conn.execute(
        "SELECT count(*), coalesce(sum(hashtextextended(tenant_id || '|' || entity_type || '|'"
        " || subject_type || '|' || entity_id || '|' || deletion_id || '|' || cut_off::text,"
        " 0) % 1000000007), 0) FROM erased_entities"
    )
    row = await cursor.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def every_erasure(conn: Conn) -> list[tuple[Any, ...]]:
    """Every row of the erasure index, as ``erasure_row`` reads it."""
    cursor = await conn.execute(
        "SELECT tenant_id, entity_type, subject_type, entity_id, deletion_id, cut_off"
        " FROM erased_entities"
    )
    return list(await cursor.fetchall())
