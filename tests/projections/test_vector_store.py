"""The LanceDB vector store, embedded on disk: storing, searching, history and sharing a
table between processes. No services needed (selection: test_vector_selection.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from datetime import UTC, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from projections.deletion.derived import match_of
from projections.deletion.erasure import Erasure, ErasureIndex, subject_key
from projections.embeddings import lance
from projections.embeddings.factory import WORDLLAMA_NAME, build_embedder
from projections.embeddings.lance import (
    DIM_KEY,
    INDEXED_COLUMNS,
    MODEL_KEY,
    SCHEMA_VERSION,
    LanceShadows,
    LanceVectorStore,
    indexes_behind,
    lance_schema,
    replay_table_name,
    sql_string,
    stored_schema_version,
    table_model,
)
from projections.embeddings.vectors import (
    EmbedderMismatch,
    EntryRef,
    Match,
    MemoryOnly,
    VectorEntry,
    VectorSchemaOutdated,
    check_embedder,
    memory_entry_id,
    message_entry_id,
)
from projections.sealing.crypto import new_data_key
from projections.sealing.probes import ProbeSealer
from projections.stores import embeddings as embeddings_store
from projections.stores.base import Erased
from projections.stores.embeddings import EmbeddingsStore
from support.vector_entries import EMBEDDER, T0, ids, memory, message
from topics.deletion import DeletionTarget, Tombstone, TombstoneItem


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


def test_upserted_entries_come_back_as_they_were_stored(store: LanceVectorStore) -> None:
    seat = memory("m1", "prefers window seats")
    hello = message("c1", "msg1", "hello there")
    store.upsert([seat, hello])

    assert store.get("tenant-a", [hello.id, "memory:tenant-a:unknown", seat.id, hello.id]) == [
        hello,
        seat,
    ]
    assert store.get("tenant-a", []) == []
    assert store.count() == 2
    (stored,) = store.get("tenant-a", [seat.id])
    assert stored.occurred_at.tzinfo is UTC


def test_upsert_replaces_an_entry_with_the_same_id(store: LanceVectorStore) -> None:
    store.upsert([memory("m1", "prefers window seats"), memory("m2", "vegetarian")])
    newer = memory("m1", "prefers aisle seats", version=2)
    store.upsert([newer])

    assert store.get("tenant-a", [newer.id]) == [newer]
    assert store.count() == 2


def test_of_several_entries_with_one_id_in_a_batch_the_last_wins(
    store: LanceVectorStore,
) -> None:
    stored = memory("m1", "version one")
    store.upsert([stored])
    second, third = memory("m1", "version two", version=2), memory("m1", "version three", version=3)
    fresh_one, fresh_two = memory("m2", "fresh one"), memory("m2", "fresh two", version=2)

    store.upsert([second, fresh_one, third, fresh_two])

    assert store.get("tenant-a", [stored.id, fresh_one.id]) == [third, fresh_two]
    assert store.count() == 2


def test_upsert_refuses_a_vector_of_another_dimension(store: LanceVectorStore) -> None:
    wrong = dataclasses.replace(memory("m1", "x"), vector=(1.0, 0.0))
    with pytest.raises(ValueError, match="2 dimensions"):
        store.upsert([wrong])
    assert store.count() == 0


def test_a_table_of_another_dimension_is_refused(tmp_path: Path) -> None:
    LanceVectorStore(tmp_path / "vectors", dim=8, model="hashing/8")
    with pytest.raises(ValueError, match=r"embedder hashing/8.*configured embedder is hashing/16"):
        LanceVectorStore(tmp_path / "vectors", dim=16, model="hashing/16")


# -- the embedder recorded with the vectors ------------------------------------------------


def test_a_new_table_records_its_embedder_through_every_write(tmp_path: Path) -> None:
    store = LanceVectorStore(tmp_path / "vectors", dim=EMBEDDER.dim, model=EMBEDDER.name)
    assert table_model(tmp_path / "vectors") == "hashing/256"
    assert (store.table.schema.metadata or {})[DIM_KEY] == b"256"
    store.upsert([memory("m1", "likes jazz"), memory("m2", "plays tennis")])
    store.remove(Match("tenant-a", memory_ids=("m1",)))
    store.purge_history()  # rewrites the live rows: the record stays
    assert table_model(tmp_path / "vectors") == "hashing/256"
    assert ids(store.entries("tenant-a")) == {memory_entry_id("tenant-a", "m2")}


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


def test_a_table_from_before_embedders_were_named_holds_hashing_vectors(tmp_path: Path) -> None:
    version_1_table(tmp_path / "vectors", 256, None, [])
    assert table_model(tmp_path / "vectors") == "hashing/256"
    with pytest.raises(EmbedderMismatch, match="hashing/256"):
        LanceVectorStore(tmp_path / "vectors", dim=256, model=WORDLLAMA_NAME)
    # Of the right model, but without the columns search filters by.
    with pytest.raises(VectorSchemaOutdated, match="memproj replay embeddings"):
        LanceVectorStore(tmp_path / "vectors", dim=256, model="hashing/256")


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


# -- search ------------------------------------------------------------------------------


def test_search_ranks_the_same_text_first(store: LanceVectorStore) -> None:
    texts = [
        "the user is allergic to peanuts",
        "the user prefers window seats on flights",
        "the user lives in Lisbon",
        "the user's manager is called Dana",
    ]
    store.upsert([memory(f"m{index}", text) for index, text in enumerate(texts)])
    query = EMBEDDER.embed(["the user prefers window seats on flights"])[0]

    hits = store.search("tenant-a", query, limit=3)

    assert hits[0].entry.memory_id == "m1"
    assert hits[0].distance == pytest.approx(0.0, abs=1e-5)
    assert len(hits) == 3
    assert [hit.distance for hit in hits] == sorted(hit.distance for hit in hits)


def test_search_candidates_are_searchs_hits_without_text_or_vector(
    store: LanceVectorStore,
) -> None:
    """What a read ranks by: the same entries, order and distances as ``search``, each its id,
    kind, tenant, memory and version only."""
    store.upsert(
        [memory(f"m{n}", f"likes tea number {n}", subject=("user", "u1")) for n in range(8)]
    )
    store.upsert([memory("other", "likes tea", tenant_id="tenant-b", subject=("user", "u1"))])
    (query,) = EMBEDDER.embed(["likes tea"])
    subject, only = ("user", "u1"), MemoryOnly(kinds=frozenset({"preference"}))

    hits = store.search("tenant-a", query, 5, subject, only)
    candidates = store.search_candidates("tenant-a", query, 5, subject, only)

    assert [(c.id, c.kind, c.tenant_id, c.memory_id, c.version) for c in candidates] == [
        (h.entry.id, h.entry.kind, h.entry.tenant_id, h.entry.memory_id, h.entry.version)
        for h in hits
    ]
    assert [c.distance for c in candidates] == pytest.approx([h.distance for h in hits])
    assert store.search_candidates("tenant-a", query, 5, only=MemoryOnly(kinds=frozenset())) == []


def test_search_never_returns_another_tenants_entry(store: LanceVectorStore) -> None:
    text = "the user's bank PIN hint is their first cat"
    store.upsert([memory("m1", text), memory("m2", "the user likes jazz")])
    # Tenant B holds the very same text many times over: nearer than anything of tenant A
    # except m1, and enough of them to fill the limit if filtering came after ranking.
    canaries = [memory(f"canary{index}", text, tenant_id="tenant-b") for index in range(20)]
    store.upsert(canaries)

    hits = store.search("tenant-a", EMBEDDER.embed([text])[0], limit=2)

    assert [hit.entry.id for hit in hits] == [
        memory_entry_id("tenant-a", "m1"),
        memory_entry_id("tenant-a", "m2"),
    ]
    assert store.search("tenant-c", EMBEDDER.embed([text])[0], limit=5) == []


def test_search_can_be_narrowed_to_one_subject(store: LanceVectorStore) -> None:
    store.upsert(
        [
            memory("m1", "likes tea", subject=("user", "u1")),
            memory("m2", "likes tea a lot", subject=("user", "u2")),
            memory("m3", "likes tea", subject=("agent", "u2")),
        ]
    )
    hits = store.search("tenant-a", EMBEDDER.embed(["likes tea"])[0], 10, subject=("user", "u2"))
    assert [hit.entry.memory_id for hit in hits] == ["m2"]


def test_a_confined_search_ranks_the_admitted_entries_only(store: LanceVectorStore) -> None:
    # A subject with many preferences near the query and a few facts far from it: the facts
    # are all found, ranked, however many nearer preferences there are.
    query_text = "prefers window seats on morning flights"
    near = [memory(f"p{n}", f"{query_text} number {n}") for n in range(40)]
    facts = [
        memory("f1", "lives in Lisbon near the river", memory_kind="fact"),
        memory("f2", "works at a bakery on morning shifts", memory_kind="fact", scope="team"),
        memory("f3", "has two cats", memory_kind="fact"),
    ]
    chat = [message("c1", f"msg{n}", f"{query_text} again {n}") for n in range(10)]
    store.upsert([*near, *facts, *chat])
    (query,) = EMBEDDER.embed([query_text])

    def expected(only: MemoryOnly, limit: int) -> list[tuple[str, float]]:
        """The brute-force answer: every admitted entry of the subject, by distance."""
        admitted = [e for e in [*near, *facts, *chat] if only.admits(e)]
        ranked = sorted((_cosine(query, e.vector), e.id) for e in admitted)
        return [(entry_id, distance) for distance, entry_id in ranked[:limit]]

    for only, limit in [
        (MemoryOnly(kinds=frozenset({"fact"})), 3),
        (MemoryOnly(kinds=frozenset({"fact"})), 10),
        (MemoryOnly(kinds=frozenset({"fact"}), scopes=frozenset({"team"})), 10),
        (MemoryOnly(scopes=frozenset({"team", "user"})), 5),
        (MemoryOnly(), 12),
    ]:
        hits = store.search("tenant-a", query, limit, subject=("user", "u1"), only=only)
        wanted = expected(only, limit)
        assert all(only.admits(hit.entry) for hit in hits), only
        assert [hit.distance for hit in hits] == pytest.approx(
            [distance for _, distance in wanted], abs=1e-5
        ), only
        # Of entries tied at the last place, either ranking may keep another.
        last = wanted[-1][1] - 1e-5
        assert [h.entry.id for h in hits if h.distance < last] == [
            entry_id for entry_id, distance in wanted if distance < last
        ], only
    facts_only = MemoryOnly(kinds=frozenset({"fact"}))
    assert len(store.search("tenant-a", query, 3, only=facts_only)) == 3
    # Unconfined, the messages and preferences fill the limit and no fact comes.
    assert not {h.entry.memory_kind for h in store.search("tenant-a", query, 10)} & {"fact"}
    # Nothing admitted, nothing asked: ``IN ()`` is no SQL.
    assert store.search("tenant-a", query, 5, only=MemoryOnly(kinds=frozenset())) == []
    assert store.search("tenant-a", query, 5, only=MemoryOnly(scopes=frozenset())) == []


def _cosine(a: list[float] | tuple[float, ...], b: tuple[float, ...]) -> float:
    import numpy as np

    left, right = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    return float(1.0 - left @ right / (np.linalg.norm(left) * np.linalg.norm(right)))


def test_a_confined_search_quotes_hostile_kinds_and_scopes(store: LanceVectorStore) -> None:
    odd = memory("m1", "likes tea", memory_kind="it's", scope="a' OR '1'='1")
    store.upsert([odd, memory("m2", "likes tea too")])
    (query,) = EMBEDDER.embed(["likes tea"])
    only = MemoryOnly(kinds=frozenset({"it's"}), scopes=frozenset({"a' OR '1'='1"}))
    assert [hit.entry for hit in store.search("tenant-a", query, 5, only=only)] == [odd]
    assert store.search("tenant-a", query, 5, only=MemoryOnly(scopes=frozenset({"a"}))) == []


def test_a_memory_entry_without_kind_or_scope_is_refused(store: LanceVectorStore) -> None:
    with pytest.raises(ValueError, match="no kind or scope"):
        store.upsert([dataclasses.replace(memory("m1", "x"), memory_kind=None)])
    with pytest.raises(ValueError, match="no kind or scope"):
        store.upsert([dataclasses.replace(memory("m1", "x"), scope=None)])
    assert store.count() == 0


# -- the scalar indexes ---------------------------------------------------------------------


def _unindexed(store: LanceVectorStore) -> dict[str, int]:
    found = {}
    for column in INDEXED_COLUMNS:
        stats = store.table.index_stats(f"{column}_idx")
        assert stats is not None, f"no index on {column}"
        found[column] = stats.num_unindexed_rows
    return found


def test_the_indexes_are_made_by_the_first_write_and_kept_through_overwrites(
    store: LanceVectorStore,
) -> None:
    store.upsert([memory("m1", "likes tea"), memory("m2", "likes coffee")])
    assert set(_unindexed(store)) == set(INDEXED_COLUMNS)
    # The prefilter of a search uses them.
    (query,) = EMBEDDER.embed(["likes tea"])
    where = lance.tenant_filter("tenant-a", ("user", "u1"))
    plan = store.table.search(query).where(where, prefilter=True).limit(3).explain_plan(True)
    assert "ScalarIndexQuery" in plan and "subject_id_idx" in plan, plan
    store.remove(Match("tenant-a", memory_ids=("m1",)))
    store.purge_history()  # rewrites the live rows (an overwrite drops a table's indexes)
    assert _unindexed(store) == {column: 0 for column in INDEXED_COLUMNS}
    store.replace_all([memory("m3", "likes cocoa")])
    assert _unindexed(store) == {column: 0 for column in INDEXED_COLUMNS}


def test_the_indexes_are_refreshed_once_enough_rows_are_behind(
    store: LanceVectorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lance, "INDEX_REFRESH_MIN_ROWS", 10)
    store.upsert([memory(f"m{n}", f"memory {n}") for n in range(4)])  # made, of these 4
    assert _unindexed(store) == {column: 0 for column in INDEXED_COLUMNS}
    store.upsert([memory(f"m{n}", f"memory {n}") for n in range(4, 9)])
    assert _unindexed(store) == {column: 5 for column in INDEXED_COLUMNS}
    store.upsert([memory(f"m{n}", f"memory {n}") for n in range(9, 13)])  # 9 behind
    assert _unindexed(store) == {column: 9 for column in INDEXED_COLUMNS}
    store.upsert([memory("m0", "memory 0, again", version=2)])  # 10 behind: refreshed
    assert _unindexed(store) == {column: 0 for column in INDEXED_COLUMNS}
    assert store.count() == 13


def test_indexes_are_refreshed_past_a_tenth_of_the_table_and_a_floor() -> None:
    assert not indexes_behind(0, lance.INDEX_REFRESH_MIN_ROWS - 1)
    assert indexes_behind(0, lance.INDEX_REFRESH_MIN_ROWS)
    assert not indexes_behind(1_000_000, 99_999)
    assert indexes_behind(1_000_000, 100_000)


def test_an_empty_store_finds_nothing(store: LanceVectorStore) -> None:
    vector = EMBEDDER.embed(["anything"])[0]
    assert store.search("tenant-a", vector, limit=5) == []
    assert store.find(Match("tenant-a", subject=("user", "u1"))) == []
    assert store.remove(Match("tenant-a", subject=("user", "u1"))) == 0
    assert store.count() == 0


def test_search_checks_the_query_vector_and_limit(store: LanceVectorStore) -> None:
    store.upsert([memory("m1", "anything")])
    with pytest.raises(ValueError, match="dimensions"):
        store.search("tenant-a", [1.0, 0.0], limit=1)
    assert store.search("tenant-a", EMBEDDER.embed(["anything"])[0], limit=0) == []


def test_nearest_ranks_many_query_vectors_as_search_ranks_each(store: LanceVectorStore) -> None:
    texts = [f"the user mentioned topic {index} of {index % 7}" for index in range(60)]
    store.upsert([memory(f"m{index}", text) for index, text in enumerate(texts)])
    store.upsert([memory(f"b{index}", texts[index], tenant_id="tenant-b") for index in range(20)])
    queries = EMBEDDER.embed([texts[3], texts[41], "nothing like the others", texts[59]])

    many = store.nearest("tenant-a", queries, limit=5)

    assert len(many) == len(queries)
    for query, hits in zip(queries, many, strict=True):
        alone = store.search("tenant-a", query, limit=5)
        assert [hit.distance for hit in hits] == pytest.approx(
            [hit.distance for hit in alone], abs=1e-5
        )
        # Of entries tied at the last place, either search may keep another.
        last = alone[-1].distance - 1e-5
        assert [h.entry.id for h in hits if h.distance < last] == [
            h.entry.id for h in alone if h.distance < last
        ]
    assert many[0][0].entry.memory_id == "m3"


def test_nearest_never_returns_another_tenants_entry(store: LanceVectorStore) -> None:
    text = "the user's bank PIN hint is their first cat"
    store.upsert([memory("m1", text), memory("m2", "the user likes jazz")])
    store.upsert([memory(f"canary{index}", text, tenant_id="tenant-b") for index in range(20)])
    query = EMBEDDER.embed([text])[0]

    (hits,) = store.nearest("tenant-a", [query], limit=2)

    assert [hit.entry.memory_id for hit in hits] == ["m1", "m2"]
    assert store.nearest("tenant-c", [query], limit=5) == [[]]


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


def test_nearest_checks_the_query_vectors_and_limit(store: LanceVectorStore) -> None:
    store.upsert([memory("m1", "anything")])
    vector = EMBEDDER.embed(["anything"])[0]
    with pytest.raises(ValueError, match="dimensions"):
        store.nearest("tenant-a", [vector, [1.0, 0.0]], limit=1)
    assert store.nearest("tenant-a", [vector, vector], limit=0) == [[], []]
    assert store.nearest("tenant-a", [], limit=5) == []


# -- scans without vectors ---------------------------------------------------------------


def test_find_refs_reads_the_matching_entries_in_batches_of_at_most_the_given_rows(
    store: LanceVectorStore,
) -> None:
    alice = [memory(f"a{index}", f"alice {index}", subject=("user", "alice")) for index in range(9)]
    store.upsert([*alice, memory("b1", "bob", subject=("user", "bob"))])
    store.upsert([memory("a0", "another tenant's alice", tenant_id="tenant-b")])

    batches = list(store.find_refs(Match("tenant-a", subject=("user", "alice")), batch_rows=4))

    assert len(batches) >= 3 and all(0 < len(batch) <= 4 for batch in batches)
    refs = sorted((ref for batch in batches for ref in batch), key=lambda ref: ref.id)
    assert refs == [
        EntryRef(
            id=e.id,
            kind=e.kind,
            tenant_id=e.tenant_id,
            subject_type=e.subject_type,
            subject_id=e.subject_id,
            memory_id=e.memory_id,
            conversation_id=e.conversation_id,
            occurred_at=e.occurred_at,
        )
        for e in sorted(alice, key=lambda entry: entry.id)
    ]
    assert list(store.find_refs(Match("tenant-a"), batch_rows=4)) == []


def test_the_audit_reads_in_bounded_batches_and_finds_a_ghost_in_the_last_one(
    store: LanceVectorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The subject's entries written after its erasure's cut-off are new data; the one
    written before it, last, is a ghost."""
    monkeypatch.setattr(embeddings_store, "SCAN_BATCH_ROWS", 3)
    alice = ("user", "alice")
    store.upsert(
        [memory(f"new{index:02d}", "new", subject=alice, version=90) for index in range(10)]
    )
    store.upsert([memory("old", "from before the erasure", subject=alice, version=1)])
    cut_off = T0 + timedelta(minutes=30)
    covered = {"tenant-a": ErasureIndex({subject_key("tenant-a", *alice): Erasure("d1", cut_off)})}
    batches: list[list[EntryRef]] = []
    scan = store.find_refs

    def recorded(match: Match, batch_rows: int) -> Iterator[list[EntryRef]]:
        for batch in scan(match, batch_rows):
            batches.append(batch)
            yield batch

    monkeypatch.setattr(store, "find_refs", recorded)
    embeddings = EmbeddingsStore(store, asyncio.Lock(), ProbeSealer(new_data_key()))

    ghosts = asyncio.run(embeddings.ghosts(None, covered))  # type: ignore[arg-type]

    assert ghosts == [memory_entry_id("tenant-a", "old")]
    assert len(batches) >= 4 and all(len(batch) <= 3 for batch in batches)
    assert memory_entry_id("tenant-a", "old") in {ref.id for ref in batches[-1]}


