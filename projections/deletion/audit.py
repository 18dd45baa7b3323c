"""The reconciliation audit: scan every derived store for items the ledger says are gone.

It does not trust acknowledgements: it reads each store directly. A copy counts as a ghost
when an erasure (or a revocation) covers it and the copy is not newer than the cut-off; data
written after the cut-off is new data, not a ghost.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from projections import rebuilds
from projections.deletion import guard, lifecycle
from projections.deletion.erasure import ErasureIndex, ErasureRow, erasure_row, latest_erasures
from projections.sql import Conn
from projections.stores import STORES, DerivedStore, StoreRegistry

EXAMPLES = 10
REBUILDS = "rebuilds"


@dataclass(frozen=True, slots=True)
class AuditResult:
    store: str
    ghosts: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"ghost_items": len(self.ghosts), "examples": self.ghosts[:EXAMPLES]}


async def load_covered(conn: Conn) -> dict[str, ErasureIndex]:
    """Per tenant: erased entities and revoked memories, with their cut-offs."""
    rows: dict[str, list[ErasureRow]] = defaultdict(list)
    for columns in [*await guard.every_erasure(conn), *await lifecycle.revoked_memories(conn)]:
        row = erasure_row(columns)
        rows[row[0][0]].append(row)
    return {tenant: ErasureIndex(latest_erasures(found)) for tenant, found in rows.items()}


async def audit_ghosts(
    conn: Conn, stores: Sequence[DerivedStore], now: datetime
) -> dict[str, AuditResult]:
    covered = await load_covered(conn)
    results = [AuditResult(store.name, await store.ghosts(conn, covered)) for store in stores]
    # Not a store: the copies rebuilds left beside the live schema.
    results.append(AuditResult(REBUILDS, await rebuilds.covered_copies(conn)))
    await save(conn, results, now)
    return {result.store: result for result in results}


async def save(conn: Conn, results: Iterable[AuditResult], now: datetime) -> None:
    async with conn.cursor() as cursor:
        await cursor.executemany(
            "INSERT INTO ghost_audits (store, ghost_items, examples, audited_at)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT (store) DO UPDATE SET"
            " ghost_items = EXCLUDED.ghost_items, examples = EXCLUDED.examples,"
            " audited_at = EXCLUDED.audited_at",
            [(r.store, len(r.ghosts), Jsonb(r.ghosts[:EXAMPLES]), now) for r in results],
        )


async def latest(conn: Conn, stores: StoreRegistry = STORES) -> dict[str, tuple[int, datetime]]:
    cursor = await conn.execute("SELECT store, ghost_items, audited_at FROM ghost_audits")
    found = {row[0]: (int(row[1]), row[2]) for row in await cursor.fetchall()}
    return {store: found[store] for store in (*stores.names, REBUILDS) if store in found}
