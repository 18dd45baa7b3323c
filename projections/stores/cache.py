"""The Redis cache of recall results and context views."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from projections.cache.entries import Holdings
from projections.cache.port import RecallCache
from projections.deletion.derived import subject_of
from projections.deletion.erasure import ErasureIndex
from projections.sql import Conn
from projections.stores.base import DerivedStore, Erased, StoreResources
from topics.deletion import Tombstone


class CacheStore(DerivedStore):
    name = "cache"
    metrics_port = 9106
    deletion_slo_seconds = 300

    def __init__(self, cache: RecallCache) -> None:
        self._cache = cache

    @classmethod
    def open(cls, resources: StoreResources) -> CacheStore:
        return cls(resources.cache)

    async def erase(self, tombstone: Tombstone) -> Erased:
        (erased,) = await self.erase_many([tombstone])
        return erased

    async def erase_many(self, tombstones: Sequence[Tombstone]) -> list[Erased]:
        """Two round trips to invalidate the batch and two to check it, however many keys
        Redis holds: the check reads what the items' indexes still name, not a scan of the
        keyspace (one per tenant took seconds under load; ops/decisions/cache-erasure.md).
        Entries written behind the indexes' back are the verification probe's to find
        (``reachable``, after every store has acknowledged) and the ghost audit's."""
        removed = await self._cache.invalidate_each(
            [(t.tenant_id, _targets(t)) for t in tombstones]
        )
        left = await self._cache.indexed_each([(t.tenant_id, _items(t)) for t in tombstones])
        return [Erased(count, keys) for count, keys in zip(removed, left, strict=True)]

    async def reachable(self, conn: Conn, tombstone: Tombstone) -> list[str]:
        """Entries that still hold an erased memory or conversation (the tombstone's items),
        found through the indexes and a scan of the tenant's keys.

        Not every entry indexed under an erased subject: a recall after the erasure caches a
        (possibly empty) entry for the subject that holds nothing erased, and a new memory
        about the subject has a new id. The audit and ``erase_many``'s check judge entries
        the same way (``_items``).
        """
        (found,) = await self._cache.reachable_each([(tombstone.tenant_id, _items(tombstone))])
        return found

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


def _items(tombstone: Tombstone) -> Holdings:
    """What an entry must not hold once the tombstone is honoured: its items, not its
    subject (an entry filled after the erasure may be the subject's, holding nothing erased)."""
    return Holdings.targets(None, tombstone.conversation_ids(), tombstone.ids("memory"))
