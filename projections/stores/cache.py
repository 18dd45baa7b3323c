"""The Redis cache of recall results and context views."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from projections.bookkeeping import Conn
from projections.cache.store import Holdings, RedisCache
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
        (erased,) = await self.erase_many([tombstone])
        return erased

    async def erase_many(self, tombstones: Sequence[Tombstone]) -> list[Erased]:
        """Two round trips to invalidate the batch, and one scan per tenant to check it."""
        erasures = [(tombstone.tenant_id, _targets(tombstone)) for tombstone in tombstones]
        removed = await self._cache.invalidate_each(erasures)
        left = await self._cache.reachable_each(erasures)
        return [Erased(count, keys) for count, keys in zip(removed, left, strict=True)]

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


def _targets(tombstone: Tombstone) -> Holdings:
    """What an erasure invalidates: its subject's entries as well as its items'."""
    return Holdings.targets(
        subject_of(tombstone), tombstone.conversation_ids(), tombstone.ids("memory")
    )
