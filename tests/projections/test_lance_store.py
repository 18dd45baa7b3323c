"""LanceDB's vector store beyond the port's contract (which test_vector_store.py runs on it):
the embedder and schema recorded with the table, the scalar indexes, the removed rows gone
from the files on disk, and a table shared between processes. Embedded on disk, no service;
marked integration as every test of a real backend is, but the pure filters and thresholds."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pyarrow as pa
import pytest

from projections.embeddings import lance_maintenance
from projections.embeddings.embedder import WORDLLAMA_NAME
from projections.embeddings.factory import build_embedder
from projections.embeddings.lance import LanceVectorStore
from projections.embeddings.lance_filters import match_filter, sql_string, tenant_filter
from projections.embeddings.lance_maintenance import (
    INDEXED_COLUMNS,
    deleted_rows_remain,
    indexes_behind,
)
from projections.embeddings.lance_schema import (
    DIM_KEY,
    MODEL_KEY,
    lance_schema,
    stored_schema_version,
)
from projections.embeddings.lance_tables import table_model
from projections.embeddings.vectors import (
    SCHEMA_VERSION,
    EmbedderMismatch,
    Match,
    MemoryOnly,
    VectorEntry,
    VectorSchemaOutdated,
    check_embedder,
    memory_entry_id,
)
from support.vector_entries import EMBEDDER, ids, memory, message

integration = pytest.mark.integration


# -- pure: the filters and thresholds ----------------------------------------------------------


def test_indexes_are_refreshed_past_a_tenth_of_the_table_and_a_floor() -> None:
    assert not indexes_behind(0, lance_maintenance.INDEX_REFRESH_MIN_ROWS - 1)
    assert indexes_behind(0, lance_maintenance.INDEX_REFRESH_MIN_ROWS)
    assert not indexes_behind(1_000_000, 99_999)
    assert indexes_behind(1_000_000, 100_000)


def test_an_empty_match_selects_nothing() -> None:
    assert Match("tenant-a").is_empty
    assert match_filter(Match("tenant-a")) is None
    assert not Match("tenant-a").matches(memory("m1", "one"))


def test_filters_quote_every_identifier() -> None:
    assert sql_string("plain") == "'plain'"
    assert sql_string("o'hara") == "'o''hara'"
    assert sql_string("x' OR '1'='1") == "'x'' OR ''1''=''1'"
    assert match_filter(Match("t'1", entry_ids=("a'b",))) == (
        "tenant_id = 't''1' AND (id IN ('a''b'))"
    )


# -- LanceDB on disk ---------------------------------------------------------------------


@integration
def test_a_table_of_another_dimension_is_refused(tmp_path: Path) -> None:
    LanceVectorStore(tmp_path / "vectors", dim=8, model="hashing/8")
    with pytest.raises(ValueError, match=r"embedder hashing/8.*configured embedder is hashing/16"):
        LanceVectorStore(tmp_path / "vectors", dim=16, model="hashing/16")


@integration
def test_a_new_table_records_its_embedder_through_every_write(tmp_path: Path) -> None:
    store = LanceVectorStore(tmp_path / "vectors", dim=EMBEDDER.dim, model=EMBEDDER.name)
    assert table_model(tmp_path / "vectors") == "hashing/256"
    assert (store.table.schema.metadata or {})[DIM_KEY] == b"256"
    store.upsert([memory("m1", "likes jazz"), memory("m2", "plays tennis")])
    store.remove(Match("tenant-a", memory_ids=("m1",)))
    store.purge_history()  # rewrites the live rows: the record stays
    assert table_model(tmp_path / "vectors") == "hashing/256"
    assert ids(store.entries("tenant-a")) == {memory_entry_id("tenant-a", "m2")}


@integration
def test_a_table_of_another_embedder_is_refused_naming_both(tmp_path: Path) -> None:
    LanceVectorStore(tmp_path / "vectors", dim=256, model="hashing/256").upsert(
        [memory("m1", "likes jazz")]
    )
    with pytest.raises(EmbedderMismatch) as refused:
        LanceVectorStore(tmp_path / "vectors", dim=256, model=WORDLLAMA_NAME)
    message = str(refused.value)
    assert (
        "embedder hashing/256" in message and f"configured embedder is {WORDLLAMA_NAME}" in message
    )
    assert "memproj replay embeddings" in message
    # A read or a worker holding the store and an embedder of another model refuses as well.
    store = LanceVectorStore(tmp_path / "vectors", dim=256, model="hashing/256")
    with pytest.raises(EmbedderMismatch, match="memproj replay embeddings"):
        check_embedder(store, WORDLLAMA_NAME)
    check_embedder(store, EMBEDDER.name)


def version_1_table(path: Path, dim: int, model: str | None, entries: list[VectorEntry]) -> None:
    """A table as memproj wrote it before the entries carried the memory's kind and scope."""
    import lancedb

    schema = lance_schema(dim)
    schema = schema.remove(schema.get_field_index("scope"))
    schema = schema.remove(schema.get_field_index("memory_kind"))
    if model is not None:
        schema = schema.with_metadata({MODEL_KEY: model.encode(), DIM_KEY: str(dim).encode()})
    rows = [
        {name: value for name, value in dataclasses.asdict(entry).items() if name in schema.names}
        for entry in entries
    ]
    table = lancedb.connect(path).create_table("embeddings", schema=schema)
    if rows:
        table.add(pa.Table.from_pylist(rows, schema=schema))


