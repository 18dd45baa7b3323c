"""The Redis cache store against the real Redis of ops/stack: each test in its own namespace.
Also the derived store's ``erase_many`` on it (projections/stores/cache.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from uuid import uuid4

import orjson
import pytest
import redis
from redis.asyncio import Redis

from projections.cache.store import (
    UNREADABLE,
    Holdings,
    RedisCache,
    TenantKeys,
    build_key,
    connect,
    glob_literal,
    key_part,
)
from projections.stores.cache import CacheStore
from streams.settings import Settings
from topics.deletion import DeletionTarget, Tombstone, TombstoneItem

pytestmark = pytest.mark.integration

T = TypeVar("T")
Scenario = Callable[[RedisCache, Redis], Awaitable[T]]

ALICE = ("user", "alice")
BOB = ("user", "bob")
CAROL = ("user", "carol")


@pytest.fixture
def namespace() -> Iterator[str]:
    url = Settings().redis_url
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"Redis at {url} is not answering (ops/stack up): {exc}")
    name = f"memproj-test-{uuid4().hex}"
    try:
        yield name
    finally:
        leftovers = list(client.scan_iter(match=glob_literal(key_part(name)) + ":*"))
        if leftovers:
            client.delete(*leftovers)
        client.close()


def run(namespace: str, scenario: Scenario[T], ttl_seconds: int = 300) -> T:
    async def main() -> T:
        client = connect(Settings().redis_url)
        try:
            return await scenario(RedisCache(client, ttl_seconds, namespace), client)
        finally:
            await client.aclose()

    return asyncio.run(main())


def memory(memory_id: str, conversation_id: str | None = None) -> dict[str, Any]:
    record: dict[str, Any] = {"memory_id": memory_id, "value": {"text": f"fact {memory_id}"}}
    if conversation_id is not None:
        record["source"] = {"type": "message", "ref": f"{conversation_id}/msg_2"}
    return record


async def stored(client: Redis, key: str) -> Any:
    value = await client.get(key)
    assert value is not None, key
    return orjson.loads(value)


def test_keys_are_unambiguous_and_patterns_literal() -> None:
    assert build_key("a:b", "c") != build_key("a", "b:c")
    assert build_key("a%3Ab") != build_key("a:b")
    assert TenantKeys("ns", "a").cache_pattern() == "ns:cache:a:*"
    assert TenantKeys("ns", "a*[x]?\\").cache_pattern() == "ns:cache:a%2A%5Bx%5D%3F%5C:*"
    assert glob_literal("a*[x]?\\") == "a\\*\\[x\\]\\?\\\\"


def test_roundtrip_and_ttls(namespace: str) -> None:
    keys = TenantKeys(namespace, "acme")
    records = [memory("m_tea", "conv_1"), memory("m_city")]
    view = {"items": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}

    async def scenario(cache: RedisCache, client: Redis) -> None:
        await cache.put_recall("acme", ALICE, "q_all", records)
        await cache.put_context("acme", "conv_1", ALICE, view)
        assert await cache.get_recall("acme", ALICE, "q_all") == records
        assert await cache.get_recall("acme", ALICE, "q_other") is None
        assert await cache.get_recall("beta", ALICE, "q_all") is None
        assert await cache.get_context("acme", "conv_1") == view
        assert await cache.get_context("acme", "conv_2") is None

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
        assert [key for key, _ in await cache.entries("acme")] == sorted(
            [recall_key, keys.context("conv_1")]
        )

    run(namespace, scenario)


def test_an_index_outlives_its_newest_member(namespace: str) -> None:
    keys = TenantKeys(namespace, "acme")

    async def longer(cache: RedisCache, client: Redis) -> int:
        await cache.put_recall("acme", ALICE, "q_long", [memory("m_tea")])
        return await client.ttl(keys.subject_index(ALICE))

    async def shorter(cache: RedisCache, client: Redis) -> int:
        await cache.put_recall("acme", ALICE, "q_short", [memory("m_tea")])
        return await client.ttl(keys.subject_index(ALICE))

    assert 300 < run(namespace, longer, ttl_seconds=900) <= 900
    assert 300 < run(namespace, shorter, ttl_seconds=60) <= 900


def test_invalidate_by_subject_spares_other_subjects_and_tenants(namespace: str) -> None:
    keys = TenantKeys(namespace, "acme")

    async def scenario(cache: RedisCache, client: Redis) -> None:
        await cache.put_recall("acme", ALICE, "q_all", [memory("m_tea", "conv_1")])
        await cache.put_recall("acme", ALICE, "q_recent", [memory("m_city")])
        await cache.put_context("acme", "conv_1", ALICE, {"items": []})
        await cache.put_recall("acme", BOB, "q_all", [memory("m_bob")])
        await cache.put_context("acme", "conv_bob", BOB, {"items": []})
        await cache.put_recall("beta", ALICE, "q_all", [memory("m_tea", "conv_1")])

        assert await cache.invalidate("acme", subject=ALICE) == 3

        assert await cache.get_recall("acme", ALICE, "q_all") is None
        assert await cache.get_recall("acme", ALICE, "q_recent") is None
        assert await cache.get_context("acme", "conv_1") is None
        assert await cache.get_recall("acme", BOB, "q_all") == [memory("m_bob")]
        assert await cache.get_context("acme", "conv_bob") == {"items": []}
        assert await cache.get_recall("beta", ALICE, "q_all") == [memory("m_tea", "conv_1")]
        assert await cache.reachable("acme", subject=ALICE) == []
        assert await cache.reachable("beta", subject=ALICE) == [
            TenantKeys(namespace, "beta").recall(ALICE, "q_all")
        ]
        assert not await client.exists(keys.subject_index(ALICE))
        assert await cache.invalidate("acme", subject=ALICE) == 0

    run(namespace, scenario)


def test_invalidate_by_memory_removes_it_from_every_subject(namespace: str) -> None:
    async def scenario(cache: RedisCache, client: Redis) -> None:
        await cache.put_recall("acme", ALICE, "q_all", [memory("m_shared"), memory("m_tea")])
        await cache.put_recall("acme", BOB, "q_all", [memory("m_shared")])
        await cache.put_recall("acme", BOB, "q_recent", [memory("m_bob")])
        await cache.put_recall("acme", CAROL, "q_all", [memory("m_carol")])
        await cache.put_recall("beta", ALICE, "q_all", [memory("m_shared")])

        assert await cache.invalidate("acme", memory_ids=["m_shared"]) == 2

        assert await cache.get_recall("acme", ALICE, "q_all") is None
        assert await cache.get_recall("acme", BOB, "q_all") is None
        assert await cache.get_recall("acme", BOB, "q_recent") == [memory("m_bob")]
        assert await cache.get_recall("acme", CAROL, "q_all") == [memory("m_carol")]
        assert await cache.get_recall("beta", ALICE, "q_all") == [memory("m_shared")]
        assert await cache.reachable("acme", memory_ids=["m_shared", "m_tea"]) == []
        # m_tea's entry went with m_shared: its index is left with a dangling member only.
        assert await cache.invalidate("acme", memory_ids=["m_tea"]) == 0

    run(namespace, scenario)


def test_invalidate_by_conversation_follows_memory_sources(namespace: str) -> None:
    keys = TenantKeys(namespace, "acme")

    async def scenario(cache: RedisCache, client: Redis) -> None:
        await cache.put_context("acme", "conv_1", ALICE, {"items": [1]})
        await cache.put_context("acme", "conv_2", ALICE, {"items": [2]})
        await cache.put_recall("acme", ALICE, "q_all", [memory("m_tea", "conv_1")])
        await cache.put_recall("acme", BOB, "q_all", [memory("m_bob", "conv_2")])
        await cache.put_recall("acme", CAROL, "q_all", [memory("m_carol")])

        assert await cache.invalidate("acme", conversation_ids=["conv_1"]) == 2

        assert await cache.get_context("acme", "conv_1") is None
        assert await cache.get_recall("acme", ALICE, "q_all") is None
        assert await cache.get_context("acme", "conv_2") == {"items": [2]}
        assert await cache.get_recall("acme", BOB, "q_all") == [memory("m_bob", "conv_2")]
        assert await cache.get_recall("acme", CAROL, "q_all") == [memory("m_carol")]
        assert await cache.reachable("acme", conversation_ids=["conv_1"]) == []
        assert await cache.reachable("acme", conversation_ids=["conv_2"]) == sorted(
            [keys.context("conv_2"), keys.recall(BOB, "q_all")]
        )
        assert not await client.exists(keys.conversation_index("conv_1"))

    run(namespace, scenario)


def test_reachable_finds_entries_written_behind_the_index(namespace: str) -> None:
    keys = TenantKeys(namespace, "acme")
    rogue_recall = keys.recall(CAROL, "q_rogue")
    rogue_context = keys.context("conv_rogue")
    rogue_hash = keys.recall(CAROL, "q_hash")

    async def scenario(cache: RedisCache, client: Redis) -> None:
        await cache.put_recall("acme", ALICE, "q_all", [memory("m_tea")])
        rogue = {"subject": ["user", "carol"], "memory_ids": [], "records": [memory("m_x", "c9")]}
        await client.set(rogue_recall, orjson.dumps(rogue))
        await client.set(rogue_context, orjson.dumps({"conversation_id": "conv_rogue"}))
        await client.hset(rogue_hash, "memory_id", "m_x")

        assert await cache.invalidate("acme", memory_ids=["m_x"]) == 0
        # The hash cannot be read as an entry, so it is reported whatever the targets.
        assert await cache.reachable("acme", memory_ids=["m_x"]) == [rogue_hash, rogue_recall]
        assert await cache.reachable("acme", conversation_ids=["c9"]) == [
            rogue_hash,
            rogue_recall,
        ]
        assert await cache.reachable("acme", subject=CAROL) == [rogue_hash, rogue_recall]
        assert await cache.reachable("acme", conversation_ids=["conv_rogue"]) == [
            rogue_context,
            rogue_hash,
        ]
        assert await cache.reachable("beta", memory_ids=["m_x"], subject=CAROL) == []
        assert dict(await cache.entries("acme"))[rogue_hash] == UNREADABLE

        # Known from its conversation, the unindexed context entry is still invalidated.
        assert await cache.invalidate("acme", conversation_ids=["conv_rogue"]) == 1
        await client.delete(rogue_recall, rogue_hash)
        assert await cache.reachable("acme", memory_ids=["m_x"], subject=CAROL) == []
        assert [key for key, _ in await cache.entries("acme")] == [keys.recall(ALICE, "q_all")]

    run(namespace, scenario)


def test_ids_with_separators_and_glob_characters_stay_apart(namespace: str) -> None:
    placed: list[tuple[str, tuple[str, str], str]] = [
        ("a:b", ("user", "c"), "m:1"),
        ("a", ("user", "b:c"), "m*"),
        ("a", ("user:b", "c"), "m[1]"),
        ("a*", ("user", "*"), "m?"),
        ("ab", ("user", "*"), "m1"),
        ("[a]b", ("us\\er", "%3A"), "%"),
    ]

    async def scenario(cache: RedisCache, client: Redis) -> None:
        for tenant, subject, memory_id in placed:
            await cache.put_recall(tenant, subject, "q:*", [memory(memory_id, "c:[1]")])
        for tenant, subject, memory_id in placed:
            assert await cache.get_recall(tenant, subject, "q:*") == [memory(memory_id, "c:[1]")]
        assert len(await cache.entries("a")) == 2
        for tenant in ("a:b", "a*", "ab", "[a]b"):
            assert len(await cache.entries(tenant)) == 1
        assert await cache.entries("b") == []

        assert await cache.invalidate("a", memory_ids=["m*"]) == 1
        assert await cache.get_recall("a", ("user:b", "c"), "q:*") is not None
        assert await cache.invalidate("a*", subject=("user", "*")) == 1
        assert await cache.get_recall("ab", ("user", "*"), "q:*") is not None
        assert await cache.reachable("ab", subject=("user", "*")) == [
            TenantKeys(namespace, "ab").recall(("user", "*"), "q:*")
        ]
        assert await cache.invalidate("a:b", conversation_ids=["c:[1]"]) == 1
        assert await cache.get_recall("a", ("user:b", "c"), "q:*") is not None
        assert await cache.invalidate("[a]b", memory_ids=["%"]) == 1
        remaining = {key for tenant in ("a", "ab") for key, _ in await cache.entries(tenant)}
        assert remaining == {
            TenantKeys(namespace, "a").recall(("user:b", "c"), "q:*"),
            TenantKeys(namespace, "ab").recall(("user", "*"), "q:*"),
        }

    run(namespace, scenario)


def test_invalidate_of_unknown_ids_deletes_nothing(namespace: str) -> None:
    async def scenario(cache: RedisCache, client: Redis) -> None:
        assert await cache.invalidate("acme", subject=ALICE) == 0
        await cache.put_recall("acme", ALICE, "q_all", [memory("m_tea", "conv_1")])
        await cache.put_context("acme", "conv_1", ALICE, {"items": []})
        unknown = await cache.invalidate(
            "acme", subject=BOB, conversation_ids=["conv_9"], memory_ids=["m_9"]
        )
        assert unknown == 0
        assert await cache.invalidate("acme") == 0
        assert await cache.invalidate("beta", subject=ALICE, memory_ids=["m_tea"]) == 0
        assert len(await cache.entries("acme")) == 2
        with pytest.raises(TypeError):
            await cache.invalidate("acme", conversation_ids="conv_1")

    run(namespace, scenario)


def test_a_batch_of_invalidations_is_counted_and_checked_per_erasure(namespace: str) -> None:
    acme, beta = TenantKeys(namespace, "acme"), TenantKeys(namespace, "beta")
    erasures = [
        ("acme", Holdings.targets(ALICE, [], [])),
        # Alice's entry holds it too, but the erasure before removed it: it counts once.
        ("acme", Holdings.targets(None, [], ["m_shared"])),
        ("beta", Holdings.targets(None, ["conv_9"], [])),
        ("beta", Holdings.targets(CAROL, [], [])),
    ]

    async def scenario(cache: RedisCache, client: Redis) -> None:
        await cache.put_recall("acme", ALICE, "q_all", [memory("m_shared"), memory("m_tea")])
        await cache.put_recall("acme", BOB, "q_all", [memory("m_shared")])
        await cache.put_recall("acme", CAROL, "q_all", [memory("m_carol")])
        await cache.put_recall("beta", ALICE, "q_all", [memory("m_shared")])
        await cache.put_context("beta", "conv_9", BOB, {"items": []})
        assert await cache.reachable_each(erasures) == [
            [acme.recall(ALICE, "q_all")],
            sorted([acme.recall(ALICE, "q_all"), acme.recall(BOB, "q_all")]),
            [beta.context("conv_9")],
            [],
        ]

        assert await cache.invalidate_each(erasures) == [1, 1, 1, 0]

        assert await cache.reachable_each(erasures) == [[], [], [], []]
        assert await cache.get_recall("acme", CAROL, "q_all") == [memory("m_carol")]
        assert await cache.get_recall("beta", ALICE, "q_all") == [memory("m_shared")]
        assert not await client.exists(acme.memory_index("m_shared"))
        assert await cache.invalidate_each([]) == [] and await cache.reachable_each([]) == []

    run(namespace, scenario)


def _no_scan(cache: RedisCache) -> None:
    async def refused(pattern: str) -> set[str]:
        raise AssertionError(f"scanned {pattern}: the check must not walk the keyspace")

    cache._scan = refused  # type: ignore[method-assign]


def test_the_check_after_an_invalidation_reads_the_indexes_not_the_keyspace(
    namespace: str,
) -> None:
    keys = TenantKeys(namespace, "acme")
    rogue = keys.recall(CAROL, "q_rogue")

    async def scenario(cache: RedisCache, client: Redis) -> None:
        await cache.put_recall("acme", ALICE, "q_all", [memory("m_tea", "conv_1")])
        await cache.put_recall("acme", BOB, "q_all", [memory("m_bob")])
        await cache.put_recall("beta", ALICE, "q_all", [memory("m_tea")])
        # Unindexed: a context entry (known from its conversation) and a recall entry.
        await client.set(keys.context("conv_9"), orjson.dumps({"conversation_id": "conv_9"}))
        await client.set(rogue, orjson.dumps({"records": [memory("m_tea")]}))
        erasures = [
            ("acme", Holdings.targets(None, [], ["m_tea"])),
            ("acme", Holdings.targets(None, ["conv_9"], [])),
            ("acme", Holdings.targets(None, ["conv_1"], ["m_none"])),
            ("beta", Holdings.targets(None, [], ["m_bob"])),
        ]
        scanning = await cache.reachable_each(erasures)
        _no_scan(cache)
        indexed = await cache.indexed_each(erasures)

        assert indexed == [
            [keys.recall(ALICE, "q_all")],
            [keys.context("conv_9")],
            [keys.recall(ALICE, "q_all")],
            [],
        ]
        # Only the scan finds what was written behind the indexes' back.
        assert scanning == [sorted([keys.recall(ALICE, "q_all"), rogue]), *indexed[1:]]
        assert await cache.indexed_each([]) == []

    run(namespace, scenario)


def erasure(tenant_id: str, subject: tuple[str, str], items: Sequence[TombstoneItem]) -> Tombstone:
    now = datetime.now(UTC)
    return Tombstone(
        deletion_id=f"d_{subject[1]}",
        tenant_id=tenant_id,
        kind="erasure",
        target=DeletionTarget(type="subject", subject_type=subject[0], id=subject[1]),
        items=tuple(items),
        issued_at=now,
        cut_off=now,
        deadline_at=now + timedelta(hours=1),
        required_stores=("cache",),
    )


class FilledMeanwhile(RedisCache):
    """A cache whose recall for Alice is filled again between a batch's invalidation and its
    check, as a read after the erasure may be: with ``holding`` as its records."""

    def __init__(self, client: Redis, namespace: str, holding: list[dict[str, Any]]) -> None:
        super().__init__(client, 300, namespace)
        self._refill = holding

    async def invalidate_each(self, erasures: Sequence[tuple[str, Holdings]]) -> list[int]:
        removed = await super().invalidate_each(erasures)
        await self.put_recall("acme", ALICE, "q_after", self._refill)
        return removed


def test_erase_many_checks_the_items_not_the_subject_in_rounds_that_ignore_the_keyspace(
    namespace: str,
) -> None:
    keys = TenantKeys(namespace, "acme")
    tombstones = [
        erasure(
            "acme",
            ALICE,
            [
                TombstoneItem(type="memory", id="m_tea"),
                TombstoneItem(type="conversation", id="conv_1"),
            ],
        ),
        erasure("beta", BOB, [TombstoneItem(type="memory", id="m_bob")]),
    ]

    async def scenario(cache: RedisCache, client: Redis) -> None:
        await cache.put_recall("acme", ALICE, "q_all", [memory("m_tea"), memory("m_city")])
        await cache.put_context("acme", "conv_1", ALICE, {"items": []})
        await cache.put_recall("acme", BOB, "q_all", [memory("m_bob")])
        await cache.put_recall("beta", BOB, "q_all", [memory("m_bob")])

        # Filled after the erasure, Alice's new entry holds nothing erased: not a failure.
        fresh = FilledMeanwhile(client, namespace, [memory("m_new")])
        _no_scan(fresh)
        erased = await CacheStore(fresh).erase_many(tombstones)
        assert [(e.removed, e.reachable) for e in erased] == [(2, []), (1, [])]
        assert await cache.get_recall("acme", ALICE, "q_after") == [memory("m_new")]
        assert await cache.get_recall("acme", BOB, "q_all") == [memory("m_bob")]

        # One that still holds an erased memory (a fill that broke the rule) is reported,
        # and so by the verification probe's own check, which scans too.
        broken = FilledMeanwhile(client, namespace, [memory("m_tea")])
        _no_scan(broken)
        (alice, _) = await CacheStore(broken).erase_many(tombstones)
        assert (alice.removed, alice.reachable) == (1, [keys.recall(ALICE, "q_after")])
        assert await CacheStore(cache).reachable(None, tombstones[0]) == alice.reachable  # type: ignore[arg-type]

    run(namespace, scenario)
