"""The deletion scenario the end-to-end deletion tests share: Alice's and Bob's memories and
conversations in one tenant, and ways to wait for, request and read a deletion."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from click.testing import CliRunner
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from projections.cache.store import RedisCache
from projections.cache.store import connect as connect_redis
from projections.deletion import lifecycle as ledger
from projections.embeddings.vectors import Match, VectorStore
from projections.memory.store import RecallQuery
from projections.stores import STORES, DerivedStore
from streams import reads
from streams.cli import cli
from streams.kafka import admin_config
from streams.sample import EventFactory
from streams.services import StoreSupplies, make_pool
from support.embedders import embedder_of, vectors_of
from support.environment import settings_environment
from topics.registry import CONVERSATION_EVENTS, DELETION_REQUESTS, MEMORY_CURRENT, MEMORY_EVENTS

ALICE = ("user", "alice")
BOB = ("user", "bob")


def recent_factory() -> EventFactory:
    return EventFactory(id_prefix="e", clock=datetime.now(UTC) - timedelta(minutes=10))


def seed(env: Any, f: EventFactory, tenant: str = "acme") -> None:
    """Alice's memories and conversation, Bob's conversation, memories derived from both."""
    env.produce_events(
        [
            f.started(tenant, "c_alice", ALICE),
            f.message(tenant, "c_alice", "m1", "user", "I am allergic to peanuts, remember that"),
            f.message(tenant, "c_alice", "m2", "assistant", "Noted: no peanuts for you."),
            f.summary(tenant, "c_alice", 1, "Alice is allergic to peanuts.", ["m1", "m2"]),
            f.started(tenant, "c_bob", BOB),
            f.message(tenant, "c_bob", "m1", "user", "my favourite colour is teal"),
        ],
        CONVERSATION_EVENTS,
    )
    env.produce_events(
        [
            f.proposed(
                tenant,
                "mem_allergy",
                ALICE,
                {"text": "allergic to peanuts"},
                source=("message", "c_alice/m1"),
            ),
            f.proposed(
                tenant, "mem_city", ALICE, {"text": "lives in Lisbon"}, source=("crm", "contact/42")
            ),
            # About Bob, but learned in Alice's conversation: erased with Alice's conversations.
            f.proposed(
                tenant,
                "mem_from_alice",
                BOB,
                {"text": "Bob cooks for Alice"},
                source=("message", "c_alice/m2"),
            ),
            f.proposed(
                tenant,
                "mem_colour",
                BOB,
                {"text": "favourite colour teal"},
                source=("message", "c_bob/m1"),
            ),
            f.proposed(
                tenant,
                "mem_sport",
                BOB,
                {"text": "plays tennis on sundays"},
                source=("crm", "contact/7"),
            ),
        ]
    )


def vectors(env: Any) -> VectorStore:
    return vectors_of(env.settings)


def wait_indexed(env: Any, tenant: str, count: int) -> None:
    store = vectors(env)

    def indexed() -> bool:
        entries = store.find(Match(tenant_id=tenant, subject=ALICE)) + store.find(
            Match(tenant_id=tenant, subject=BOB)
        )
        return len(entries) >= count

    env.wait_until(indexed, f"{count} vectors for {tenant}")


def ready(env: Any, tenant: str = "acme") -> None:
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    wait_indexed(env, tenant, 8)  # 5 memories and 3 messages


def request(
    env: Any,
    f: EventFactory,
    tenant: str,
    deletion_id: str,
    target: dict[str, str],
    deadline: timedelta | None = None,
) -> None:
    deadline_at = datetime.now(UTC) + deadline if deadline else None
    env.produce_events(
        [f.deletion(tenant, deletion_id, target, deadline_at=deadline_at)], DELETION_REQUESTS
    )


def detail(env: Any, tenant: str, deletion_id: str) -> dict[str, Any] | None:
    return env.run(lambda conn: ledger.request_detail(conn, tenant, deletion_id))  # type: ignore[no-any-return]


def wait_verified(env: Any, tenant: str, deletion_id: str, seconds: float = 120) -> dict[str, Any]:
    def verified() -> dict[str, Any] | None:
        found = detail(env, tenant, deletion_id)
        return found if found and found["verified_at"] is not None else None

    return env.wait_until(verified, f"verification of {deletion_id}", seconds)  # type: ignore[no-any-return]


def semantic_recall(env: Any, tenant: str, subject: tuple[str, str], text: str) -> reads.Hydrated:
    async def run(conn: Any) -> reads.Hydrated:
        query = RecallQuery(tenant, *subject)
        return await reads.recall_by_text(
            conn,
            vectors(env),
            embedder_of(env.settings),
            query,
            text,
            datetime.now(UTC),
        )

    return env.run(run)  # type: ignore[no-any-return]


def cache_of(env: Any) -> RedisCache:
    return RedisCache(connect_redis(env.settings.redis_url), 300, env.settings.cache_namespace)


def prime_cache(env: Any, tenant: str) -> None:
    """Cache the tenant's recall of Alice and her conversation's context, once the cache
    worker has read every ``memory.current`` change so far: a change it reads later would
    invalidate the entries (cache freshness) before the test looks at them."""
    env.wait_group_committed(env.settings.group_id("cache"), MEMORY_CURRENT)

    async def run(conn: Any) -> None:
        cache = cache_of(env)
        await reads.recall(conn, cache, RecallQuery(tenant, *ALICE), datetime.now(UTC))
        await reads.context_view(conn, cache, tenant, "c_alice")

    env.run(run)


def stores_of(env: Any) -> list[DerivedStore]:
    """Every registered derived store, opened on this test's settings (read-only use: the
    pool they are given is never opened)."""
    return STORES.open_all(StoreSupplies(env.settings, make_pool(env.settings.postgres_dsn, 1)))


def compact_quickly(bootstrap: str, topic: str) -> None:
    admin = AdminClient(admin_config(bootstrap))
    entries = [
        ConfigEntry(name, "1000", incremental_operation=AlterConfigOpType.SET)
        for name in ("segment.ms", "max.compaction.lag.ms")
    ]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def audit(env: Any, marker: str) -> tuple[int, dict[str, Any]]:
    """``memproj audit plaintext`` of the test's own schemas (and the shared Kafka, Redis and
    data directory, where everything is under the test's names): its exit status and report."""
    schemas = [option for name in env.own_schemas() for option in ("--schema", name)]
    result = CliRunner().invoke(
        cli,
        ["audit", "plaintext", "--json", *schemas, marker],
        env=settings_environment(env.settings),
    )
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, orjson.loads(result.output)
