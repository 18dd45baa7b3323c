"""The derived stores a tombstone must reach, each able to remove a tombstone's items and to
prove they are unreachable afterwards.

A store removes by the tombstone's item ids and by its target (the subject, the conversations,
the memories), so that a copy written under the target after the items were resolved is
removed too.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from psycopg_pool import AsyncConnectionPool

from projections.bookkeeping import Conn
from projections.cache.store import RedisCache
from projections.embeddings.vectors import Match, VectorStore, message_entry_id
from topics.deletion import StoreName, Tombstone


class DerivedStore(Protocol):
    @property
    def name(self) -> StoreName: ...

    async def remove(self, tombstone: Tombstone) -> int:
        """Remove every copy of the tombstone's items; return how many were removed."""
        ...

    async def reachable(self, tombstone: Tombstone) -> list[str]:
        """What of the tombstone's items can still be read here; empty means verified."""
        ...


def subject_of(tombstone: Tombstone) -> tuple[str, str] | None:
    subject = tombstone.target.subject()
    return (subject.type, subject.id) if subject is not None else None


def match_of(tombstone: Tombstone) -> Match:
    return Match(
        tenant_id=tombstone.tenant_id,
        subject=subject_of(tombstone),
        conversation_ids=tuple(tombstone.conversation_ids()),
        memory_ids=tuple(tombstone.ids("memory")),
        entry_ids=tuple(
            message_entry_id(tombstone.tenant_id, item.conversation_id, item.id)
            for item in tombstone.items
            if item.type == "message" and item.conversation_id is not None
        ),
    )


class EmbeddingsStore:
    """The vector store. Removal is complete only once old table versions are gone too: a
    removed vector must not stay readable through the store's history."""

    name: StoreName = "embeddings"

    def __init__(self, vectors: VectorStore) -> None:
        self._vectors = vectors

    async def remove(self, tombstone: Tombstone) -> int:
        removed = await asyncio.to_thread(self._vectors.remove, match_of(tombstone))
        await asyncio.to_thread(self._vectors.purge_history)
        return removed

    async def reachable(self, tombstone: Tombstone) -> list[str]:
        left = [
            entry.id for entry in await asyncio.to_thread(self._vectors.find, match_of(tombstone))
        ]
        versions = await asyncio.to_thread(self._vectors.history_versions)
        if versions:
            left.append(f"{versions} old table versions")
        return left


class CacheStore:
    name: StoreName = "cache"

    def __init__(self, cache: RedisCache) -> None:
        self._cache = cache

    async def remove(self, tombstone: Tombstone) -> int:
        return await self._cache.invalidate(
            tombstone.tenant_id,
            subject=subject_of(tombstone),
            conversation_ids=tombstone.conversation_ids(),
            memory_ids=tombstone.ids("memory"),
        )

    async def reachable(self, tombstone: Tombstone) -> list[str]:
        return await self._cache.reachable(
            tombstone.tenant_id,
            subject=subject_of(tombstone),
            conversation_ids=tombstone.conversation_ids(),
            memory_ids=tombstone.ids("memory"),
        )


class ConversationTableStore:
    """A derived table of the conversation projection, keyed by conversation and owner:
    ``conversation_summaries`` (the summaries store) or ``conversation_context`` (the context
    views)."""

    def __init__(self, name: StoreName, table: str, pool: AsyncConnectionPool[Conn]) -> None:
        self.name = name
        self._table = table
        self._pool = pool

    def _criteria(self, tombstone: Tombstone) -> tuple[str, tuple[object, ...]]:
        subject = subject_of(tombstone)
        return (
            f" FROM {self._table} WHERE tenant_id = %s AND (conversation_id = ANY(%s)"
            " OR (owner_type = %s AND owner_id = %s))",
            (
                tombstone.tenant_id,
                tombstone.conversation_ids(),
                subject[0] if subject else None,
                subject[1] if subject else None,
            ),
        )

    async def remove(self, tombstone: Tombstone) -> int:
        criteria, params = self._criteria(tombstone)
        async with self._pool.connection() as conn:
            cursor = await conn.execute(f"DELETE{criteria}".encode(), params)
            return cursor.rowcount

    async def reachable(self, tombstone: Tombstone) -> list[str]:
        criteria, params = self._criteria(tombstone)
        async with self._pool.connection() as conn:
            cursor = await conn.execute(f"SELECT conversation_id{criteria}".encode(), params)
            return [f"{self._table}:{row[0]}" for row in await cursor.fetchall()]
