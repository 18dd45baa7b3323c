"""The cache's contract (tests/support/contracts/cache.py) on each backend: the in-memory
fake without services; under the integration marker, the Redis cache against the real Redis
of ops/stack and against a Redis Cluster of three masters (ops/redis/cluster, started by the
``redis_cluster`` fixture when it is not running), each test in its own namespace; and what
only Redis does, on both: the entries' layout, their TTLs and the indexes' TTLs, a value of
another Redis type, every key of a tenant in its tenant's slot."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

import orjson
import pytest
from redis.asyncio import RedisCluster
from redis.crc import key_slot

from projections.cache.entries import UNREADABLE, Holdings
from projections.cache.keys import TenantKeys, build_key, glob_literal, hash_tag
from projections.cache.port import RecallCache
from projections.cache.store import RedisCache, RedisClient, connect
from streams.settings import Settings
from support.contracts.cache import ALICE, CAROL, CacheContract, Harness, Runner, memory
from support.fakes.cache import InMemoryCache

T = TypeVar("T")


def test_keys_are_unambiguous_and_patterns_literal() -> None:
    assert build_key("a:b", "c") != build_key("a", "b:c")
    assert build_key("a%3Ab") != build_key("a:b")
    assert TenantKeys("ns", "a").cache_pattern() == "ns:cache:{a}:*"
    assert TenantKeys("ns", "a*[x]?\\").cache_pattern() == "ns:cache:{a%2A%5Bx%5D%3F%5C}:*"
    assert glob_literal("a*[x]?\\") == "a\\*\\[x\\]\\?\\\\"


def every_key(keys: TenantKeys) -> list[str]:
    return [
        keys.recall(("user{x}", "}a{"), "q{1}"),
        keys.context("conv{2}"),
        keys.subject_index(("user", "{alice}")),
        keys.memory_index("m}{"),
        keys.conversation_index("{"),
        keys.cache_pattern(),
    ]


@pytest.mark.parametrize("tenant", ["acme", "{acme}", "a}b{c", "}", "{", "a:b", "%7B"])
def test_every_key_of_a_tenant_hashes_to_its_tenant_slot(tenant: str) -> None:
    """The tenant's braces are the key's first pair (every other brace is escaped), so each
    key of the tenant, whatever its ids, is in one Redis Cluster slot: the tenant's."""
    slot = key_slot(hash_tag(tenant)[1:-1].encode())  # Redis hashes what is inside the braces
    for namespace in ("memproj", "ns{x}"):
        for key in every_key(TenantKeys(namespace, tenant)):
            assert key_slot(key.encode()) == slot, key
    assert hash_tag(tenant) != hash_tag(tenant + "x")


def test_an_empty_tenant_has_no_keys() -> None:
    """Empty braces are no hash tag (Redis would hash the whole key): refused."""
    with pytest.raises(ValueError, match="tenant"):
        TenantKeys("ns", "").recall(("user", "alice"), "q")


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


# -- Redis and Redis Cluster -------------------------------------------------------------------

Scenario = Callable[[RedisCache, RedisClient], Awaitable[T]]


def run_redis(
    settings: Settings, namespace: str, scenario: Scenario[T], ttl_seconds: int = 300
) -> T:
    async def main() -> T:
        client = connect(settings.redis_url, settings.redis_cluster)
        try:
            return await scenario(RedisCache(client, ttl_seconds, namespace), client)
        finally:
            await client.aclose()

    return asyncio.run(main())


class RedisHarness:
    def __init__(self, cache: RedisCache, client: RedisClient, namespace: str) -> None:
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

    def __init__(
        self, client: RedisClient, namespace: str, holding: Sequence[dict[str, Any]]
    ) -> None:
        super().__init__(client, 300, namespace)
        self._refill = holding

    async def invalidate_each(self, erasures: Sequence[tuple[str, Holdings]]) -> list[int]:
        removed = await super().invalidate_each(erasures)
        await self.put_recall("acme", ALICE, "q_after", self._refill)
        return removed