# -- history -----------------------------------------------------------------------------


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


def test_old_versions_are_searched_for_what_was_removed(store: LanceVectorStore) -> None:
    secret, kept = memory("m1", "the user's door code is 4711"), memory("m2", "likes jazz")
    store.upsert([secret, kept])
    store.remove(Match("tenant-a", memory_ids=("m1",)))
    removed = Match("tenant-a", memory_ids=("m1",))
    assert {entry for _, entry in store.history_find(removed)} == {secret}

    store.purge_history()
    # Writes after the purge make new old versions, none of which holds the removed entry.
    store.upsert([memory("m3", "likes opera")])
    store.upsert([memory("m4", "likes blues")])
    assert store.history_versions() >= 2
    assert store.history_find(removed) == []
    assert {entry for _, entry in store.history_find(Match("tenant-a", memory_ids=("m2",)))} == {
        kept
    }


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


def test_purging_an_unchanged_table_keeps_every_entry(store: LanceVectorStore) -> None:
    store.purge_history()
    entries = [memory("m1", "one"), message("c1", "msg1", "two")]
    store.upsert(entries)
    store.purge_history()
    store.purge_history()
    assert store.get("tenant-a", [entry.id for entry in entries]) == entries
    assert store.history_versions() == 0


# -- several processes -------------------------------------------------------------------


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


