"""The derived store's contract (tests/support/contracts/derived.py) on every store of the
registry: each on its in-memory fake without services, and on its real backend under the
integration marker (the embeddings store on LanceDB, the cache on Redis and on a Redis
Cluster, the summaries and context stores on PostgreSQL)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

import psycopg
import pytest

from projections.cache.entries import holdings_of
from projections.cache.port import RecallCache
from projections.cache.store import RedisCache, connect
from projections.embeddings.vectors import VectorStore
from projections.sealing.crypto import new_data_key
from projections.sealing.probes import ProbeSealer
from projections.sql import Conn
from projections.stores import STORES
from projections.stores.base import DerivedStore
from projections.stores.cache import CacheStore
from projections.stores.embeddings import EmbeddingsStore
from projections.stores.tables import ContextStore, ConversationTableStore, SummariesStore
from streams.services import make_pool
from streams.settings import Settings
from support.contracts.derived import CUT_OFF, Copy, DerivedStoreContract, Holder, erased_keys
from support.fakes.cache import InMemoryCache
from support.fakes.tables import InMemoryContext, InMemorySummaries, Row
from support.fakes.vectors import InMemoryVectorStore
from support.vector_entries import EMBEDDER, memory, message
from topics.deletion import Tombstone

T = TypeVar("T")
Scenario = Callable[[Holder], Coroutine[Any, Any, T]]
NO_CONN = cast(Conn, None)  # the stores that never read PostgreSQL are given none


def test_every_store_of_the_registry_has_its_contract_run_on_a_fake() -> None:
    on_fakes = {holder.store_name for holder in (EmbeddingsOnFake, CacheOnFake)}
    on_fakes |= {store.name for store in (InMemorySummaries, InMemoryContext)}
    assert on_fakes == {store.name for store in STORES}


# -- the embeddings store ----------------------------------------------------------------------


async def no_probes(*_: object) -> list[tuple[str, str, list[float]]]:
    return []


class EmbeddingsHolder:
    holds = frozenset({"memory", "conversation"})
    timed = True
    conn = NO_CONN

    def __init__(self, vectors: VectorStore) -> None:
        self.vectors = vectors
        lock = asyncio.Lock()
        self.store: DerivedStore = EmbeddingsStore(
            vectors, lock, ProbeSealer(new_data_key()), load_probes=no_probes
        )

    async def hold(self, copies: Sequence[Copy]) -> None:
        self.vectors.upsert([self._entry(copy) for copy in copies])

    def _entry(self, copy: Copy) -> Any:
        if copy.memory_id is not None:
            entry = memory(copy.memory_id, "a fact", copy.tenant_id, copy.subject)
        else:
            assert copy.conversation_id is not None
            entry = message(copy.conversation_id, "msg1", "a message", copy.tenant_id, copy.subject)
        return dataclasses.replace(entry, occurred_at=copy.at)

    async def held(self) -> set[str]:
        return {
            f"{e.tenant_id}/memory/{e.memory_id}"
            if e.memory_id is not None
            else f"{e.tenant_id}/conversation/{e.conversation_id}"
            for tenant in self.vectors.tenants()
            for e in self.vectors.entries(tenant)
        }

    async def record(self, tombstone: Tombstone) -> None:
        """The embeddings store erases by the tombstone alone."""


class EmbeddingsOnFake(DerivedStoreContract):
    store_name = EmbeddingsStore.name

    @pytest.fixture
    def run(self) -> Callable[[Scenario[T]], T]:
        def run(scenario: Scenario[T]) -> T:
            vectors = InMemoryVectorStore(EMBEDDER.dim, model=EMBEDDER.name)
            return asyncio.run(scenario(EmbeddingsHolder(vectors)))

        return run


class TestEmbeddingsOnFake(EmbeddingsOnFake):
    pass


@pytest.mark.integration
class TestEmbeddingsOnLance(DerivedStoreContract):
    @pytest.fixture
    def run(self, tmp_path: Path) -> Callable[[Scenario[T]], T]:
        from projections.embeddings.lance import LanceVectorStore

        def run(scenario: Scenario[T]) -> T:
            path = tmp_path / f"vectors-{len(list(tmp_path.iterdir()))}"
            vectors = LanceVectorStore(path, dim=EMBEDDER.dim, model=EMBEDDER.name)
            return asyncio.run(scenario(EmbeddingsHolder(vectors)))

        return run


# -- the cache ---------------------------------------------------------------------------------


class CacheHolder:
    holds = frozenset({"memory", "conversation"})
    timed = False
    conn = NO_CONN

    def __init__(self, cache: RecallCache) -> None:
        self.cache = cache
        self.store: DerivedStore = CacheStore(cache)
        self._tenants: set[str] = set()

    async def hold(self, copies: Sequence[Copy]) -> None:
        for copy in copies:
            self._tenants.add(copy.tenant_id)
            if copy.memory_id is not None:
                records = [{"memory_id": copy.memory_id}]
                await self.cache.put_recall(
                    copy.tenant_id, copy.subject, f"q_{copy.memory_id}", records
                )
            else:
                assert copy.conversation_id is not None
                await self.cache.put_context(
                    copy.tenant_id, copy.conversation_id, copy.subject, {"items": []}
                )

    async def held(self) -> set[str]:
        names = set()
        for tenant in self._tenants:
            for _, entry in await self.cache.entries(tenant):
                holdings = holdings_of(entry)
                names |= {f"{tenant}/memory/{m}" for m in holdings.memory_ids}
                names |= {f"{tenant}/conversation/{c}" for c in holdings.conversation_ids}
        return names

    async def record(self, tombstone: Tombstone) -> None:
        """The cache erases by the tombstone alone."""


class CacheOnFake(DerivedStoreContract):
    store_name = CacheStore.name

    @pytest.fixture
    def run(self) -> Callable[[Scenario[T]], T]:
        def run(scenario: Scenario[T]) -> T:
            return asyncio.run(scenario(CacheHolder(InMemoryCache())))

        return run


class TestCacheOnFake(CacheOnFake):
    pass


def on_redis(settings: Settings, namespace: str) -> Callable[[Scenario[T]], T]:
    def run(scenario: Scenario[T]) -> T:
        async def main() -> T:
            client = connect(settings.redis_url, settings.redis_cluster)
            try:
                return await scenario(CacheHolder(RedisCache(client, 300, namespace)))
            finally:
                await client.aclose()

        return asyncio.run(main())

    return run


@pytest.mark.integration
class TestCacheOnRedis(DerivedStoreContract):
    @pytest.fixture
    def run(self, stack: Settings, redis_namespace: str) -> Callable[[Scenario[T]], T]:
        return on_redis(stack, redis_namespace)


@pytest.mark.integration
class TestCacheOnRedisCluster(DerivedStoreContract):
    @pytest.fixture
    def run(
        self, redis_cluster: Settings, redis_cluster_namespace: str
    ) -> Callable[[Scenario[T]], T]:
        return on_redis(redis_cluster, redis_cluster_namespace)


# -- the summaries and context tables ----------------------------------------------------------


class FakeTableHolder:
    holds = frozenset({"conversation"})
    timed = True
    conn = NO_CONN

    def __init__(self, store: InMemorySummaries | InMemoryContext) -> None:
        self.table = store
        self.store: DerivedStore = store

    async def hold(self, copies: Sequence[Copy]) -> None:
        self.table.rows += [
            Row(c.tenant_id, c.conversation_id, c.subject, c.at)
            for c in copies
            if c.conversation_id is not None
        ]

    async def held(self) -> set[str]:
        return {f"{row.tenant_id}/conversation/{row.conversation_id}" for row in self.table.rows}

    async def record(self, tombstone: Tombstone) -> None:
        self.table.erasures += [
            (key, tombstone.deletion_id, CUT_OFF) for key in erased_keys(tombstone)
        ]


@pytest.mark.parametrize("fake", [InMemorySummaries, InMemoryContext])
class TestConversationTablesOnFakes(DerivedStoreContract):
    @pytest.fixture
    def run(self, fake: type[InMemorySummaries | InMemoryContext]) -> Callable[[Scenario[T]], T]:
        def run(scenario: Scenario[T]) -> T:
            return asyncio.run(scenario(FakeTableHolder(fake())))

        return run


class PostgresTableHolder:
    holds = frozenset({"conversation"})
    timed = True

    def __init__(self, store: ConversationTableStore, conn: psycopg.AsyncConnection[Any]) -> None:
        self.store: DerivedStore = store
        self.conn = cast(Conn, conn)
        self._table = store.table.table

    async def hold(self, copies: Sequence[Copy]) -> None:
        for c in copies:
            if c.conversation_id is None:
                continue
            row = (c.tenant_id, c.conversation_id, *c.subject, c.at)
            if self._table == "conversation_summaries":
                await self.conn.execute(
                    "INSERT INTO conversation_summaries VALUES"
                    " (%s, %s, 1, 'a summary', '{}', %s, 'e1', '[]', %s, %s)"
                    " ON CONFLICT DO NOTHING",
                    (c.tenant_id, c.conversation_id, c.at, *c.subject),
                )
            else:
                await self.conn.execute(
                    "INSERT INTO conversation_context VALUES (%s, %s, %s, %s, '{}', 1, 100, NULL,"
                    " %s) ON CONFLICT DO NOTHING",
                    row,
                )

    async def held(self) -> set[str]:
        cursor = await self.conn.execute(
            f"SELECT DISTINCT tenant_id, conversation_id FROM {self._table}"
        )
        return {f"{tenant}/conversation/{c}" for tenant, c in await cursor.fetchall()}

    async def record(self, tombstone: Tombstone) -> None:
        for key in erased_keys(tombstone):
            await self.conn.execute(
                "INSERT INTO erased_entities (tenant_id, entity_type, subject_type, entity_id,"
                " cut_off, deletion_id) VALUES (%s, %s, %s, %s, %s, %s)",
                (*key, CUT_OFF, tombstone.deletion_id),
            )


@asynccontextmanager
async def table_holder(
    env: Any, store: type[ConversationTableStore]
) -> AsyncIterator[PostgresTableHolder]:
    dsn = env.settings.postgres_dsn
    connecting = psycopg.AsyncConnection.connect(dsn, autocommit=True)
    async with make_pool(dsn, 2) as pool, await connecting as conn:
        yield PostgresTableHolder(store(pool), conn)


@pytest.mark.integration
@pytest.mark.parametrize("table", [SummariesStore, ContextStore])
class TestConversationTablesOnPostgres(DerivedStoreContract):
    @pytest.fixture
    def run(self, env: Any, table: type[ConversationTableStore]) -> Callable[[Scenario[T]], T]:
        def run(scenario: Scenario[T]) -> T:
            async def main() -> T:
                async with table_holder(env, table) as holder:
                    return await scenario(holder)

            return asyncio.run(main())

        return run
