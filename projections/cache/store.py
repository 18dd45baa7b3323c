"""Redis cache-aside of recall results and context views, indexed so a deletion finds them.

Every entry expires after the cache's TTL and is indexed by each subject, memory and
conversation it holds, so invalidation needs no scan, and neither does the check that follows
it (``indexed_each``: what the indexes and the known context keys still name). ``reachable``
proves a deletion by scanning anyway, so an entry written behind the indexes' back is found
too; a scan walks the whole keyspace (every namespace's keys), so it is for the ledger's
verification probe and the ghost audit, not for a tombstone's acknowledgement
(ops/decisions/cache-erasure.md). The keys, one slot per tenant, are ``projections.cache.keys``';
what an entry holds, ``projections.cache.entries``'.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson
from redis.asyncio import Redis, RedisCluster
from redis.commands.core import AsyncScript

from projections.cache.entries import (
    UNREADABLE,
    Holdings,
    Subject,
    context_entry,
    decode_entry,
    holdings_of,
    recall_entry,
)
from projections.cache.keys import TenantKeys

# A single Redis or a Redis Cluster (``connect``): the cache and the audit use either alike.
RedisClient = Redis | RedisCluster

READ_BATCH = 500


# The writes are Lua scripts rather than MULTI/EXEC: as atomic, and one command whose keys (all
# of one tenant, so of one slot) route it on a cluster; redis-py's asyncio cluster client
# queues each command of a transaction from a thread of its own, milliseconds of CPU per put
# (ops/decisions/redis-cluster.md).

# KEYS[1]: the entry; KEYS[2..]: its indexes. ARGV: the value, the TTL. An index must outlive
# its newest member: GT alone never sets a TTL on a set just created (Redis counts "no TTL"
# as infinite), hence NX first.
PUT_SCRIPT = """
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
for i = 2, #KEYS do
    redis.call('SADD', KEYS[i], KEYS[1])
    redis.call('EXPIRE', KEYS[i], ARGV[2], 'NX')
    redis.call('EXPIRE', KEYS[i], ARGV[2], 'GT')
end
return 1
"""

# KEYS: the entries of each group, one group after the other, then the indexes. ARGV: the
# number of groups, each group's size, then per index its members' count and the members.
# Answers how many entries of each group existed (an entry in two groups counts for the
# first). Removing only the members read, rather than deleting the sets, keeps an entry that
# a concurrent put indexed meanwhile; Redis drops each set with its last member.
DELETE_SCRIPT = """
local groups = tonumber(ARGV[1])
local key, arg, deleted = 1, groups + 2, {}
for group = 1, groups do
    local count = 0
    for _ = 1, tonumber(ARGV[group + 1]) do
        count = count + redis.call('DEL', KEYS[key])
        key = key + 1
    end
    deleted[group] = count
end
for index = key, #KEYS do
    local members = tonumber(ARGV[arg])
    for member = arg + 1, arg + members do
        redis.call('SREM', KEYS[index], ARGV[member])
    end
    arg = arg + members + 1