# -- one entry per tenant and id ---------------------------------------------------------


def tombstone(tenant_id: str, target: tuple[str, str], items: list[TombstoneItem]) -> Tombstone:
    return Tombstone(
        deletion_id="del-1",
        tenant_id=tenant_id,
        kind="erasure",
        target=DeletionTarget(type=target[0], id=target[1]),  # type: ignore[arg-type]
        items=tuple(items),
        issued_at=T0,
        cut_off=T0 + timedelta(hours=1),
        deadline_at=T0 + timedelta(days=1),
        required_stores=("embeddings",),
    )


def erase(store: LanceVectorStore, tombstone: Tombstone) -> Erased:
    """Through the real erasure path of the embeddings store."""
    embeddings = EmbeddingsStore(store, asyncio.Lock(), ProbeSealer(new_data_key()))
    return asyncio.run(embeddings.erase(tombstone))


def test_tenants_whose_ids_join_alike_keep_their_own_memories(store: LanceVectorStore) -> None:
    # "acme:x" + "m1" and "acme" + "x:m1" once made one id: one tenant's write replaced the
    # other's, and erasing one erased both.
    theirs = memory("m1", "acme:x's memory", tenant_id="acme:x")
    ours = memory("x:m1", "acme's memory", tenant_id="acme")
    store.upsert([theirs, ours])
    store.upsert([dataclasses.replace(ours, text="acme's memory, corrected", version=2)])

    assert store.get("acme:x", [theirs.id, ours.id]) == [theirs]
    (corrected,) = store.get("acme", [theirs.id, ours.id])
    assert corrected.text == "acme's memory, corrected"
    assert store.count() == 2
    assert [hit.entry for hit in store.search("acme:x", theirs.vector, 5)] == [theirs]

    erased = erase(
        store, tombstone("acme", ("memory", "x:m1"), [TombstoneItem(type="memory", id="x:m1")])
    )

    assert erased.removed == 1 and erased.reachable == []
    assert store.get("acme", [ours.id]) == []
    assert store.get("acme:x", [theirs.id]) == [theirs]
    assert store.tenants() == ["acme:x"]


