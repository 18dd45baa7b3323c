"""The cache-freshness agent against the real Redis of ops/stack: a batch of
``memory.current`` is invalidated in one invalidation, an undecodable change is dead-lettered
while the rest are invalidated, and a failure about one message makes the batch be
invalidated one message at a time (the cache's own rules: tests/projections/test_cache_store.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest
import redis
from redis.asyncio import Redis

from projections.cache.entries import Holdings
from projections.cache.keys import TenantKeys, glob_literal
from projections.cache.store import RedisCache, RedisClient, connect
from streams.agents.cache import CacheFreshness
from streams.settings import Settings
from support.fakes import Publisher, Source, Stops, loop_for
from topics.messages import InputMessage
from topics.outputs import MemoryRecord
from topics.registry import MEMORY_CURRENT, TopicNames, entity_headers, output_key

pytestmark = pytest.mark.integration

TOPIC = TopicNames("t.").name(MEMORY_CURRENT)
ALICE = ("user", "alice")
BOB = ("user", "bob")
NOW = datetime(2026, 9, 1, 12, tzinfo=UTC)


@pytest.fixture
def namespace() -> Iterator[str]:
    name = f"memproj-test-{uuid4().hex}"
    yield name
    client = redis.Redis.from_url(Settings().redis_url)
    leftovers = list(client.scan_iter(match=glob_literal(name) + ":*"))
    if leftovers:
        client.delete(*leftovers)
    client.close()


class CountingCache(RedisCache):
    def __init__(self, client: RedisClient, namespace: str) -> None:
        super().__init__(client, 300, namespace)
        self.invalidations: list[int] = []

    async def invalidate_each(self, erasures: Sequence[tuple[str, Holdings]]) -> list[int]:
        self.invalidations.append(len(erasures))
        return await super().invalidate_each(erasures)


def change(offset: int, memory_id: str, subject: tuple[str, str] | None) -> InputMessage:
    """A change of ``memory.current``: the memory's record about ``subject``, or its null."""
    value = None
    if subject is not None:
        record = MemoryRecord.model_validate(
            {
                "tenant_id": "acme",
                "memory_id": memory_id,
                "subject": {"type": subject[0], "id": subject[1]},
                "scope": "profile",
                "kind": "fact",
                "value": {"text": "tea"},
                "source": {"type": "message", "ref": "conv_1/msg_1"},
                "status": "verified",
                "version": 2,
                "observed_at": NOW,
                "created_at": NOW,
                "updated_at": NOW,
                "last_event_id": f"e_{memory_id}",
            }
        )
        value = record.model_dump_json().encode()
    headers = [(name, value.encode()) for name, value in entity_headers("acme", memory_id)]
    return InputMessage(TOPIC, 0, offset, output_key("acme", memory_id).encode(), value, headers)


def cached(memory_id: str) -> dict[str, Any]:
    return {"memory_id": memory_id, "value": {"text": f"fact {memory_id}"}}


def run_batches(
    namespace: str, batches: list[list[InputMessage]], prepare: Any
) -> tuple[CountingCache, Publisher, Source, dict[str, bool]]:
    async def main() -> tuple[CountingCache, Publisher, Source, dict[str, bool]]:
        client = connect(Settings().redis_url)
        try:
            cache = CountingCache(client, namespace)
            await prepare(cache, client)
            publisher, source, stops = Publisher(), Source(batches), Stops()
            await loop_for(CacheFreshness(cache, publisher), stops).run(source)
            assert stops.stopped == []
            keys = TenantKeys(namespace, "acme")
            left = {
                name: bool(await client.exists(key))
                for name, key in {
                    "alice": keys.recall(ALICE, "q_all"),
                    "bob": keys.recall(BOB, "q_all"),
                    "bob_tea": keys.recall(BOB, "q_tea"),
                    "carol": keys.recall(("user", "carol"), "q_all"),
                }.items()
            }
            return cache, publisher, source, left
        finally:
            await client.aclose()

    return asyncio.run(main())


async def fill(cache: RedisCache, _client: Redis) -> None:
    await cache.put_recall("acme", ALICE, "q_all", [cached("m_alice")])
    await cache.put_recall("acme", BOB, "q_all", [cached("m_bob")])
    await cache.put_recall("acme", BOB, "q_tea", [cached("m_tea")])
    await cache.put_recall("acme", ("user", "carol"), "q_all", [cached("m_carol")])


def test_a_batch_is_invalidated_at_once_and_a_bad_change_is_dead_lettered(
    namespace: str,
) -> None:
    batch = [
        change(0, "m_new", ALICE),  # a new memory about Alice: her entries are stale
        InputMessage(TOPIC, 0, 1, b"acme:m_bad", b"not a record", ()),
        change(2, "m_tea", None),  # m_tea erased or revoked: only the entries holding it
    ]
    cache, publisher, source, left = run_batches(namespace, [batch], fill)

    assert cache.invalidations == [2]
    assert left == {"alice": False, "bob": True, "bob_tea": False, "carol": True}
    assert [(m.topic, m.key) for m in publisher.published] == [(TOPIC + ".dlq", b"acme:m_bad")]
    assert source.acked == [0, 1, 2]


def test_a_failure_about_one_change_invalidates_the_batch_one_at_a_time(namespace: str) -> None:
    async def fill_with_a_broken_index(cache: RedisCache, client: Redis) -> None:
        await fill(cache, client)
        # Not a set: reading this index fails (WRONGTYPE), for the change naming it only.
        await client.set(TenantKeys(namespace, "acme").memory_index("m_broken"), b"x")

    batch = [change(0, "m_alice", None), change(1, "m_broken", None), change(2, "m_tea", None)]
    cache, publisher, source, left = run_batches(namespace, [batch], fill_with_a_broken_index)

    assert cache.invalidations == [3, 1, 1, 1]
    assert left == {"alice": False, "bob": True, "bob_tea": False, "carol": True}
    assert [(m.topic, m.key) for m in publisher.published] == [
        (TOPIC + ".dlq", output_key("acme", "m_broken").encode())
    ]
    assert source.acked == [0, 1, 2]
