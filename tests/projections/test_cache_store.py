"""The cache's contract (tests/support/contracts/cache.py) on each backend: the in-memory
fake without services, the Redis cache against the real Redis of ops/stack (each test in its
own namespace) under the integration marker; and what only Redis does: the entries' layout,
their TTLs and the indexes' TTLs, a value of another Redis type."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

import orjson
import pytest
from redis.asyncio import Redis

from projections.cache.store import (
    UNREADABLE,
    Holdings,
    RecallCache,
    RedisCache,
    TenantKeys,
    build_key,
    connect,
    glob_literal,
)
from streams.settings import Settings
from support.contracts.cache import ALICE, CAROL, CacheContract, Harness, Runner, memory
from support.fakes.cache import InMemoryCache

T = TypeVar("T")


def test_keys_are_unambiguous_and_patterns_literal() -> None:
    assert build_key("a:b", "c") != build_key("a", "b:c")
    assert build_key("a%3Ab") != build_key("a:b")
    assert TenantKeys("ns", "a").cache_pattern() == "ns:cache:a:*"
    assert TenantKeys("ns", "a*[x]?\\").cache_pattern() == "ns:cache:a%2A%5Bx%5D%3F%5C:*"
    assert glob_literal("a*[x]?\\") == "a\\*\\[x\\]\\?\\\\"


# -- in memory ---------------------------------------------------------------------------------


class InMemoryHarness:
    def __init__(self) -> None:
        self.namespace = "memproj-test"
        self.memory = InMemoryCache(self.namespace)

    @property
    def cache(self) -> RecallCache:
        return self.memory

    async def write_unindexed(self, key: str, value: bytes) -> None:
        self.memory.write_unindexed(key, value)

    async def delete(self, *keys: str) -> None:
        for key in keys:
            self.memory.values.pop(key, None)

    async def exists(self, key: str) -> bool:
        return self.memory.exists(key)

    def forbid_scan(self, cache: RecallCache) -> None:
        def refused(tenant_id: str) -> set[str]:
            raise AssertionError(f"walked {tenant_id}'s keys: the check must not scan")

        cache._tenant_keys = refused  # type: ignore[attr-defined]

    def another(self, refill: Sequence[dict[str, Any]]) -> RecallCache:
        return InMemoryFilledMeanwhile(self.memory, refill)


class InMemoryFilledMeanwhile(InMemoryCache):
    """The same entries and indexes; Alice's recall is filled again after each invalidation."""

    def __init__(self, shared: InMemoryCache, refill: Sequence[dict[str, Any]]) -> None:
        super().__init__(shared._namespace)
        self.values, self.indexes = shared.values, shared.indexes
        self._refill = refill

    async def invalidate_each(self, erasures: Sequence[tuple[str, Holdings]]) -> list[int]:
        removed = await super().invalidate_each(erasures)
        await self.put_recall("acme", ALICE, "q_after", self._refill)
        return removed


class TestInMemoryCache(CacheContract):
    @pytest.fixture
    def run(self) -> Runner:
        def run(scenario: Callable[[Harness], Coroutine[Any, Any, T]]) -> T:
            return asyncio.run(scenario(InMemoryHarness()))

        return run


# -- Redis -------------------------------------------------------------------------------------

Scenario = Callable[[RedisCache, Redis], Awaitable[T]]


@pytest.fixture
def namespace(redis_namespace: str) -> str:
    return redis_namespace


def run_redis(namespace: str, scenario: Scenario[T], ttl_seconds: int = 300) -> T:
    async def main() -> T:
        client = connect(Settings().redis_url)
        try:
            return await scenario(RedisCache(client, ttl_seconds, namespace), client)
        finally:
            await client.aclose()

    return asyncio.run(main())


class RedisHarness:
    def __init__(self, cache: RedisCache, client: Redis, namespace: str) -> None:
        self.redis = cache
        self.client = client
        self.namespace = namespace

    @property
    def cache(self) -> RecallCache:
        return self.redis

    async def write_unindexed(self, key: str, value: bytes) -> None:
        await self.client.set(key, value)

    async def delete(self, *keys: str) -> None:
        await self.client.delete(*keys)

    async def exists(self, key: str) -> bool:
        return bool(await self.client.exists(key))

    def forbid_scan(self, cache: RecallCache) -> None:
        async def refused(pattern: str) -> set[str]:
            raise AssertionError(f"scanned {pattern}: the check must not walk the keyspace")

        cache._scan = refused  # type: ignore[attr-defined]

    def another(self, refill: Sequence[dict[str, Any]]) -> RecallCache:
        return RedisFilledMeanwhile(self.client, self.namespace, refill)


