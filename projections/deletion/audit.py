"""The reconciliation audit: scan every derived store for items the ledger says are gone.

It does not trust acknowledgements: it reads each store directly. A copy counts as a ghost
when an erasure (or a revocation) covers it and the copy is not newer than the cut-off; data
written after the cut-off is new data, not a ghost.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from projections.bookkeeping import Conn
from projections.cache.store import RedisCache
from projections.deletion.erasure import (
    EntityKey,
    Erasure,
    ErasureIndex,
    conversation_key,
    memory_key,
    subject_key,
)
from projections.embeddings.vectors import Match, VectorEntry, VectorStore
from topics.deletion import STORES

EXAMPLES = 10


@dataclass(frozen=True, slots=True)
class AuditResult:
    store: str
    ghosts: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"ghost_items": len(self.ghosts), "examples": self.ghosts[:EXAMPLES]}


async def load_covered(conn: Conn) -> dict[str, ErasureIndex]:
    """Per tenant: erased entities and revoked memories, with their cut-offs."""
    cursor = await conn.execute(
        "SELECT tenant_id, entity_type, subject_type, entity_id, deletion_id, cut_off"
        " FROM erased_entities"
        " UNION ALL SELECT r.tenant_id, 'memory', '', r.target_id, r.deletion_id, r.cut_off"
        " FROM deletion_requests r WHERE r.kind = 'revocation'"
    )
    entries: dict[str, dict[EntityKey, Erasure]] = defaultdict(dict)
    for (
        tenant,
        entity_type,
        subject_type,
        entity_id,
        deletion_id,
        cut_off,
    ) in await cursor.fetchall():
        key = (tenant, entity_type, subject_type, entity_id)
        known = entries[tenant].get(key)
        if known is None or cut_off > known.cut_off:
            entries[tenant][key] = Erasure(deletion_id, cut_off)
    return {tenant: ErasureIndex(found) for tenant, found in entries.items()}


def erased_entries(
    entries: Iterable[VectorEntry], covered: dict[str, ErasureIndex]
) -> list[VectorEntry]:
    """The entries an erasure or revocation covers: ghosts, wherever they are found."""
    return [
        entry
        for entry in entries
        if (index := covered.get(entry.tenant_id)) is not None
        and index.covering(_keys_of_entry(entry), entry.occurred_at) is not None
    ]


def _keys_of_entry(entry: VectorEntry) -> list[EntityKey]:
    keys = [subject_key(entry.tenant_id, entry.subject_type, entry.subject_id)]
    if entry.memory_id is not None:
        keys.append(memory_key(entry.tenant_id, entry.memory_id))
    if entry.conversation_id is not None:
        keys.append(conversation_key(entry.tenant_id, entry.conversation_id))
    return keys


def _match(tenant: str, index: ErasureIndex) -> Match:
    subjects = [k for k in index.entries if k[1] == "subject"]
    return Match(
        tenant_id=tenant,
        conversation_ids=tuple(k[3] for k in index.entries if k[1] == "conversation"),
        memory_ids=tuple(k[3] for k in index.entries if k[1] == "memory"),
        # One subject per Match: the others are found through their memories and
        # conversations, and separately below.
        subject=(subjects[0][2], subjects[0][3]) if subjects else None,
    )


async def audit_embeddings(vectors: VectorStore, covered: dict[str, ErasureIndex]) -> AuditResult:
    ghosts: set[str] = set()
    for tenant, index in covered.items():
        subjects = [(k[2], k[3]) for k in index.entries if k[1] == "subject"]
        matches = [_match(tenant, index)] + [
            Match(tenant_id=tenant, subject=subject) for subject in subjects[1:]
        ]
        for match in matches:
            found = await asyncio.to_thread(vectors.find, match)
            ghosts.update(entry.id for entry in erased_entries(found, {tenant: index}))
    return AuditResult("embeddings", sorted(ghosts))


async def _audit_table(conn: Conn, store: str, table: str, stamp: str) -> AuditResult:
    cursor = await conn.execute(
        f"SELECT DISTINCT t.tenant_id || ':' || t.conversation_id FROM {table} t"
        " JOIN erased_entities e ON e.tenant_id = t.tenant_id AND ("
        "  (e.entity_type = 'conversation' AND e.entity_id = t.conversation_id)"
        "  OR (e.entity_type = 'subject' AND e.subject_type = t.owner_type"
        "      AND e.entity_id = t.owner_id))"
        f" WHERE t.{stamp} <= e.cut_off ORDER BY 1"
    )
    return AuditResult(store, [row[0] for row in await cursor.fetchall()])


async def audit_cache(cache: RedisCache, covered: dict[str, ErasureIndex]) -> AuditResult:
    """Cache entries carry no time of their own, so only memory and conversation erasures
    count here: a new memory about an erased subject has a new id."""
    ghosts: list[str] = []
    for tenant, index in covered.items():
        memories = [k[3] for k in index.entries if k[1] == "memory"]
        conversations = [k[3] for k in index.entries if k[1] == "conversation"]
        if memories or conversations:
            ghosts += await cache.reachable(
                tenant, memory_ids=memories, conversation_ids=conversations
            )
    return AuditResult("cache", sorted(ghosts))


async def audit_ghosts(
    conn: Conn, vectors: VectorStore, cache: RedisCache, now: datetime
) -> dict[str, AuditResult]:
    covered = await load_covered(conn)
    results = [
        await audit_embeddings(vectors, covered),
        await _audit_table(conn, "summaries", "conversation_summaries", "occurred_at"),
        await audit_cache(cache, covered),
        await _audit_table(conn, "context", "conversation_context", "built_at"),
    ]
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


async def latest(conn: Conn) -> dict[str, tuple[int, datetime]]:
    cursor = await conn.execute("SELECT store, ghost_items, audited_at FROM ghost_audits")
    found = {row[0]: (int(row[1]), row[2]) for row in await cursor.fetchall()}
    return {store: found[store] for store in STORES if store in found}
