"""The verification probe's vectors of an erasure (``deletion_probes``), sealed: the text of
every erased memory and message, embedded before it is erased, so that the probe can later
search the vector store for it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from projections.deletion.ledger import LedgerEntry
from projections.distribution import cross_tenant
from projections.sealing.probes import ProbeSealer
from projections.sql import Conn, copy_rows

ProbeId = tuple[str, str, str, str]
"""A probe's key: tenant, deletion, item type, item id."""


async def record_probes(
    conn: Conn,
    entry: LedgerEntry,
    vectors: Sequence[tuple[str, str, Sequence[float]]],
    probes: ProbeSealer,
) -> None:
    """The probe vectors, sealed (``ProbeSealer``): nothing stored lets anyone without the
    master key test a guess of the erased words against them."""
    tenant, deletion = entry.tenant_id, entry.deletion_id
    await copy_rows(
        conn,
        "deletion_probes",
        ("tenant_id", "deletion_id", "item_type", "item_id", "sealed_vector"),
        ((tenant, deletion, t, i, probes.seal(tenant, deletion, t, i, v)) for t, i, v in vectors),
    )


async def load_probes(
    conn: Conn, tenant_id: str, deletion_id: str, probes: ProbeSealer
) -> list[tuple[str, str, list[float]]]:
    """The probe vectors, opened. A plaintext ``vector`` is one written before migration 008
    (or by a worker of the release before it): read as it is, deleted like the others."""
    cursor = await conn.execute(
        "SELECT item_type, item_id, sealed_vector, vector FROM deletion_probes"
        " WHERE tenant_id = %s AND deletion_id = %s",
        (tenant_id, deletion_id),
    )
    return [
        (
            item_type,
            item_id,
            list(vector)
            if sealed is None
            else probes.open(tenant_id, deletion_id, item_type, item_id, bytes(sealed)),
        )
        for item_type, item_id, sealed, vector in await cursor.fetchall()
    ]


async def drop_probes(conn: Conn, tenant_id: str, deletion_id: str) -> None:
    """Delete the probes of one deletion (once it is verified)."""
    await conn.execute(
        "DELETE FROM deletion_probes WHERE tenant_id = %s AND deletion_id = %s",
        (tenant_id, deletion_id),
    )


async def drop_expired_probes(conn: Conn, now: datetime) -> int:
    """Delete the probes of every deletion whose deadline has passed, verified or not: a store
    that never acknowledges must not keep vectors of the erased text alive. The deadline is the
    request's: one statement reading the ledger, so that no probe outlives it between two."""
    cursor = await conn.execute(
        cross_tenant("probe-expiry") + "DELETE FROM deletion_probes p USING deletion_requests r"
        " WHERE r.tenant_id = p.tenant_id AND r.deletion_id = p.deletion_id"
        " AND r.deadline_at <= %s",
        (now,),
    )
    return cursor.rowcount


async def lock_sealed_batch(conn: Conn, after: ProbeId | None, limit: int) -> list[tuple[Any, ...]]:
    """Up to ``limit`` sealed probes after ``after`` in key order, locked for re-sealing (rows
    another rotation holds are skipped): key and sealed vector."""
    where = (
        ""
        if after is None
        else " AND (tenant_id, deletion_id, item_type, item_id) > (%s, %s, %s, %s)"
    )
    cursor = await conn.execute(
        cross_tenant("key-rotation")
        + "SELECT tenant_id, deletion_id, item_type, item_id, sealed_vector"
        f" FROM deletion_probes WHERE sealed_vector IS NOT NULL{where}"
        " ORDER BY tenant_id, deletion_id, item_type, item_id LIMIT %s"
        " FOR UPDATE SKIP LOCKED",
        (*(after or ()), limit),
    )
    return list(await cursor.fetchall())


async def replace_sealed(conn: Conn, updates: Sequence[tuple[bytes, str, str, str, str]]) -> None:
    """Store re-sealed vectors: (sealed vector, tenant, deletion, item type, item id) each."""
    if updates:
        async with conn.cursor() as update:
            await update.executemany(
                "UPDATE deletion_probes SET sealed_vector = %s WHERE tenant_id = %s"
                " AND deletion_id = %s AND item_type = %s AND item_id = %s",
                updates,
            )


async def sealed(conn: Conn) -> list[tuple[Any, ...]]:
    """Every sealed probe: key and sealed vector."""
    cursor = await conn.execute(
        cross_tenant("key-rotation")
        + "SELECT tenant_id, deletion_id, item_type, item_id, sealed_vector FROM deletion_probes"
        " WHERE sealed_vector IS NOT NULL"
    )
    return list(await cursor.fetchall())
