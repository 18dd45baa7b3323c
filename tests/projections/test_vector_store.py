"""The vector store's contract (tests/support/contracts/vectors.py) on each backend: the
in-memory fake without services, LanceDB on disk and PostgreSQL under the integration marker
(their own behaviour beyond the port: test_lance_store.py, test_postgres_vectors.py). Also
the entry ids, and the embeddings store's opening of the vectors on first use."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from projections.deletion.erasure import Erasure, ErasureIndex, subject_key
from projections.embeddings.postgres import Pool
from projections.embeddings.vectors import (
    VectorStore,
    memory_entry_id,
    message_entry_id,
    replay_table_name,
)
from projections.sealing.crypto import new_data_key
from projections.sealing.probes import ProbeSealer
from projections.stores.embeddings import EmbeddingsStore
from streams.settings import Settings
from support.contracts.vectors import RebuildTables, VectorStoreContract
from support.fakes.vectors import InMemoryShadows, InMemoryVectorStore
from support.vector_entries import EMBEDDER, T0, postgres_vectors


class TestInMemoryVectorStore(VectorStoreContract):
    @pytest.fixture
    def store(self) -> InMemoryVectorStore:
        return InMemoryVectorStore(EMBEDDER.dim, model=EMBEDDER.name)

    @pytest.fixture
    def shadows(self, store: VectorStore) -> RebuildTables:
        return InMemoryRebuilds(EMBEDDER.dim, model=EMBEDDER.name)


class InMemoryRebuilds(InMemoryShadows):
    def create(self, created: datetime) -> VectorStore:
        return self.add(f"embeddings_replay_{created:%Y%m%d%H%M%S}", created)


@pytest.mark.integration
class TestLanceVectorStore(VectorStoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> VectorStore:
        from projections.embeddings.lance import LanceVectorStore

        return LanceVectorStore(tmp_path / "vectors", dim=EMBEDDER.dim, model=EMBEDDER.name)

    @pytest.fixture
    def shadows(self, store: VectorStore, tmp_path: Path) -> RebuildTables:
        from projections.embeddings.lance_tables import LanceShadows

        class LanceRebuilds(LanceShadows):
            def create(self, created: datetime) -> VectorStore:
                return self.open(replay_table_name(created))

        return LanceRebuilds(tmp_path / "vectors", EMBEDDER.dim, model=EMBEDDER.name)


@pytest.mark.integration
class TestPostgresVectorStore(VectorStoreContract):
    # PostgreSQL's text holds no NUL character (the contract's codec refuses one first).
    unstorable = frozenset({"nul\x00byte"})
    # A removed row is a dead tuple, out of every reader's reach at the commit (the purge of
    # the PostgreSQL tables vacuums it).
    keeps_versions = False

    @pytest.fixture
    def pool(self, stack: Settings) -> Iterator[Pool]:
        with postgres_vectors(stack) as pool:
            yield pool

    @pytest.fixture
    def store(self, pool: Pool) -> VectorStore:
        from projections.embeddings.postgres import PostgresVectorStore

        return PostgresVectorStore(pool, EMBEDDER.dim, model=EMBEDDER.name)

    @pytest.fixture
    def shadows(self, store: VectorStore, pool: Pool) -> RebuildTables:
        from projections.embeddings.postgres import PostgresCollections

        class PostgresRebuilds(PostgresCollections):
            def create(self, created: datetime) -> VectorStore:
                return self.create_collection(replay_table_name(created), created)

        return PostgresRebuilds(pool, EMBEDDER.dim, model=EMBEDDER.name)


def test_entry_ids_name_the_kind_tenant_and_source() -> None:
    assert memory_entry_id("t1", "m1") == "memory:t1:m1"
    assert message_entry_id("t1", "c1", "msg1") == "message:t1:c1:msg1"


@given(
    st.lists(st.text(alphabet=":%a", max_size=4), min_size=3, max_size=3),
    st.lists(st.text(alphabet=":%a", max_size=4), min_size=3, max_size=3),
)
def test_entry_ids_name_one_entry_each(one: list[str], other: list[str]) -> None:
    # Ids joined with ":" once collided across tenants ("acme:x"/"m1" and "acme"/"x:m1").
    assert (memory_entry_id(*one[:2]) == memory_entry_id(*other[:2])) == (one[:2] == other[:2])
    assert (message_entry_id(*one) == message_entry_id(*other)) == (one == other)


def test_the_store_is_opened_on_first_use_and_not_by_an_audit_of_no_erasure() -> None:
    opened: list[str] = []

    def vectors() -> InMemoryVectorStore:
        opened.append("vectors")
        return InMemoryVectorStore(EMBEDDER.dim, model=EMBEDDER.name)

    def shadows() -> InMemoryShadows:
        opened.append("shadows")
        return InMemoryShadows(EMBEDDER.dim, model=EMBEDDER.name)

    embeddings = EmbeddingsStore(vectors, asyncio.Lock(), ProbeSealer(new_data_key()), shadows)
    assert asyncio.run(embeddings.ghosts(None, {})) == []  # type: ignore[arg-type]
    assert opened == []

    covered = {"acme": ErasureIndex({subject_key("acme", "user", "u1"): Erasure("d1", T0)})}
    assert asyncio.run(embeddings.ghosts(None, covered)) == []  # type: ignore[arg-type]
    assert sorted(opened) == ["shadows", "vectors"]
    asyncio.run(embeddings.ghosts(None, covered))  # type: ignore[arg-type]
    assert len(opened) == 2