def test_messages_whose_ids_join_alike_are_erased_apart(store: LanceVectorStore) -> None:
    # Within one tenant: conversation "c:1" message "m" and conversation "c" message "1:m".
    first = message("c:1", "m", "the first conversation", tenant_id="acme")
    second = message("c", "1:m", "the second conversation", tenant_id="acme")
    store.upsert([first, second])
    assert first.id != second.id
    assert store.entries("acme") == sorted([first, second], key=lambda entry: entry.id)

    erased = erase(
        store,
        tombstone(
            "acme",
            ("conversation", "c:1"),
            [TombstoneItem(type="message", id="m", conversation_id="c:1")],
        ),
    )

    assert erased.removed == 1 and erased.reachable == []
    assert store.entries("acme") == [second]
    assert [hit.entry for hit in store.search("acme", first.vector, 5)] == [second]


def test_an_upsert_never_replaces_another_tenants_entry_with_the_same_id(
    store: LanceVectorStore,
) -> None:
    # Ids name the tenant, but the store does not rely on it: it merges on (tenant, id).
    mine = memory("m1", "mine", tenant_id="tenant-a")
    forged = dataclasses.replace(memory("m1", "forged", tenant_id="tenant-b"), id=mine.id)
    store.upsert([mine])
    store.upsert([forged])

    assert store.get("tenant-a", [mine.id]) == [mine]
    assert store.get("tenant-b", [mine.id]) == [forged]
    assert store.count() == 2
    assert store.tenants() == ["tenant-a", "tenant-b"]
    assert store.entries("tenant-a") == [mine]


