"""The embeddings indexer never waits for one of its two locks while it holds the other:
while a tombstone's purge holds the vector store's write lock, a deletion of the same tenant
(the ledger's exclusive tenant lock) is not kept waiting behind an index batch, and while a
deletion holds its tenant's lock, a tombstone is not kept waiting behind one
(ops/decisions/erasure-latency.md). Against the real PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any, Literal

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from psycopg_pool import AsyncConnectionPool

from projections.deletion.guard import lock_tenants
from projections.embeddings.indexer import MemoryUpdate
from projections.embeddings.lance import LanceVectorStore
from projections.sealing.keys import KeyStore
from projections.sql import Conn, KeyLookups
from streams.agents.index import EmbeddingsIndexer
from streams.metrics import Metrics
from streams.services import make_pool
from support.environment import Env
from support.fakes import Publisher
from support.vector_entries import EMBEDDER, memory
from topics.registry import TopicNames

# Tenant locks are advisory locks of the database, not of a test's schema: a tenant of this
# module's own, so that another test's workers (in the session's other process) never hold or
# wait for the lock these tests look at.
TENANT = f"tenant-{uuid.uuid4().hex[:8]}"


class AskedLock(asyncio.Lock):
    """A lock that says when someone asks for it while it is held."""

    def __init__(self) -> None:
        super().__init__()
        self.waited_for = asyncio.Event()

    async def acquire(self) -> Literal[True]:
        if self.locked():
            self.waited_for.set()
        return await super().acquire()


def tenant_lock_free(dsn: str, tenant: str) -> bool:
    """Whether a deletion of ``tenant`` could take its exclusive tenant lock now."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT pg_try_advisory_xact_lock(hashtextextended('memproj:tenant:' || %s, 0))",
            (tenant,),
        ).fetchone()
        conn.rollback()
    return bool(row and row[0])


def indexer_of(
    env: Env, pool: AsyncConnectionPool[Conn], vectors: LanceVectorStore, writes: asyncio.Lock
) -> EmbeddingsIndexer:
    return EmbeddingsIndexer(
        pool,
        vectors,
        EMBEDDER,
        Publisher(),
        TopicNames(env.settings.topic_prefix),
        Metrics(CollectorRegistry()),
        writes,
        KeyStore(env.settings.worker_master_keys(), KeyLookups()),
    )


@pytest.mark.integration
def test_an_index_batch_waiting_for_a_purge_holds_no_tenant_lock(env: Env, tmp_path: Path) -> None:
    vectors = LanceVectorStore(tmp_path / "vectors", dim=EMBEDDER.dim, model=EMBEDDER.name)
    vectors.upsert([memory("m1", "a fact", TENANT, ("user", "u1"))])
    dsn = env.settings.postgres_dsn

    async def run() -> dict[str, Any]:
        writes = AskedLock()
        async with make_pool(dsn, 1) as pool:
            indexer = indexer_of(env, pool, vectors, writes)
            async with writes:  # a tombstone's purge in progress
                batch = asyncio.create_task(indexer.index([MemoryUpdate(TENANT, "m1", None)]))
                await writes.waited_for.wait()
                free_meanwhile = await asyncio.to_thread(tenant_lock_free, dsn, TENANT)
            await batch
        return {"free_meanwhile": free_meanwhile}

    result = asyncio.run(run())

    assert result["free_meanwhile"]
    assert vectors.entries(TENANT) == []  # the batch ran once the purge was done


def tenant_lock_awaited(dsn: str, tenant: str) -> bool:
    """Whether some session waits for ``tenant``'s lock."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND (classid::bigint << 32 | objid::bigint)"
            " = hashtextextended('memproj:tenant:' || %s, 0)",
            (tenant,),
        ).fetchone()
    return bool(row and row[0])


@pytest.mark.integration
def test_an_index_batch_waiting_for_a_deletion_holds_no_write_lock(
    env: Env, tmp_path: Path
) -> None:
    vectors = LanceVectorStore(tmp_path / "vectors", dim=EMBEDDER.dim, model=EMBEDDER.name)
    vectors.upsert([memory("m1", "a fact", TENANT, ("user", "u1"))])
    dsn = env.settings.postgres_dsn

    async def run() -> dict[str, Any]:
        writes = asyncio.Lock()
        async with make_pool(dsn, 1) as pool, await psycopg.AsyncConnection.connect(dsn) as ledger:
            indexer = indexer_of(env, pool, vectors, writes)
            async with ledger.transaction():  # a deletion of the tenant, not yet committed
                await lock_tenants(ledger, [TENANT], exclusive=True)
                batch = asyncio.create_task(indexer.index([MemoryUpdate(TENANT, "m1", None)]))
                # until the batch waits for the tenant's lock
                await asyncio.to_thread(
                    env.wait_until, lambda: tenant_lock_awaited(dsn, TENANT) or None, "a wait"
                )
                write_lock_free_meanwhile = not writes.locked()
                entries_meanwhile = vectors.entries(TENANT)
            await batch
        return {"free": write_lock_free_meanwhile, "entries": entries_meanwhile}

    result = asyncio.run(run())

    assert result["free"] and len(result["entries"]) == 1
    assert vectors.entries(TENANT) == []  # indexed once the deletion committed


@pytest.mark.integration
def test_the_removals_of_an_index_batch_are_one_delete(env: Env, tmp_path: Path) -> None:
    vectors = LanceVectorStore(tmp_path / "vectors", dim=EMBEDDER.dim, model=EMBEDDER.name)
    vectors.upsert([memory(f"m{n}", f"fact {n}", TENANT, ("user", "u1")) for n in range(4)])
    versions_before = vectors.history_versions()

    async def run() -> None:
        async with make_pool(env.settings.postgres_dsn, 1) as pool:
            indexer = indexer_of(env, pool, vectors, asyncio.Lock())
            await indexer.index([MemoryUpdate(TENANT, f"m{n}", None) for n in range(3)])

    asyncio.run(run())

    assert [entry.memory_id for entry in vectors.entries(TENANT)] == ["m3"]
    assert vectors.history_versions() == versions_before + 1  # one table version, not three
