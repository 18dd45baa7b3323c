"""What the PostgreSQL vector store does beyond the port's contract (which
test_vector_store.py runs on it): the embedder and column version a collection records, many
writers at once, an erasure visible to every reader at its commit."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator

import pytest

from projections.embeddings.lexical import terms
from projections.embeddings.postgres import Pool, PostgresCollections, PostgresVectorStore
from projections.embeddings.vectors import (
    SCHEMA_VERSION,
    EmbedderMismatch,
    Match,
    VectorSchemaOutdated,
    VectorStoreMissing,
)
from streams.settings import Settings
from support.vector_entries import EMBEDDER, memory, postgres_vectors

pytestmark = pytest.mark.integration


@pytest.fixture
def pool(stack: Settings) -> Iterator[Pool]:
    with postgres_vectors(stack) as pool:
        yield pool


def store(pool: Pool, model: str = EMBEDDER.name, **options: bool) -> PostgresVectorStore:
    return PostgresVectorStore(pool, EMBEDDER.dim, model=model, **options)  # type: ignore[arg-type]


def test_a_reader_refuses_a_collection_nothing_created(pool: Pool) -> None:
    with pytest.raises(VectorStoreMissing, match="embeddings worker creates it"):
        store(pool, create=False)
    store(pool)
    assert store(pool, create=False).count() == 0


def test_a_collection_of_another_embedder_is_refused_naming_both(pool: Pool) -> None:
    store(pool).upsert([memory("m1", "likes tea")])
    with pytest.raises(EmbedderMismatch) as refused:
        store(pool, model="wordllama/l2_supercat/256")
    assert (refused.value.stored, refused.value.configured) == (
        EMBEDDER.name,
        "wordllama/l2_supercat/256",
    )
    # The rebuild adopts it, and its swap records the new model with the new vectors.
    adopted = store(pool, model="other/model", adopt=True)
    assert adopted.count() == 1
    adopted.replace_all([memory("m2", "likes jazz")])
    tables = PostgresCollections(pool, EMBEDDER.dim, model="other/model")
    assert tables.recorded() == ("other/model", SCHEMA_VERSION)
    assert store(pool, model="other/model").count() == 1


def test_a_collection_of_an_older_schema_is_refused_until_rebuilt(pool: Pool) -> None:
    store(pool)
    with pool.connection() as conn:
        conn.execute("UPDATE vector_collections SET schema_version = 1")
    with pytest.raises(VectorSchemaOutdated, match="memproj replay embeddings"):
        store(pool)
    store(pool, adopt=True).replace_all([])
    assert store(pool).count() == 0


def test_a_rebuild_collection_is_apart_from_the_live_one_and_dropped_whole(pool: Pool) -> None:
    live = store(pool)
    live.upsert([memory("m1", "likes tea")])
    tables = PostgresCollections(pool, EMBEDDER.dim, model=EMBEDDER.name)
    shadow = PostgresVectorStore(pool, EMBEDDER.dim, "embeddings_replay_x", model=EMBEDDER.name)
    shadow.upsert([memory("m1", "likes tea, rebuilt"), memory("m2", "likes jazz")])

    assert live.count() == 1 and shadow.count() == 2
    assert list(tables.tables()) == ["embeddings_replay_x"]
    tables.drop("embeddings_replay_x")
    assert tables.tables() == {} and live.count() == 1


def test_concurrent_writers_neither_deadlock_nor_lose_an_entry(pool: Pool) -> None:
    """Four writers upsert overlapping batches in opposite orders at once, as embeddings
    workers may while a partition moves between them."""
    entries = [memory(f"m{n}", f"memory number {n}") for n in range(200)]
    writers = [store(pool), store(pool)]
    failures: list[BaseException] = []

    def write(writer: PostgresVectorStore, reverse: bool) -> None:
        try:
            batch = list(reversed(entries)) if reverse else entries
            for start in range(0, len(batch), 20):
                writer.upsert(batch[start : start + 40])
        except BaseException as failure:  # reported below, in the test's thread
            failures.append(failure)

    threads = [
        threading.Thread(target=write, args=(writer, reverse))
        for writer in writers
        for reverse in (False, True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert failures == []
    assert writers[0].entries("tenant-a") == sorted(entries, key=lambda entry: entry.id)


def test_an_erasure_is_gone_for_every_reader_at_its_commit(pool: Pool) -> None:
    writer, reader = store(pool), store(pool, create=False)
    secret = memory("m1", "the user's door code is 4711")
    writer.upsert([secret, memory("m2", "likes jazz")])
    assert [hit.entry for hit in reader.search("tenant-a", secret.vector, 1)] == [secret]

    assert writer.remove(Match("tenant-a", memory_ids=("m1",))) == 1

    assert secret.id not in {hit.entry.id for hit in reader.search("tenant-a", secret.vector, 5)}
    assert reader.history_find(Match("tenant-a", memory_ids=("m1",))) == []


def test_a_zero_vector_is_stored_but_never_ranked(pool: Pool) -> None:
    """It has no direction: LanceDB's cosine search leaves it out too."""
    vectors = store(pool)
    zero = dataclasses.replace(memory("m0", "nothing"), vector=(0.0,) * EMBEDDER.dim)
    tea = memory("m1", "likes tea")
    vectors.upsert([zero, tea])
    assert [hit.entry.id for hit in vectors.search("tenant-a", tea.vector, 5)] == [tea.id]
    assert vectors.get("tenant-a", [zero.id]) == [zero]


def test_the_terms_are_the_texts_own_and_go_with_the_row(pool: Pool) -> None:
    """What the lexical index holds: the search terms of the row's text, nothing else; an
    erasure's delete takes them with the vector, and a rebuild writes them again."""
    vectors = store(pool)
    secret = memory("m1", "door code of TCK-88123 is 4711")
    vectors.upsert([secret, memory("m2", "likes jazz")])

    def held(condition: str = "true") -> dict[str, list[str]]:
        with pool.connection() as conn:
            rows = conn.execute(
                f"SELECT id, tsvector_to_array(terms) FROM vector_entries WHERE {condition}"
            ).fetchall()
        return {entry_id: sorted(found) for entry_id, found in rows}

    assert held()[secret.id] == list(terms(secret.text))
    vectors.upsert([dataclasses.replace(secret, text="door code changed")])
    assert held()[secret.id] == list(terms("door code changed"))

    vectors.remove(Match("tenant-a", memory_ids=("m1",)))

    assert held("terms @@ '4711 | door'::tsquery") == {}
    store(pool, adopt=True).replace_all([memory("m3", "rebuilt TCK-88123")])
    assert list(held()) == [memory("m3", "x").id]
    assert "tck-88123" in held()[memory("m3", "x").id]