# -- rebuild tables beside the live one ------------------------------------------------------


def test_an_erasure_reaches_a_rebuild_table_left_behind_and_old_ones_are_dropped(
    tmp_path: Path,
) -> None:
    """A killed ``memproj replay embeddings`` leaves its table: erasures reach it until the
    rebuild grace period drops it."""
    path = tmp_path / "vectors"
    live = LanceVectorStore(path, dim=EMBEDDER.dim, model=EMBEDDER.name)
    shadows = LanceShadows(path, EMBEDDER.dim, model=EMBEDDER.name)
    created = T0 + timedelta(days=1)
    left_behind = shadows.open(replay_table_name(created))
    alice = memory("m_alice", "alice's memory", tenant_id="acme")
    bob = memory("m_bob", "bob's memory", tenant_id="acme")
    live.upsert([alice, bob])
    left_behind.upsert([alice, bob])
    embeddings = EmbeddingsStore(live, asyncio.Lock(), ProbeSealer(new_data_key()), shadows)
    gone = tombstone("acme", ("memory", "m_alice"), [TombstoneItem(type="memory", id="m_alice")])

    erased = asyncio.run(embeddings.erase(gone))

    assert erased.removed == 2 and erased.reachable == []
    assert left_behind.entries("acme") == [bob] and left_behind.history_versions() == 0
    (left_behind_name,) = shadows.tables()
    grace = timedelta(days=7)
    assert asyncio.run(embeddings.expire_copies(created + timedelta(days=6), grace)) == []
    assert asyncio.run(embeddings.expire_copies(created + grace, grace)) == [left_behind_name]
    assert shadows.tables() == {} and live.entries("acme") == [bob]


