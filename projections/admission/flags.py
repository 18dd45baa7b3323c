"""Memories whose cited evidence an erasure removed (table ``memory_evidence_flags``).

A memory admitted on evidence keeps its lifecycle when that evidence is erased later (it may
be erased itself only if the erasure covers it), but it is no longer backed by what it cited:
it is flagged, counted (``memproj_memories_evidence_erased``) and shown by ``memproj memory
show``, not silently kept as it was.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from projections.conversation import store as conversation_store
from projections.deletion.erasure import ErasureScope
from projections.distribution import cross_tenant
from projections.memory import store as memory_store
from projections.sql import Conn


@dataclass(frozen=True, slots=True)
class EvidenceFlag:
    event_id: str
    deletion_id: str
    flagged_at: datetime


async def flag_erased_evidence(
    conn: Conn,
    tenant_id: str,
    deletion_id: str,
    memories: Iterable[str],
    conversations: Iterable[str],
) -> int:
    """Before an erasure removes these memories and conversations (in its transaction): flag
    every other memory of the tenant that cites one of their events. Returns how many
    (memory, event) pairs were flagged."""
    erased_memories = set(memories)
    conversations = list(conversations)
    erased = {
        *await conversation_store.event_ids_of_conversations(conn, tenant_id, conversations),
        *await memory_store.event_ids_of(conn, tenant_id, erased_memories, conversations),
    }
    citing = [
        (memory_id, event_id)
        for memory_id, event_id in await memory_store.memories_citing(conn, tenant_id, erased)
        if memory_id not in erased_memories
    ]
    if not citing:
        return 0
    cursor = await conn.execute(
        "INSERT INTO memory_evidence_flags (tenant_id, memory_id, event_id, deletion_id)"
        " SELECT %s, m, e, %s FROM unnest(%s::text[], %s::text[]) AS f(m, e)"
        " ON CONFLICT DO NOTHING",
        (tenant_id, deletion_id, [m for m, _ in citing], [e for _, e in citing]),
    )
    return cursor.rowcount


async def flags_of(conn: Conn, tenant_id: str, memory_id: str) -> list[EvidenceFlag]:
    cursor = await conn.execute(
        "SELECT event_id, deletion_id, flagged_at FROM memory_evidence_flags"
        " WHERE tenant_id = %s AND memory_id = %s ORDER BY flagged_at, event_id",
        (tenant_id, memory_id),
    )
    return [EvidenceFlag(str(r[0]), str(r[1]), r[2]) for r in await cursor.fetchall()]


async def flagged_memories(conn: Conn) -> int:
    """How many memories are flagged (the gauge)."""
    cursor = await conn.execute(
        cross_tenant("review-gauges")
        + "SELECT count(DISTINCT (tenant_id, memory_id)) FROM memory_evidence_flags"
    )
    row = await cursor.fetchone()
    return 0 if row is None else int(row[0])


async def forget_memories(conn: Conn, tenant_id: str, memories: Iterable[str]) -> None:
    """An erased memory's flags go with it."""
    await conn.execute(
        "DELETE FROM memory_evidence_flags WHERE tenant_id = %s AND memory_id = ANY(%s)",
        (tenant_id, sorted(set(memories))),
    )


async def erase(conn: Conn, scope: ErasureScope) -> None:
    """Memories that cited what an erasure removes are flagged, before it goes; an erased
    memory's own flags go with it."""
    memories = list(scope.memories)
    await flag_erased_evidence(
        conn, scope.tenant_id, scope.deletion_id, memories, list(scope.conversations)
    )
    await forget_memories(conn, scope.tenant_id, memories)