@integration
def test_a_table_from_before_embedders_were_named_holds_hashing_vectors(tmp_path: Path) -> None:
    version_1_table(tmp_path / "vectors", 256, None, [])
    assert table_model(tmp_path / "vectors") == "hashing/256"
    with pytest.raises(EmbedderMismatch, match="hashing/256"):
        LanceVectorStore(tmp_path / "vectors", dim=256, model=WORDLLAMA_NAME)
    # Of the right model, but without the columns search filters by.
    with pytest.raises(VectorSchemaOutdated, match="memproj replay embeddings"):
        LanceVectorStore(tmp_path / "vectors", dim=256, model="hashing/256")


@integration
def test_a_table_without_kind_and_scope_is_refused_until_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "vectors"
    old = [memory("m1", "prefers email receipts"), message("c1", "msg1", "hello there")]
    version_1_table(path, EMBEDDER.dim, EMBEDDER.name, old)
    with pytest.raises(VectorSchemaOutdated) as refused:
        LanceVectorStore(path, dim=EMBEDDER.dim, model=EMBEDDER.name)
    assert (refused.value.stored, refused.value.current) == (1, SCHEMA_VERSION)
    assert "schema 1" in str(refused.value) and "memproj replay embeddings" in str(refused.value)

    # The rebuild adopts it: it reads the old entries (no kind or scope) ...
    live = LanceVectorStore(path, dim=EMBEDDER.dim, model=EMBEDDER.name, adopt=True)
    assert {(e.id, e.memory_kind, e.scope) for e in live.entries("tenant-a")} == {
        (old[0].id, None, None),
        (old[1].id, None, None),
    }
    live.purge_history()  # an erasure of a rebuild table left behind rewrites it as it is
    assert stored_schema_version(live.table.schema) == 1
    # ... and replaces them with entries that carry them, in one commit of the new schema.
    live.replace_all(old)
    assert stored_schema_version(live.table.schema) == SCHEMA_VERSION
    reopened = LanceVectorStore(path, dim=EMBEDDER.dim, model=EMBEDDER.name)
    assert reopened.entries("tenant-a") == sorted(old, key=lambda entry: entry.id)
    confined = reopened.search(
        "tenant-a", old[0].vector, 5, only=MemoryOnly(frozenset({"preference"}))
    )
    assert [hit.entry for hit in confined] == [old[0]]


@integration
def test_the_rebuild_replaces_vectors_and_model_in_one_commit(tmp_path: Path) -> None:
    path = tmp_path / "vectors"
    old = [memory("m1", "prefers email receipts"), memory("m2", "plays tennis on sundays")]
    LanceVectorStore(path, dim=16, model="hashing/16").upsert(
        [dataclasses.replace(entry, vector=(1.0,) + (0.0,) * 15) for entry in old]
    )
    model = build_embedder("wordllama", 256)
    live = LanceVectorStore(path, dim=model.dim, model=model.name, adopt=True)
    rebuilt = [
        dataclasses.replace(entry, vector=tuple(vector))
        for entry, vector in zip(
            live.entries("tenant-a"), model.embed([e.text for e in old]), strict=True
        )
    ]
    live.replace_all(rebuilt)
    assert table_model(path) == model.name
    assert live.history_versions() == 0  # nothing of the old model's vectors is left
    reopened = LanceVectorStore(path, dim=model.dim, model=model.name)
    (query,) = model.embed(["wants invoices by mail"])
    assert reopened.search("tenant-a", query, 1)[0].entry.memory_id == "m1"
    with pytest.raises(EmbedderMismatch, match=f"embedder {model.name}"):
        LanceVectorStore(path, dim=16, model="hashing/16")


