"""The verification probe: after every store has acknowledged a deletion, try to read the
target back from everywhere a reader could: the projections (what recall and the context view
read), the vector store (by item ids, and by content, with vectors of the erased text kept
for this purpose only), and the cache."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from projections.bookkeeping import Conn
from projections.cache.store import RedisCache
from projections.deletion import lifecycle, store
from projections.deletion.derived import erased_by, match_of, subject_of
from projections.embeddings.vectors import VectorStore, memory_entry_id
from topics.deletion import Tombstone

# A subject's erasure covers what it had up to the cut-off; what it has since is new data.
_OF_TARGET = (
    " WHERE tenant_id = %(tenant)s AND (conversation_id = ANY(%(conversations)s)"
    " OR (owner_type = %(subject_type)s AND owner_id = %(subject_id)s AND {at} <= %(cut_off)s))"
)
_MEMORIES_OF_TARGET = (
    " WHERE tenant_id = %(tenant)s AND (memory_id = ANY(%(memories)s)"
    " OR source_conversation_id = ANY(%(conversations)s)"
    " OR (subject_type = %(subject_type)s AND subject_id = %(subject_id)s"
    " AND {at} <= %(cut_off)s))"
)
# What the projections still hold of an erased target, table by table.
_PROJECTION_CHECKS: dict[str, str] = {
    "memories": "SELECT count(*) FROM memories" + _MEMORIES_OF_TARGET.format(at="created_at"),
    "memory_versions": "SELECT count(*) FROM memory_versions"
    + _MEMORIES_OF_TARGET.format(at="occurred_at"),
    "conversations": "SELECT count(*) FROM conversations" + _OF_TARGET.format(at="started_at"),
    "messages": "SELECT count(*) FROM conversation_messages" + _OF_TARGET.format(at="occurred_at"),
    "summaries": "SELECT count(*) FROM conversation_summaries"
    + _OF_TARGET.format(at="occurred_at"),
    "context_views": "SELECT count(*) FROM conversation_context" + _OF_TARGET.format(at="built_at"),
}
# A revocation keeps the revoked row and its history; only recall must not return it.
_RECALLABLE = (
    "SELECT count(*) FROM memories WHERE tenant_id = %(tenant)s"
    " AND memory_id = ANY(%(memories)s) AND status <> 'revoked'"
)


async def verify(
    conn: Conn, vectors: VectorStore, cache: RedisCache, tenant_id: str, deletion_id: str
) -> dict[str, Any]:
    tombstone = await lifecycle.tombstone_of(conn, tenant_id, deletion_id)
    found: dict[str, Any] = {}
    memories = tombstone.ids("memory")
    subject_type, subject_id = subject_of(tombstone) or (None, None)
    params = {
        "tenant": tenant_id,
        "memories": memories,
        "conversations": tombstone.conversation_ids(),
        "subject_type": subject_type,
        "subject_id": subject_id,
        "cut_off": tombstone.cut_off,
    }
    checks = _PROJECTION_CHECKS if tombstone.kind == "erasure" else {"recallable": _RECALLABLE}
    for name, query in checks.items():
        found[name] = await _count(conn, query, params)
    match = match_of(tombstone)
    found["vectors_by_target"] = [
        e.id for e in erased_by(tombstone, await asyncio.to_thread(vectors.find, match))
    ]
    found["vectors_by_id"] = [
        e.id
        for e in await asyncio.to_thread(
            vectors.get, [memory_entry_id(tenant_id, m) for m in memories]
        )
    ]
    found["vectors_by_content"] = await _content_hits(conn, vectors, tombstone)
    found["vector_history_versions"] = await asyncio.to_thread(vectors.history_versions)
    found["cache"] = await cache_reachable(cache, tombstone)
    clean = all(not value for value in found.values())
    return {"clean": clean, "found": found}


async def cache_reachable(cache: RedisCache, tombstone: Tombstone) -> list[str]:
    """Cache entries that still hold an erased memory or conversation (the tombstone's items).

    Not every entry indexed under an erased subject: a recall after the erasure caches a
    (possibly empty) entry for the subject that holds nothing erased, and a new memory about
    the subject has a new id. The reconciliation audit judges cache entries the same way.
    """
    return await cache.reachable(
        tombstone.tenant_id,
        conversation_ids=tombstone.conversation_ids(),
        memory_ids=tombstone.ids("memory"),
    )


async def _count(conn: Conn, query: str, params: Mapping[str, Any]) -> int:
    cursor = await conn.execute(query.encode(), params)
    row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def _content_hits(conn: Conn, vectors: VectorStore, tombstone: Tombstone) -> list[str]:
    """Search with the vectors of the erased text: any hit that belongs to the target is a
    copy that survived under another id."""
    match = match_of(tombstone)
    hits: set[str] = set()
    for _, _, vector in await store.load_probes(conn, tombstone.tenant_id, tombstone.deletion_id):
        for hit in await asyncio.to_thread(vectors.search, tombstone.tenant_id, vector, 5):
            if match.matches(hit.entry):
                hits.add(hit.entry.id)
    return sorted(hits)
