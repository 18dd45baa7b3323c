"""The verification probe: after every store has acknowledged a deletion, try to read the
target back from everywhere a reader could: the authoritative projections (what recall and
the context view read), the copies rebuilds left, and every derived store (each says what of
the target it still holds: the vector store by item ids, by target and by content, with
sealed vectors of the erased text kept for this purpose only; the cache; the tables)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from projections import rebuilds
from projections.deletion import coverage, lifecycle
from projections.memory import store as memory_store
from projections.sql import Conn
from projections.stores.base import DerivedStore

# What the authoritative projections still hold of an erased target, table by table.
_PROJECTION_CHECKS = {
    "memories": coverage.MEMORIES,
    "memory_versions": coverage.MEMORY_VERSIONS,
    "conversations": coverage.CONVERSATIONS,
    "messages": coverage.MESSAGES,
}


async def verify(
    conn: Conn, stores: Sequence[DerivedStore], tenant_id: str, deletion_id: str
) -> dict[str, Any]:
    tombstone = await lifecycle.tombstone_of(conn, tenant_id, deletion_id)
    params = coverage.tombstone_params(tombstone)
    found: dict[str, Any] = {}
    if tombstone.kind == "erasure":
        for name, table in _PROJECTION_CHECKS.items():
            found[name] = await _count(conn, table.of_deletion("SELECT count(*)"), params)
        found["rebuild_copies"] = await rebuilds.covered_copies(conn, params)
    else:
        # A revocation keeps the revoked row and its history; only recall must not return it.
        found["recallable"] = await memory_store.count_recallable(
            conn, tombstone.tenant_id, tombstone.ids("memory")
        )
    for store in stores:
        if store.name in tombstone.required_stores:
            found[store.name] = await store.reachable(conn, tombstone)
    clean = all(not value for value in found.values())
    return {"clean": clean, "found": found}


async def _count(conn: Conn, query: Any, params: Mapping[str, Any]) -> int:
    cursor = await conn.execute(query.encode() if isinstance(query, str) else query, params)
    row = await cursor.fetchone()
    return int(row[0]) if row else 0
