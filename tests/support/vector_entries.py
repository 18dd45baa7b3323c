"""Vector-store entries for the tests of the vector stores: a memory's or a message's entry
with a real embedding, at fixed times; the ``store`` fixture (a pytest plugin of
tests/conftest.py); and a PostgreSQL schema of its own for a PostgreSQL store."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from projections.embeddings.embedder import HashingEmbedder
from projections.embeddings.lance import LanceVectorStore
from projections.embeddings.postgres import Pool, open_pool
from projections.embeddings.vectors import VectorEntry, memory_entry_id, message_entry_id
from projections.migrate import migrate
from streams.settings import Settings
from support.environment import on_schema

EMBEDDER = HashingEmbedder()
T0 = datetime(2025, 3, 1, 12, 30, 15, 123456, tzinfo=UTC)


def memory(
    memory_id: str,
    text: str,
    tenant_id: str = "tenant-a",
    subject: tuple[str, str] = ("user", "u1"),
    version: int = 1,
    memory_kind: str = "preference",
    scope: str = "user",
) -> VectorEntry:
    return VectorEntry(
        id=memory_entry_id(tenant_id, memory_id),
        kind="memory",
        tenant_id=tenant_id,
        subject_type=subject[0],
        subject_id=subject[1],
        memory_id=memory_id,
        conversation_id=None,
        message_id=None,
        source_type="conversation",
        source_ref=f"conv/{memory_id}",
        text=text,
        version=version,
        occurred_at=T0 + timedelta(minutes=version),
        vector=tuple(EMBEDDER.embed([text])[0]),
        memory_kind=memory_kind,
        scope=scope,
    )


def message(
    conversation_id: str,
    message_id: str,
    text: str,
    tenant_id: str = "tenant-a",
    subject: tuple[str, str] = ("user", "u1"),
) -> VectorEntry:
    return VectorEntry(
        id=message_entry_id(tenant_id, conversation_id, message_id),
        kind="message",
        tenant_id=tenant_id,
        subject_type=subject[0],
        subject_id=subject[1],
        memory_id=None,
        conversation_id=conversation_id,
        message_id=message_id,
        source_type="message",
        source_ref=f"{conversation_id}/{message_id}",
        text=text,
        version=1,
        occurred_at=T0,
        vector=tuple(EMBEDDER.embed([text])[0]),
        memory_kind=None,
        scope=None,
    )


def ids(entries: Iterable[VectorEntry]) -> set[str]:
    return {entry.id for entry in entries}


@pytest.fixture
def store(tmp_path: Path) -> LanceVectorStore:
    """An empty LanceDB vector store on disk, for the embedder the entries use."""
    return LanceVectorStore(tmp_path / "vectors", dim=EMBEDDER.dim, model=EMBEDDER.name)


@contextlib.contextmanager
def postgres_vectors(stack: Settings) -> Iterator[Pool]:
    """A pool on a schema of its own, migrated (the vector tables only: no Kafka), dropped
    afterwards."""
    schema = f"t_vectors_{uuid.uuid4().hex[:10]}"
    dsn = on_schema(stack.postgres_dsn, schema)
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        asyncio.run(_migrate(dsn))
        pool = open_pool(dsn, size=2)
        try:
            yield pool
        finally:
            pool.close()
    finally:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def _migrate(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await migrate(conn)