# -- a batch of erasures -------------------------------------------------------------------


class CountingPurges(LanceVectorStore):
    purges = 0

    def purge_history(self) -> None:
        self.purges += 1
        super().purge_history()


def subject_erasure(deletion_id: str, tenant_id: str, subject_id: str, memories: int) -> Tombstone:
    items = [TombstoneItem(type="memory", id=f"{subject_id}-{n}") for n in range(memories)]
    target = DeletionTarget(type="subject", subject_type="user", id=subject_id)
    return tombstone(tenant_id, ("memory", "-"), items).model_copy(
        update={"deletion_id": deletion_id, "target": target}
    )


def test_a_batch_of_erasures_is_removed_with_one_purge_and_verified_each(tmp_path: Path) -> None:
    store = CountingPurges(tmp_path / "vectors", dim=EMBEDDER.dim, model=EMBEDDER.name)

    def about(subject_id: str, memories: int, tenant_id: str = "acme") -> list[VectorEntry]:
        subject = ("user", subject_id)
        return [
            memory(f"{subject_id}-{n}", f"{subject_id} fact {n}", tenant_id, subject)
            for n in range(memories)
        ]

    kept = about("dave", 1)
    # After the erasure's cut-off and not among its items: the subject's new data stays.
    later = memory("alice-new", "alice, later", "acme", ("user", "alice"), version=120)
    # One upsert each: the table has old versions to purge.
    for entries in (about("alice", 3), about("bob", 2), about("carol", 1, "beta"), kept, [later]):
        store.upsert(entries)
    batch = [
        subject_erasure("del-alice", "acme", "alice", 3),
        subject_erasure("del-bob", "acme", "bob", 2),
        subject_erasure("del-carol", "beta", "carol", 1),
        # Redelivered, or a revocation of what the first erases: removed by the first.
        tombstone("acme", ("memory", "alice-0"), [TombstoneItem(type="memory", id="alice-0")]),
    ]
    embeddings = EmbeddingsStore(store, asyncio.Lock(), ProbeSealer(new_data_key()))

    erased = asyncio.run(embeddings.erase_many(batch))

    assert erased == [Erased(3, []), Erased(2, []), Erased(1, []), Erased(0, [])]
    assert store.purges == 1 and store.history_versions() == 0
    assert store.entries("acme") == sorted([*kept, later], key=lambda entry: entry.id)
    assert store.entries("beta") == []
    for erasure in batch:
        assert store.history_find(match_of(erasure)) == []
    assert asyncio.run(embeddings.erase_many([])) == [] and store.purges == 1


