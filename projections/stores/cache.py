"""The Redis cache of recall results and context views."""

from __future__ import annotations

from collections.abc import Mapping

from projections.bookkeeping import Conn
from projections.cache.store import RedisCache
from projections.deletion.derived import subject_of
from projections.deletion.erasure import ErasureIndex
from projections.stores.base import DerivedStore, Erased, StoreResources
from topics.deletion import Tombstone


class CacheStore(DerivedStore):
    name = "cache"
    metrics_port = 9106
    deletion_slo_seconds = 300

    def __init__(self, cache: RedisCache) -> None:
        self._cache = cache

    @classmethod
    def open(cls, resources: StoreResources) -> CacheStore:
        return cls(resources.cache)

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

    async def reachable(self, conn: Conn, tombstone: Tombstone) -> list[str]:
        """Entries that still hold an erased memory or conversation (the tombstone's items).

        Not every entry indexed under an erased subject: a recall after the erasure caches a
        (possibly empty) entry for the subject that holds nothing erased, and a new memory
        about the subject has a new id. The audit judges entries the same way.
        """
        return await self._cache.reachable(
            tombstone.tenant_id,
            conversation_ids=tombstone.conversation_ids(),
            memory_ids=tombstone.ids("memory"),
        )

    async def ghosts(self, conn: Conn, covered: Mapping[str, ErasureIndex]) -> list[str]:
        """Entries carry no time of their own, so only memory and conversation erasures count
        here: a new memory about an erased subject has a new id."""
        found: list[str] = []
        for tenant, index in covered.items():
            memories = [k[3] for k in index.entries if k[1] == "memory"]
            conversations = [k[3] for k in index.entries if k[1] == "conversation"]
            if memories or conversations:
                found += await self._cache.reachable(
                    tenant, memory_ids=memories, conversation_ids=conversations
                )
        return sorted(found)