end
return deleted
"""


def connect(url: str, cluster: bool = False) -> RedisClient:
    """A client of the Redis at ``url``, or of the Redis Cluster one of whose nodes it names
    (redis-py's ``RedisCluster`` finds the others and routes each key to its slot's master)."""
    if cluster:
        return RedisCluster.from_url(url, decode_responses=False)
    return Redis.from_url(url, decode_responses=False)


class RedisCache:
    """Recall results and context views of every tenant, each entry expiring after
    ``ttl_seconds`` and indexed under each subject, memory and conversation it holds."""

    def __init__(
        self, redis: RedisClient, ttl_seconds: int = 300, namespace: str = "memproj"
    ) -> None:
        if ttl_seconds <= 0:
            raise ValueError(f"ttl_seconds must be positive, not {ttl_seconds}")
        self._redis = redis
        self._ttl_seconds = ttl_seconds
        self._namespace = namespace
        self._scripts: dict[str, AsyncScript] = {}

    def _keys(self, tenant_id: str) -> TenantKeys:
        return TenantKeys(self._namespace, tenant_id)

    async def get_recall(
        self, tenant_id: str, subject: Subject, query_key: str
    ) -> list[dict[str, Any]] | None:
        entry = await self._get(self._keys(tenant_id).recall(subject, query_key))
        records = entry.get("records") if entry else None
        return records if isinstance(records, list) else None

    async def put_recall(
        self,
        tenant_id: str,
        subject: Subject,
        query_key: str,
        records: Sequence[Mapping[str, Any]],
    ) -> None:
        keys = self._keys(tenant_id)
        await self._put(keys, keys.recall(subject, query_key), recall_entry(subject, records))

    async def get_context(self, tenant_id: str, conversation_id: str) -> dict[str, Any] | None:
        entry = await self._get(self._keys(tenant_id).context(conversation_id))
        view = entry.get("view") if entry else None
        return view if isinstance(view, dict) else None

    async def put_context(
        self, tenant_id: str, conversation_id: str, owner: Subject, view: Mapping[str, Any]
    ) -> None:
        keys = self._keys(tenant_id)
        entry = context_entry(conversation_id, owner, view)
        await self._put(keys, keys.context(conversation_id), entry)

    async def invalidate(
        self,
        tenant_id: str,
        *,
        subject: Subject | None = None,
        conversation_ids: Sequence[str] = (),
        memory_ids: Sequence[str] = (),
    ) -> int:
        """Delete every entry indexed under any of the targets; the number of entries deleted."""
        targets = Holdings.targets(subject, conversation_ids, memory_ids)
        (deleted,) = await self.invalidate_each([(tenant_id, targets)])
        return deleted

    async def invalidate_each(self, erasures: Sequence[tuple[str, Holdings]]) -> list[int]:
        """``invalidate`` of each (tenant, targets), in two round trips for them all: the
        indexes read in one pipeline, then each tenant's entries deleted atomically, in one
        script of its own (its keys share a slot), every tenant's at once. How many
        entries each deleted, counted as if one after the other (an entry two erasures
        share counts for the first)."""
        keys = [(self._keys(tenant_id), targets) for tenant_id, targets in erasures]
        members = await self._members(
            list(dict.fromkeys(i for tenant, targets in keys for i in tenant.indexes(targets)))
        )
        # A context entry's key is known from its conversation: delete it even if unindexed.
        doomed = [
            set(map(tenant.context, targets.conversation_ids)).union(
                *(members[index] for index in tenant.indexes(targets))
            )
            for tenant, targets in keys
        ]
        positions: dict[str, list[int]] = {}
        read: dict[str, dict[str, set[str]]] = {}
        for position, (tenant, targets) in enumerate(keys):
            if doomed[position]:
                positions.setdefault(tenant.tenant_id, []).append(position)
                found = read.setdefault(tenant.tenant_id, {})
                found.update((i, members[i]) for i in tenant.indexes(targets) if members[i])
        counts = await asyncio.gather(
            *(
                self._delete([doomed[p] for p in mine], read[tenant_id])
                for tenant_id, mine in positions.items()
            )
        )
        deleted = [0] * len(erasures)
        for mine, tenant_counts in zip(positions.values(), counts, strict=True):
            for position, count in zip(mine, tenant_counts, strict=True):
                deleted[position] = count
        return deleted

    async def _delete(
        self, entries: Sequence[set[str]], members: Mapping[str, set[str]]
    ) -> list[int]:
        """One tenant's invalidation, atomically (one script): each set of entries deleted (how
        many of each existed), and the members read removed from their indexes."""
        groups = [sorted(each) for each in entries]
        indexes = list(members)
        arguments: list[str | int] = [len(groups), *map(len, groups)]
        for index in indexes:
            arguments += [len(members[index]), *sorted(members[index])]
        keys = [key for group in groups for key in group] + indexes
        replies = await self._script(DELETE_SCRIPT)(keys=keys, args=arguments)
        return [int(reply) for reply in replies]

    async def reachable(
        self,
        tenant_id: str,
        *,
        subject: Subject | None = None,
        conversation_ids: Sequence[str] = (),
        memory_ids: Sequence[str] = (),
    ) -> list[str]:
        """Keys of the tenant's entries still holding any of the targets, found through the
        indexes and by scanning every cache key of the tenant. A value that cannot be read as
        an entry is reported too: nothing proves it does not hold them. Empty: none left."""
        targets = Holdings.targets(subject, conversation_ids, memory_ids)
        (found,) = await self.reachable_each([(tenant_id, targets)])
        return found

    async def reachable_each(self, erasures: Sequence[tuple[str, Holdings]]) -> list[list[str]]:
        """``reachable`` of each (tenant, targets), sorted keys each: one scan per tenant and
        one read of every candidate for them all."""
        scanned = {
            tenant_id: await self._scan(self._keys(tenant_id).cache_pattern())
            for tenant_id in dict.fromkeys(tenant_id for tenant_id, _ in erasures)
        }
        return await self._holding(erasures, lambda tenant_id: scanned[tenant_id])

    async def indexed_each(self, erasures: Sequence[tuple[str, Holdings]]) -> list[list[str]]:
        """Of each (tenant, targets), the entries that the targets' indexes or their context
        keys name and that hold any of the targets (or cannot be read as an entry), sorted:
        what an invalidation left of the cache's own writes, every one indexed in the
        script that wrote it. In two round trips, however many keys Redis holds; an
        entry written behind the indexes' back is ``reachable_each``'s to find."""
        return await self._holding(erasures, lambda _: set())

    async def _holding(
        self,
        erasures: Sequence[tuple[str, Holdings]],
        also: Callable[[str], set[str]],
    ) -> list[list[str]]:
        """The rule of ``reachable_each`` and ``indexed_each``: each erasure's candidates (its
        indexes' members, its context keys, and ``also`` of its tenant) that still exist and
        hold any of its targets, or that are not an entry (nothing proves they do not)."""
        keys = [(self._keys(tenant_id), targets) for tenant_id, targets in erasures]
        members = await self._members(
            list(dict.fromkeys(i for tenant, targets in keys for i in tenant.indexes(targets)))
        )
        candidates = [
            also(tenant.tenant_id).union(
                map(tenant.context, targets.conversation_ids),
                *(members[index] for index in tenant.indexes(targets)),
            )
            for tenant, targets in keys
        ]
        entries = {key: entry async for key, entry in self._read(set().union(*candidates))}
        return [
            [
                key
                for key in sorted(mine)
                if key in entries
                and ((entry := entries[key]) is None or holdings_of(entry).overlaps(targets))
            ]
            for mine, (_, targets) in zip(candidates, keys, strict=True)
        ]

    async def entries(self, tenant_id: str) -> list[tuple[str, dict[str, Any]]]:
        """Every cache entry of the tenant, sorted by key; ``UNREADABLE`` stands for a value
        that is not an entry."""
        keys = await self._scan(self._keys(tenant_id).cache_pattern())
        return [
            (key, dict(UNREADABLE) if entry is None else entry)
            async for key, entry in self._read(keys)
        ]

    async def _get(self, key: str) -> dict[str, Any] | None:
        value = await self._redis.get(key)
        return None if value is None else decode_entry(value)

    async def _put(self, keys: TenantKeys, key: str, entry: dict[str, Any]) -> None:
        """The entry and its indexes, atomically (one script)."""
        indexes = keys.indexes(holdings_of(entry))
        put = self._script(PUT_SCRIPT)
        await put(keys=[key, *indexes], args=[orjson.dumps(entry), self._ttl_seconds])

    def _script(self, text: str) -> AsyncScript:
        if text not in self._scripts:
            self._scripts[text] = self._redis.register_script(text)
        return self._scripts[text]

    async def _members(self, indexes: Sequence[str]) -> dict[str, set[str]]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for index in indexes:
                pipe.smembers(index)
            found = await pipe.execute()
        return {
            index: {member.decode() for member in members}
            for index, members in zip(indexes, found, strict=True)
        }

    async def _scan(self, pattern: str) -> set[str]:
        # A set, because SCAN may return a key more than once. On a cluster, redis-py scans
        # every master: a key is found wherever it lives, a slot being migrated included.
        keys = self._redis.scan_iter(match=pattern, count=READ_BATCH)
        return {key.decode() async for key in keys}

    async def _read(self, keys: Iterable[str]) -> AsyncIterator[tuple[str, dict[str, Any] | None]]:
        """Each key that still exists, in order, with its entry (None: not an entry)."""
        ordered = sorted(keys)
        for start in range(0, len(ordered), READ_BATCH):
            batch = ordered[start : start + READ_BATCH]
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in batch:
                    pipe.get(key)
                # GETs rather than MGET: MGET answers nil for a hash or set written under a
                # cache key, as if it had expired; GET fails on it instead.
                values = await pipe.execute(raise_on_error=False)
            for key, value in zip(batch, values, strict=True):
                if value is not None:
                    yield key, decode_entry(value) if isinstance(value, bytes) else None