def _unindexed(store: LanceVectorStore) -> dict[str, int]:
    found = {}
    for column in INDEXED_COLUMNS:
        stats = store.table.index_stats(f"{column}_idx")
        assert stats is not None, f"no index on {column}"
        found[column] = stats.num_unindexed_rows
    return found


@integration
def test_the_indexes_are_made_by_the_first_write_and_kept_through_overwrites(
    store: LanceVectorStore,
) -> None:
    store.upsert([memory("m1", "likes tea"), memory("m2", "likes coffee")])
    assert set(_unindexed(store)) == set(INDEXED_COLUMNS)
    # The prefilter of a search uses them.
    (query,) = EMBEDDER.embed(["likes tea"])
    where = tenant_filter("tenant-a", ("user", "u1"))
    plan = store.table.search(query).where(where, prefilter=True).limit(3).explain_plan(True)
    assert "ScalarIndexQuery" in plan and "subject_id_idx" in plan, plan
    store.remove(Match("tenant-a", memory_ids=("m1",)))
    store.purge_history()  # rewrites the live rows (an overwrite drops a table's indexes)
    assert _unindexed(store) == {column: 0 for column in INDEXED_COLUMNS}
    store.replace_all([memory("m3", "likes cocoa")])
    assert _unindexed(store) == {column: 0 for column in INDEXED_COLUMNS}


@integration
def test_the_indexes_are_refreshed_once_enough_rows_are_behind(
    store: LanceVectorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lance_maintenance, "INDEX_REFRESH_MIN_ROWS", 10)
    store.upsert([memory(f"m{n}", f"memory {n}") for n in range(4)])  # made, of these 4
    assert _unindexed(store) == {column: 0 for column in INDEXED_COLUMNS}
    store.upsert([memory(f"m{n}", f"memory {n}") for n in range(4, 9)])
    assert _unindexed(store) == {column: 5 for column in INDEXED_COLUMNS}
    store.upsert([memory(f"m{n}", f"memory {n}") for n in range(9, 13)])  # 9 behind
    assert _unindexed(store) == {column: 9 for column in INDEXED_COLUMNS}
    store.upsert([memory("m0", "memory 0, again", version=2)])  # 10 behind: refreshed
    assert _unindexed(store) == {column: 0 for column in INDEXED_COLUMNS}
    assert store.count() == 13