class RedisCacheTests(CacheContract):
    """The contract and what only Redis does, on the Redis a subclass's ``redis`` names (in
    a namespace of the test's own, ``namespace``)."""

    @pytest.fixture
    def redis(self) -> Settings:
        raise NotImplementedError("a subclass names the Redis")

    @pytest.fixture
    def namespace(self) -> str:
        raise NotImplementedError("a subclass gives the test a namespace of its own")

    @pytest.fixture
    def run(self, redis: Settings, namespace: str) -> Runner:
        def run(scenario: Callable[[Harness], Coroutine[Any, Any, T]]) -> T:
            async def on_redis(cache: RedisCache, client: RedisClient) -> T:
                return await scenario(RedisHarness(cache, client, namespace))

            return run_redis(redis, namespace, on_redis)

        return run

    def test_entries_are_stored_indexed_and_expire_as_laid_out(
        self, redis: Settings, namespace: str
    ) -> None:
        keys = TenantKeys(namespace, "acme")
        records = [memory("m_tea", "conv_1"), memory("m_city")]
        view = {"items": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}

        async def scenario(cache: RedisCache, client: RedisClient) -> None:
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
            laid_out = [
                recall_key,
                keys.context("conv_1"),
                keys.subject_index(ALICE),
                keys.memory_index("m_tea"),
                keys.memory_index("m_city"),
                keys.conversation_index("conv_1"),
            ]
            for key in laid_out:
                assert 0 < await client.ttl(key) <= 300, key

        run_redis(redis, namespace, scenario)

    def test_an_index_outlives_its_newest_member(self, redis: Settings, namespace: str) -> None:
        keys = TenantKeys(namespace, "acme")

        async def longer(cache: RedisCache, client: RedisClient) -> int:
            await cache.put_recall("acme", ALICE, "q_long", [memory("m_tea")])
            return await client.ttl(keys.subject_index(ALICE))

        async def shorter(cache: RedisCache, client: RedisClient) -> int:
            await cache.put_recall("acme", ALICE, "q_short", [memory("m_tea")])
            return await client.ttl(keys.subject_index(ALICE))

        assert 300 < run_redis(redis, namespace, longer, ttl_seconds=900) <= 900
        assert 300 < run_redis(redis, namespace, shorter, ttl_seconds=60) <= 900

    def test_a_value_of_another_redis_type_is_unreadable_and_reported(
        self, redis: Settings, namespace: str
    ) -> None:
        keys = TenantKeys(namespace, "acme")
        rogue_hash = keys.recall(CAROL, "q_hash")

        async def scenario(cache: RedisCache, client: RedisClient) -> None:
            await client.hset(rogue_hash, "memory_id", "m_x")
            # GET fails on a hash (MGET would answer nil, as if it had expired).
            assert await cache.reachable("acme", memory_ids=["m_x"]) == [rogue_hash]
            assert await cache.reachable("acme", subject=CAROL) == [rogue_hash]
            assert dict(await cache.entries("acme"))[rogue_hash] == UNREADABLE

        run_redis(redis, namespace, scenario)


@pytest.mark.integration
class TestRedisCache(RedisCacheTests):
    @pytest.fixture
    def redis(self, stack: Settings) -> Settings:
        return stack

    @pytest.fixture
    def namespace(self, redis_namespace: str) -> str:
        return redis_namespace


# Tenants whose slots are on each of the three masters of a fresh ``redis-cli --cluster
# create`` (slots 0-5460, 5461-10922, 10923-16383).
SPREAD_TENANTS = ("acme", "beta", "t-0", "t-1", "t-2", "t-3", "t-4", "t-5")


@pytest.mark.integration
class TestRedisClusterCache(RedisCacheTests):
    @pytest.fixture
    def redis(self, redis_cluster: Settings) -> Settings:
        return redis_cluster

    @pytest.fixture
    def namespace(self, redis_cluster_namespace: str) -> str:
        return redis_cluster_namespace

    def test_tenants_spread_over_the_masters_and_a_batch_erases_on_each(
        self, redis: Settings, namespace: str
    ) -> None:
        """Each tenant's keys on its slot's master, the tenants over all three; a batch of
        erasures of tenants on every master is one batch (a transaction per tenant), and
        ``reachable``'s scan of every master finds an unindexed entry wherever it is."""

        async def scenario(cache: RedisCache, client: RedisClient) -> None:
            assert isinstance(client, RedisCluster)
            masters = set()
            for tenant in SPREAD_TENANTS:
                await cache.put_recall(tenant, ALICE, "q_all", [memory(f"m_{tenant}", "c1")])
                key = TenantKeys(namespace, tenant).recall(ALICE, "q_all")
                await client.set(TenantKeys(namespace, tenant).recall(CAROL, "q_rogue"), b"?")
                node = client.get_node_from_key(key)
                assert node is not None
                masters.add(node.name)
            assert len(masters) == 3
            rogues = await cache.reachable_each(
                [(tenant, Holdings.targets(None, [], ["m_none"])) for tenant in SPREAD_TENANTS]
            )
            assert rogues == [
                [TenantKeys(namespace, tenant).recall(CAROL, "q_rogue")]
                for tenant in SPREAD_TENANTS
            ]
            erasures = [(t, Holdings.targets(ALICE, ["c1"], [])) for t in SPREAD_TENANTS]
            assert await cache.invalidate_each(erasures) == [1] * len(SPREAD_TENANTS)
            assert await cache.indexed_each(erasures) == [[] for _ in SPREAD_TENANTS]
            for tenant in SPREAD_TENANTS:
                assert [k for k, _ in await cache.entries(tenant)] == [
                    TenantKeys(namespace, tenant).recall(CAROL, "q_rogue")
                ]

        run_redis(redis, namespace, scenario)


async def stored(client: RedisClient, key: str) -> Any:
    value = await client.get(key)
    assert value is not None, key
    return orjson.loads(value)