def test_a_batch_erasure_reports_what_is_left_per_tombstone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check is per tombstone: an old version the purge left is on each of them."""
    store = LanceVectorStore(tmp_path / "vectors", dim=EMBEDDER.dim, model=EMBEDDER.name)
    store.upsert([memory("alice-0", "alice's fact", "acme", ("user", "alice"))])
    store.upsert([memory("bob-0", "bob's fact", "acme", ("user", "bob"))])
    monkeypatch.setattr(store, "purge_history", lambda: None)  # a purge that did nothing
    embeddings = EmbeddingsStore(store, asyncio.Lock(), ProbeSealer(new_data_key()))
    batch = [
        subject_erasure("del-alice", "acme", "alice", 1),
        subject_erasure("del-bob", "acme", "bob", 1),
    ]

    erased = asyncio.run(embeddings.erase_many(batch))

    assert [e.removed for e in erased] == [1, 1]
    assert all(e.reachable and e.reachable[-1].endswith("old table versions") for e in erased)


def test_the_store_is_opened_on_first_use_and_not_by_an_audit_of_no_erasure(
    tmp_path: Path,
) -> None:
    opened: list[str] = []

    def vectors() -> LanceVectorStore:
        opened.append("vectors")
        return LanceVectorStore(tmp_path / "vectors", dim=EMBEDDER.dim, model=EMBEDDER.name)

    def shadows() -> LanceShadows:
        opened.append("shadows")
        return LanceShadows(tmp_path / "vectors", EMBEDDER.dim, model=EMBEDDER.name)

    embeddings = EmbeddingsStore(vectors, asyncio.Lock(), ProbeSealer(new_data_key()), shadows)
    assert asyncio.run(embeddings.ghosts(None, {})) == []  # type: ignore[arg-type]
    assert opened == []

    covered = {"acme": ErasureIndex({subject_key("acme", "user", "u1"): Erasure("d1", T0)})}
    assert asyncio.run(embeddings.ghosts(None, covered)) == []  # type: ignore[arg-type]
    assert sorted(opened) == ["shadows", "vectors"]
    asyncio.run(embeddings.ghosts(None, covered))  # type: ignore[arg-type]
    assert len(opened) == 2