class RedisFilledMeanwhile(RedisCache):
    """A cache whose recall for Alice is filled again between a batch's invalidation and its
    check, as a read after the erasure may be: with ``holding`` as its records."""

    def __init__(self, client: Redis, namespace: str, holding: Sequence[dict[str, Any]]) -> None:
        super().__init__(client, 300, namespace)
        self._refill = holding

    async def invalidate_each(self, erasures: Sequence[tuple[str, Holdings]]) -> list[int]:
        removed = await super().invalidate_each(erasures)
        await self.put_recall("acme", ALICE, "q_after", self._refill)
        return removed


@pytest.mark.integration
class TestRedisCache(CacheContract):
    @pytest.fixture
    def run(self, namespace: str) -> Runner:
        def run(scenario: Callable[[Harness], Coroutine[Any, Any, T]]) -> T:
            async def on_redis(cache: RedisCache, client: Redis) -> T:
                return await scenario(RedisHarness(cache, client, namespace))

            return run_redis(namespace, on_redis)

        return run

    def test_entries_are_stored_indexed_and_expire_as_laid_out(self, namespace: str) -> None:
        keys = TenantKeys(namespace, "acme")
        records = [memory("m_tea", "conv_1"), memory("m_city")]
        view = {"items": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}

        async def scenario(cache: RedisCache, client: Redis) -> None:
            await cache.put_recall("acme", ALICE, "q_all", records)
            await cache.put_context("acme", "conv_1", ALICE, view)
            recall_key = keys.recall(ALICE, "q_all")
            assert await stored(client, recall_key) == {
                "subject": ["user", "alice"],
                "memory_ids": ["m_tea", "m_city"],
                "records": records,
            }
            assert await stored(client, keys.context("conv_1")) == {
                "conversation_id": "conv_1",
                "owner": ["user", "alice"],
                "view": view,
            }
            assert await client.smembers(keys.subject_index(ALICE)) == {
                recall_key.encode(),
                keys.context("conv_1").encode(),
            }
            assert await client.smembers(keys.memory_index("m_tea")) == {recall_key.encode()}
            assert await client.smembers(keys.conversation_index("conv_1")) == {
                recall_key.encode(),
                keys.context("conv_1").encode(),
            }
            every_key = [
                recall_key,
                keys.context("conv_1"),
                keys.subject_index(ALICE),
                keys.memory_index("m_tea"),
                keys.memory_index("m_city"),
                keys.conversation_index("conv_1"),
            ]
            for key in every_key:
                assert 0 < await client.ttl(key) <= 300, key

        run_redis(namespace, scenario)

    def test_an_index_outlives_its_newest_member(self, namespace: str) -> None:
        keys = TenantKeys(namespace, "acme")

        async def longer(cache: RedisCache, client: Redis) -> int:
            await cache.put_recall("acme", ALICE, "q_long", [memory("m_tea")])
            return await client.ttl(keys.subject_index(ALICE))

        async def shorter(cache: RedisCache, client: Redis) -> int:
            await cache.put_recall("acme", ALICE, "q_short", [memory("m_tea")])
            return await client.ttl(keys.subject_index(ALICE))

        assert 300 < run_redis(namespace, longer, ttl_seconds=900) <= 900
        assert 300 < run_redis(namespace, shorter, ttl_seconds=60) <= 900

    def test_a_value_of_another_redis_type_is_unreadable_and_reported(self, namespace: str) -> None:
        keys = TenantKeys(namespace, "acme")
        rogue_hash = keys.recall(CAROL, "q_hash")

        async def scenario(cache: RedisCache, client: Redis) -> None:
            await client.hset(rogue_hash, "memory_id", "m_x")
            # GET fails on a hash (MGET would answer nil, as if it had expired).
            assert await cache.reachable("acme", memory_ids=["m_x"]) == [rogue_hash]
            assert await cache.reachable("acme", subject=CAROL) == [rogue_hash]
            assert dict(await cache.entries("acme"))[rogue_hash] == UNREADABLE

        run_redis(namespace, scenario)


async def stored(client: Redis, key: str) -> Any:
    value = await client.get(key)
    assert value is not None, key
    return orjson.loads(value)
