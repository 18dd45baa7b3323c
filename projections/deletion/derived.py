"""The derived stores a tombstone must reach, each able to remove a tombstone's items and to
prove they are unreachable afterwards.

A store removes by the tombstone's item ids and by its target (the subject, the conversations,
the memories), so that a copy written under the target after the items were resolved is
removed too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from psycopg_pool import AsyncConnectionPool

from projections.bookkeeping import Conn
from projections.cache.store import RedisCache
from projections.embeddings.vectors import Match, VectorEntry, VectorStore, message_entry_id
from topics.deletion import StoreName, Tombstone


@dataclass(frozen=True, slots=True)
class Erased:
    removed: int
    # What of the tombstone's items can still be read in the store; empty means verified.
    reachable: list[str]


class DerivedStore(Protocol):
    @property
    def name(self) -> StoreName: ...

    async def erase(self, tombstone: Tombstone) -> Erased:
        """Remove every copy of the tombstone's items, then check they are unreachable."""
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


def erased_by(tombstone: Tombstone, found: Sequence[VectorEntry]) -> list[VectorEntry]:
    """Of the entries ``match_of(tombstone)`` found, those the tombstone erases: every entry
    of its items, and of its subject only what occurred up to the cut-off. The subject may
    have new data from after the erasure, which a late or redelivered tombstone must keep."""
    listed = replace(match_of(tombstone), subject=None)
    return [
        entry for entry in found if listed.matches(entry) or entry.occurred_at <= tombstone.cut_off
    ]


class EmbeddingsStore:
    """The vector store. Removal is complete only once old table versions are gone too: a
    removed vector must not stay readable through the store's history.

    ``writes`` is the lock the worker's index updates take too: between removing, purging
    the history and checking, no other write adds a table version.
    """

    name: StoreName = "embeddings"

    def __init__(self, vectors: VectorStore, writes: asyncio.Lock) -> None:
        self._vectors = vectors
        self._writes = writes

    async def erase(self, tombstone: Tombstone) -> Erased:
        match = match_of(tombstone)
        async with self._writes:
            found = await asyncio.to_thread(self._vectors.find, match)
            doomed = tuple(entry.id for entry in erased_by(tombstone, found))
            removed = await asyncio.to_thread(
                self._vectors.remove, Match(tombstone.tenant_id, entry_ids=doomed)
            )
            await asyncio.to_thread(self._vectors.purge_history)
            found = await asyncio.to_thread(self._vectors.find, match)
            left = [entry.id for entry in erased_by(tombstone, found)]
            versions = await asyncio.to_thread(self._vectors.history_versions)
        if versions:
            left.append(f"{versions} old table versions")
        return Erased(removed, left)


class CacheStore:
    name: StoreName = "cache"

    def __init__(self, cache: RedisCache) -> None:
        self._cache = cache

    async def erase(self, tombstone: Tombstone) -> Erased:
        tenant = tombstone.tenant_id
        subject = subject_of(tombstone)
        conversations = tombstone.conversation_ids()
        memories = tombstone.ids("memory")
        removed = await self._cache.invalidate(
            tenant, subject=subject, conversation_ids=conversations, memory_ids=memories
        )
        left = await self._cache.reachable(
            tenant, subject=subject, conversation_ids=conversations, memory_ids=memories
        )
        return Erased(removed, left)


# When a row came to be: a subject's erasure covers its rows up to the cut-off only.
_TIME_COLUMNS = {"conversation_summaries": "occurred_at", "conversation_context": "built_at"}


class ConversationTableStore:
    """A derived table of the conversation projection, keyed by conversation and owner:
    ``conversation_summaries`` (the summaries store) or ``conversation_context`` (the context
    views)."""

    def __init__(self, name: StoreName, table: str, pool: AsyncConnectionPool[Conn]) -> None:
        self.name = name
        self._table = table
        self._time_column = _TIME_COLUMNS[table]
        self._pool = pool

    def _criteria(self, tombstone: Tombstone) -> tuple[str, tuple[object, ...]]:
        subject = subject_of(tombstone)
        return (
            f" FROM {self._table} WHERE tenant_id = %s AND (conversation_id = ANY(%s)"
            f" OR (owner_type = %s AND owner_id = %s AND {self._time_column} <= %s))",
            (
                tombstone.tenant_id,
                tombstone.conversation_ids(),
                subject[0] if subject else None,
                subject[1] if subject else None,
                tombstone.cut_off,
            ),
        )

    async def erase(self, tombstone: Tombstone) -> Erased:
        criteria, params = self._criteria(tombstone)
        async with self._pool.connection() as conn:
            removed = await conn.execute(f"DELETE{criteria}".encode(), params)
            await conn.commit()
            left = await conn.execute(f"SELECT conversation_id{criteria}".encode(), params)
            return Erased(
                removed.rowcount, [f"{self._table}:{row[0]}" for row in await left.fetchall()]
            )