@integration
def test_nearest_reads_the_tenant_in_bounded_batches(
    store: LanceVectorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The nearest entry comes in the last batch, and is still found."""
    monkeypatch.setattr("projections.embeddings.lance.SCAN_BATCH_ROWS", 4)
    store.upsert([memory(f"m{index:02d}", f"unrelated note {index}") for index in range(11)])
    store.upsert([memory("target", "the user is allergic to peanuts")])

    (hits,) = store.nearest("tenant-a", EMBEDDER.embed(["the user is allergic to peanuts"]), 3)

    assert hits[0].entry.memory_id == "target"
    assert hits[0].distance == pytest.approx(0.0, abs=1e-5)


@integration
def test_removed_entries_stay_in_old_versions_until_the_history_is_purged(
    store: LanceVectorStore,
) -> None:
    secret = memory("m1", "the user's door code is 4711")
    store.upsert([secret, memory("m2", "likes jazz")])
    before_removal = store.table.version
    assert store.remove(Match("tenant-a", memory_ids=("m1",))) == 1
    assert store.get("tenant-a", [secret.id]) == []
    assert store.history_versions() >= 2

    # This is what purge_history exists for: the removed entry is still in the old version.
    store.table.checkout(before_removal)
    assert store.table.count_rows(f"id = {sql_string(secret.id)}") == 1
    store.table.checkout_latest()  # type: ignore[no-untyped-call]

    store.purge_history()

    assert store.history_versions() == 0
    with pytest.raises(ValueError, match="no longer exists"):
        store.table.checkout(before_removal)
    store.table.checkout_latest()  # type: ignore[no-untyped-call]
    assert ids(store.find(Match("tenant-a", subject=("user", "u1")))) == {
        memory_entry_id("tenant-a", "m2")
    }
    assert [hit.entry.memory_id for hit in store.search("tenant-a", secret.vector, 5)] == ["m2"]


@integration
def test_purging_erases_removed_entries_from_the_files_on_disk(tmp_path: Path) -> None:
    store = LanceVectorStore(tmp_path / "vectors", dim=EMBEDDER.dim, model=EMBEDDER.name)
    canary = "CANARY-7d1f a removed memory"
    # One write: all entries share one data file, of which the removal deletes only 5 %.
    # Compaction alone leaves such a file in place, the removed row masked but on disk.
    store.upsert([memory("m0", canary), *(memory(f"m{i}", f"memory {i}") for i in range(1, 20))])
    store.remove(Match("tenant-a", memory_ids=("m0",)))
    assert files_containing(tmp_path, canary.encode())

    store.purge_history()

    assert files_containing(tmp_path, canary.encode()) == []
    assert store.count() == 19
    assert store.history_versions() == 0


def files_containing(root: Path, needle: bytes) -> list[Path]:
    return [path for path in root.rglob("*") if path.is_file() and needle in path.read_bytes()]


@integration
def test_lancedb_records_the_deleted_rows_a_purge_rewrites(tmp_path: Path) -> None:
    """The purge reads lancedb's version statistic of deleted rows; were it gone (an upgrade
    renaming it), every purge would rewrite the whole table, unnoticed but for this."""
    store = LanceVectorStore(tmp_path / "vectors", dim=EMBEDDER.dim, model=EMBEDDER.name)
    store.upsert([memory(f"m{i}", f"memory {i}") for i in range(20)])
    assert not deleted_rows_remain(store.table)
    store.remove(Match("tenant-a", memory_ids=("m0",)))
    assert deleted_rows_remain(store.table)
    store.purge_history()
    assert not deleted_rows_remain(store.table)


@integration
def test_purging_the_history_warns_nothing(tmp_path: Path) -> None:
    """LanceDB's warning about cleaning up every old version is expected and filtered by its
    wording: an upgrade that rewords it fails here, not in a user's log."""
    store = LanceVectorStore(tmp_path / "vectors", dim=EMBEDDER.dim, model=EMBEDDER.name)
    store.upsert([memory("m1", "one"), memory("m2", "two")])
    store.remove(Match("tenant-a", memory_ids=("m1",)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store.purge_history()
    assert store.history_versions() == 0


@integration
def test_another_store_on_the_same_path_sees_the_writes(tmp_path: Path) -> None:
    writer = LanceVectorStore(tmp_path / "vectors", dim=EMBEDDER.dim, model=EMBEDDER.name)
    reader = LanceVectorStore(tmp_path / "vectors", dim=EMBEDDER.dim, model=EMBEDDER.name)
    assert reader.count() == 0

    first, second = memory("m1", "likes jazz"), memory("m2", "likes opera")
    writer.upsert([first, second])
    assert reader.get("tenant-a", [first.id, second.id]) == [first, second]
    assert reader.search("tenant-a", first.vector, 1)[0].entry == first

    writer.remove(Match("tenant-a", memory_ids=("m1",)))
    writer.purge_history()

    assert reader.count() == 1
    assert reader.get("tenant-a", [first.id, second.id]) == [second]
    assert [hit.entry for hit in reader.search("tenant-a", first.vector, 5)] == [second]
    assert reader.history_versions() == 0
    # The reader can take over writing.
    reader.upsert([first])
    assert writer.get("tenant-a", [first.id]) == [first]


@integration
def test_a_reader_whose_version_was_cleaned_up_reopens_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = LanceVectorStore(tmp_path / "vectors", dim=EMBEDDER.dim, model=EMBEDDER.name)
    reader = LanceVectorStore(tmp_path / "vectors", dim=EMBEDDER.dim, model=EMBEDDER.name)
    first, second = memory("m1", "likes jazz"), memory("m2", "likes opera")
    writer.upsert([first, second])
    assert reader.get("tenant-a", [first.id]) == [first]
    # The race, made certain: the writer purges between the reader's refresh and its read.
    stale_handle = reader.table
    monkeypatch.setattr(stale_handle, "checkout_latest", lambda: None)
    writer.remove(Match("tenant-a", memory_ids=("m1",)))
    writer.purge_history()
    with pytest.raises(RuntimeError, match="Not found"):
        stale_handle.search().to_arrow()

    assert reader.get("tenant-a", [first.id, second.id]) == [second]
    assert reader.table is not stale_handle
