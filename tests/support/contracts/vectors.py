"""The vector store's contract (``projections.embeddings.vectors.VectorStore``): storing,
selecting, searching, scanning, the history an erasure must purge, one entry per tenant and
id, and what a tombstone must leave unreachable through the embeddings store.

Run against the in-memory fake (tests/projections/test_vector_store.py) and against LanceDB
and PostgreSQL (the same module, under the integration marker); a new adapter subclasses
``VectorStoreContract`` and gives ``store`` and ``shadows``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Protocol

import numpy as np
import pytest

from projections.deletion.derived import match_of
from projections.deletion.erasure import Erasure, ErasureIndex, subject_key
from projections.embeddings.lexical import lexical_ranking, query_terms, terms
from projections.embeddings.vectors import (
    EntryRef,
    Match,
    MemoryOnly,
    VectorEntry,
    VectorStore,
    memory_entry_id,
    message_entry_id,
)
from projections.sealing.crypto import new_data_key
from projections.sealing.probes import ProbeSealer
from projections.stores import embeddings as embeddings_store
from projections.stores.base import Erased, VectorShadows
from projections.stores.embeddings import EmbeddingsStore
from support.vector_entries import EMBEDDER, T0, ids, memory, message
from topics.deletion import DeletionTarget, Tombstone, TombstoneItem

NASTY = [
    "o'hara",
    "''",
    "back\\slash",
    "trailing\\",
    "\\'",
    "100%_like",
    'double"quote',
    "x' OR '1'='1",
    "ünïcødé ☃ 東京",
    "new\nline\ttab",
    "nul\x00byte",
    ") OR (1=1",
]


class RebuildTables(VectorShadows, Protocol):
    """The rebuild tables beside a store (``VectorShadows``), and how a test leaves one."""

    def create(self, created: datetime) -> VectorStore:
        """A rebuild table made at ``created``, as a killed rebuild leaves it."""
        ...


def count_purges(store: VectorStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times ``store.purge_history`` runs (one number, in a list the test reads)."""
    purges = [0]
    purge = store.purge_history

    def counted() -> None:
        purges[0] += 1
        purge()

    monkeypatch.setattr(store, "purge_history", counted)
    return purges


def _cosine(a: list[float] | tuple[float, ...], b: tuple[float, ...]) -> float:
    left, right = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    return float(1.0 - left @ right / (np.linalg.norm(left) * np.linalg.norm(right)))


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


def erase(store: VectorStore, tombstone: Tombstone) -> Erased:
    """Through the real erasure path of the embeddings store."""
    embeddings = EmbeddingsStore(store, asyncio.Lock(), ProbeSealer(new_data_key()))
    return asyncio.run(embeddings.erase(tombstone))


def subject_erasure(deletion_id: str, tenant_id: str, subject_id: str, memories: int) -> Tombstone:
    items = [TombstoneItem(type="memory", id=f"{subject_id}-{n}") for n in range(memories)]
    target = DeletionTarget(type="subject", subject_type="user", id=subject_id)
    return tombstone(tenant_id, ("memory", "-"), items).model_copy(
        update={"deletion_id": deletion_id, "target": target}
    )


def population() -> list[VectorEntry]:
    a, b = "tenant-a", "tenant-b"
    return [
        memory("m1", "one", a, ("user", "u1")),
        memory("m2", "two", a, ("user", "u1")),
        memory("m3", "three", a, ("user", "u2")),
        memory("m4", "four", a, ("agent", "u1")),
        message("c1", "msg1", "hi", a, ("user", "u1")),
        message("c1", "msg2", "hello", a, ("user", "u1")),
        message("c2", "msg1", "bye", a, ("user", "u2")),
        # Tenant B reuses every identifier of tenant A: none of it may be touched.
        memory("m1", "one", b, ("user", "u1")),
        memory("m3", "three", b, ("user", "u2")),
        message("c1", "msg1", "hi", b, ("user", "u1")),
        message("c2", "msg1", "bye", b, ("user", "u2")),
    ]


def stored(store: VectorStore, entries: list[VectorEntry]) -> list[VectorEntry]:
    """Which of ``entries`` the store holds, asking each tenant for its own."""
    tenants = sorted({entry.tenant_id for entry in entries})
    return [
        found
        for tenant in tenants
        for found in store.get(tenant, [e.id for e in entries if e.tenant_id == tenant])
    ]


def a_memory(memory_id: str) -> str:
    return memory_entry_id("tenant-a", memory_id)


def a_message(conversation_id: str, message_id: str) -> str:
    return message_entry_id("tenant-a", conversation_id, message_id)


REMOVALS = {
    "subject": (
        Match("tenant-a", subject=("user", "u1")),
        {a_memory("m1"), a_memory("m2"), a_message("c1", "msg1"), a_message("c1", "msg2")},
    ),
    "conversations": (
        Match("tenant-a", conversation_ids=("c1", "c2", "c-unknown")),
        {a_message("c1", "msg1"), a_message("c1", "msg2"), a_message("c2", "msg1")},
    ),
    "memories": (
        Match("tenant-a", memory_ids=("m2", "m4")),
        {a_memory("m2"), a_memory("m4")},
    ),
    "entry ids": (
        Match("tenant-a", entry_ids=(a_memory("m3"), a_message("c2", "msg1"), "other")),
        {a_memory("m3"), a_message("c2", "msg1")},
    ),
    "any of several criteria": (
        Match("tenant-a", subject=("user", "u2"), memory_ids=("m4",), entry_ids=(a_memory("m1"),)),
        {a_memory("m1"), a_memory("m3"), a_memory("m4"), a_message("c2", "msg1")},
    ),
    "another tenant's ids": (
        Match("tenant-b", memory_ids=("m2", "m4"), conversation_ids=("c1",)),
        {message_entry_id("tenant-b", "c1", "msg1")},
    ),
    "nothing but the tenant": (Match("tenant-a"), set()),
}


class VectorStoreContract:
    """Every ``VectorStore``. ``store``: an empty store for ``EMBEDDER``'s vectors;
    ``shadows``: the rebuild tables beside it; ``keeps_versions``: whether it keeps old
    versions until a purge; ``unstorable``: the identifiers of ``NASTY``
    its engine cannot hold, which it refuses with a ValueError, storing nothing."""

    unstorable: frozenset[str] = frozenset()
    # Whether the store keeps its table's old versions (LanceDB's, the fake's) until
    # ``purge_history``; one that keeps none has nothing for ``history_find`` to find.
    keeps_versions = True

    @pytest.fixture
    def store(self) -> VectorStore:
        raise NotImplementedError("a backend's subclass gives its empty store")

    @pytest.fixture
    def shadows(self, store: VectorStore) -> RebuildTables:
        raise NotImplementedError("a backend's subclass gives the rebuild tables beside it")

    # -- storing ---------------------------------------------------------------------------

    def test_upserted_entries_come_back_as_they_were_stored(self, store: VectorStore) -> None:
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

    def test_upsert_replaces_an_entry_with_the_same_id(self, store: VectorStore) -> None:
        store.upsert([memory("m1", "prefers window seats"), memory("m2", "vegetarian")])
        newer = memory("m1", "prefers aisle seats", version=2)
        store.upsert([newer])

        assert store.get("tenant-a", [newer.id]) == [newer]
        assert store.count() == 2

    def test_of_several_entries_with_one_id_in_a_batch_the_last_wins(
        self,
        store: VectorStore,
    ) -> None:
        stored = memory("m1", "version one")
        store.upsert([stored])
        second, third = (
            memory("m1", "version two", version=2),
            memory("m1", "version three", version=3),
        )
        fresh_one, fresh_two = memory("m2", "fresh one"), memory("m2", "fresh two", version=2)

        store.upsert([second, fresh_one, third, fresh_two])

        assert store.get("tenant-a", [stored.id, fresh_one.id]) == [third, fresh_two]
        assert store.count() == 2

    def test_upsert_refuses_a_vector_of_another_dimension(self, store: VectorStore) -> None:
        wrong = dataclasses.replace(memory("m1", "x"), vector=(1.0, 0.0))
        with pytest.raises(ValueError, match="2 dimensions"):
            store.upsert([wrong])
        assert store.count() == 0

    def test_a_memory_entry_without_kind_or_scope_is_refused(self, store: VectorStore) -> None:
        with pytest.raises(ValueError, match="no kind or scope"):
            store.upsert([dataclasses.replace(memory("m1", "x"), memory_kind=None)])
        with pytest.raises(ValueError, match="no kind or scope"):
            store.upsert([dataclasses.replace(memory("m1", "x"), scope=None)])
        assert store.count() == 0

    def test_an_empty_store_finds_nothing(self, store: VectorStore) -> None:
        vector = EMBEDDER.embed(["anything"])[0]
        assert store.search("tenant-a", vector, limit=5) == []
        assert store.find(Match("tenant-a", subject=("user", "u1"))) == []
        assert store.remove(Match("tenant-a", subject=("user", "u1"))) == 0
        assert store.count() == 0

    def test_search_ranks_the_same_text_first(self, store: VectorStore) -> None:
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
        self,
        store: VectorStore,
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
        assert (
            store.search_candidates("tenant-a", query, 5, only=MemoryOnly(kinds=frozenset())) == []
        )

    def test_search_never_returns_another_tenants_entry(self, store: VectorStore) -> None:
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

    def test_search_can_be_narrowed_to_one_subject(self, store: VectorStore) -> None:
        store.upsert(
            [
                memory("m1", "likes tea", subject=("user", "u1")),
                memory("m2", "likes tea a lot", subject=("user", "u2")),
                memory("m3", "likes tea", subject=("agent", "u2")),
            ]
        )
        hits = store.search(
            "tenant-a", EMBEDDER.embed(["likes tea"])[0], 10, subject=("user", "u2")
        )
        assert [hit.entry.memory_id for hit in hits] == ["m2"]

    def test_a_confined_search_ranks_the_admitted_entries_only(self, store: VectorStore) -> None:
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

    def test_a_confined_search_quotes_hostile_kinds_and_scopes(self, store: VectorStore) -> None:
        odd = memory("m1", "likes tea", memory_kind="it's", scope="a' OR '1'='1")
        store.upsert([odd, memory("m2", "likes tea too")])
        (query,) = EMBEDDER.embed(["likes tea"])
        only = MemoryOnly(kinds=frozenset({"it's"}), scopes=frozenset({"a' OR '1'='1"}))
        assert [hit.entry for hit in store.search("tenant-a", query, 5, only=only)] == [odd]
        assert store.search("tenant-a", query, 5, only=MemoryOnly(scopes=frozenset({"a"}))) == []

    def test_search_checks_the_query_vector_and_limit(self, store: VectorStore) -> None:
        store.upsert([memory("m1", "anything")])
        with pytest.raises(ValueError, match="dimensions"):
            store.search("tenant-a", [1.0, 0.0], limit=1)
        assert store.search("tenant-a", EMBEDDER.embed(["anything"])[0], limit=0) == []

    # -- lexical search ------------------------------------------------------------------

    def test_lexical_search_finds_ids_written_any_way(self, store: VectorStore) -> None:
        invoices = [
            memory("m1", "invoice INV-2024-0042 was paid by bank transfer"),
            memory("m2", "invoice INV-2024-0043 is overdue"),
            memory("m3", "invoice INV-2023-0042 was disputed"),
            memory("m4", "ticket TCK-88123 about the broken login"),
            memory("m5", "ordered SKU AB-12-X twice; Müller signed for it"),
            memory(
                "m6", "a receipt typed in full width: \uff32\uff23\uff30\uff0d\uff17\uff17\uff11"
            ),
        ]
        store.upsert(invoices)

        def first(text: str) -> str | None:
            hits = store.lexical_candidates("tenant-a", text, 5, subject=("user", "u1"))
            return hits[0].memory_id if hits else None

        assert first("INV-2024-0042") == "m1"
        assert first("what happened to inv20240042?") == "m1"
        assert first("inv 2024 0042") == "m1"
        assert first("status of TCK-88123") == "m4"
        assert first("sku ab-12-x") == "m5"
        assert first("MÜLLER") == "m5"
        assert first("rcp-771") == "m6" and first("RCP771") == "m6"
        assert first("nothing shared") is None
        hits = store.lexical_candidates("tenant-a", "invoice INV-2024-0042", 5)
        assert [hit.memory_id for hit in hits][:1] == ["m1"]
        assert {hit.memory_id for hit in hits} == {"m1", "m2", "m3"}
        assert [hit.score for hit in hits] == sorted((hit.score for hit in hits), reverse=True)
        # Every store scores as the one rule does, over the same candidates.
        documents = [(entry.id, terms(entry.text)) for entry in invoices]
        for text in ("invoice INV-2024-0042", "paid or disputed", "ab12x"):
            expected = lexical_ranking(query_terms(text), documents, len(documents), 3)
            hits = store.lexical_candidates("tenant-a", text, 3, subject=("user", "u1"))
            assert [hit.id for hit in hits] == [entry_id for _, entry_id in expected], text
            assert [hit.score for hit in hits] == pytest.approx([s for s, _ in expected]), text
        (hit,) = store.lexical_candidates("tenant-a", "TCK-88123", 1)
        assert (hit.id, hit.kind, hit.tenant_id, hit.version) == (
            invoices[3].id,
            "memory",
            "tenant-a",
            1,
        )

    def test_lexical_search_ranks_within_the_tenant_subject_kinds_and_scopes(
        self, store: VectorStore
    ) -> None:
        text = "ticket TCK-88123"
        store.upsert(
            [
                memory("mine", text),
                memory("fact", text, memory_kind="fact", scope="team"),
                memory("bob", text, subject=("user", "bob")),
                memory("theirs", text, tenant_id="tenant-b"),
                message("c1", "msg1", text),
            ]
        )

        def found(
            only: MemoryOnly | None = None, subject: tuple[str, str] | None = None
        ) -> set[str]:
            hits = store.lexical_candidates("tenant-a", text, 10, subject=subject, only=only)
            assert all(hit.tenant_id == "tenant-a" for hit in hits)
            return {hit.id for hit in hits}

        assert found() == {
            a_memory("mine"), a_memory("fact"), a_memory("bob"), a_message("c1", "msg1")
        }  # fmt: skip
        assert found(subject=("user", "u1")) == {
            a_memory("mine"), a_memory("fact"), a_message("c1", "msg1")
        }  # fmt: skip
        assert found(MemoryOnly(), ("user", "u1")) == {a_memory("mine"), a_memory("fact")}
        assert found(MemoryOnly(kinds=frozenset({"fact"}))) == {a_memory("fact")}
        assert found(MemoryOnly(scopes=frozenset({"user"})), ("user", "u1")) == {a_memory("mine")}
        assert found(MemoryOnly(kinds=frozenset())) == set()
        assert store.lexical_candidates("tenant-a", text, 0) == []
        assert store.lexical_candidates("tenant-a", "", 5) == []
        assert store.lexical_candidates("tenant-c", text, 5) == []

    def test_lexical_search_follows_upserts_erasures_and_rebuilds(self, store: VectorStore) -> None:
        secret = memory("m1", "the door code of TCK-88123 is 4711")
        store.upsert([secret, memory("m2", "likes jazz")])
        store.upsert([dataclasses.replace(memory("m2", "likes TCK-88123"), version=2)])
        hits = store.lexical_candidates("tenant-a", "TCK-88123", 5)
        assert {(hit.memory_id, hit.version) for hit in hits} == {("m1", 1), ("m2", 2)}

        erased = erase(
            store, tombstone("tenant-a", ("memory", "m1"), [TombstoneItem(type="memory", id="m1")])
        )

        assert erased.removed == 1 and erased.reachable == []
        assert [hit.memory_id for hit in store.lexical_candidates("tenant-a", "4711", 5)] == []
        store.replace_all([memory("m3", "rebuilt with TCK-88123")])
        hits = store.lexical_candidates("tenant-a", "tck-88123", 5)
        assert [hit.memory_id for hit in hits] == ["m3"]

    def test_lexical_search_quotes_hostile_text(self, store: VectorStore) -> None:
        odd = memory("m1", "o'hara's back\\slash 100%_like x' OR '1'='1 & | ! <-> :*")
        store.upsert([odd, memory("m2", "plain")])
        for text in ["o'hara", "x' OR '1'='1", "& | ! <-> :*", "\\", "100%_like", "'"]:
            hits = store.lexical_candidates("tenant-a", text, 5)
            assert [hit.memory_id for hit in hits] in ([], ["m1"]), text
        assert [h.memory_id for h in store.lexical_candidates("tenant-a", "o'hara", 5)] == ["m1"]

    def test_nearest_ranks_many_query_vectors_as_search_ranks_each(
        self, store: VectorStore
    ) -> None:
        texts = [f"the user mentioned topic {index} of {index % 7}" for index in range(60)]
        store.upsert([memory(f"m{index}", text) for index, text in enumerate(texts)])
        store.upsert(
            [memory(f"b{index}", texts[index], tenant_id="tenant-b") for index in range(20)]
        )
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

    def test_nearest_never_returns_another_tenants_entry(self, store: VectorStore) -> None:
        text = "the user's bank PIN hint is their first cat"
        store.upsert([memory("m1", text), memory("m2", "the user likes jazz")])
        store.upsert([memory(f"canary{index}", text, tenant_id="tenant-b") for index in range(20)])
        query = EMBEDDER.embed([text])[0]

        (hits,) = store.nearest("tenant-a", [query], limit=2)

        assert [hit.entry.memory_id for hit in hits] == ["m1", "m2"]
        assert store.nearest("tenant-c", [query], limit=5) == [[]]

    def test_nearest_checks_the_query_vectors_and_limit(self, store: VectorStore) -> None:
        store.upsert([memory("m1", "anything")])
        vector = EMBEDDER.embed(["anything"])[0]
        with pytest.raises(ValueError, match="dimensions"):
            store.nearest("tenant-a", [vector, [1.0, 0.0]], limit=1)
        assert store.nearest("tenant-a", [vector, vector], limit=0) == [[], []]
        assert store.nearest("tenant-a", [], limit=5) == []

    def test_find_refs_reads_the_matching_entries_in_batches_of_at_most_the_given_rows(
        self,
        store: VectorStore,
    ) -> None:
        alice = [
            memory(f"a{index}", f"alice {index}", subject=("user", "alice")) for index in range(9)
        ]
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

    def test_old_versions_are_searched_for_what_was_removed(self, store: VectorStore) -> None:
        secret, kept = memory("m1", "the user's door code is 4711"), memory("m2", "likes jazz")
        store.upsert([secret, kept])
        store.remove(Match("tenant-a", memory_ids=("m1",)))
        removed = Match("tenant-a", memory_ids=("m1",))
        if not self.keeps_versions:
            # Gone at the removal's commit: no version of the table is left to hold it.
            assert store.history_find(removed) == [] and store.history_versions() == 0
            assert store.find(removed) == [] and store.get("tenant-a", [secret.id]) == []
            return
        assert {entry for _, entry in store.history_find(removed)} == {secret}

        store.purge_history()
        # Writes after the purge make new old versions, none of which holds the removed entry.
        store.upsert([memory("m3", "likes opera")])
        store.upsert([memory("m4", "likes blues")])
        assert store.history_versions() >= 2
        assert store.history_find(removed) == []
        assert {
            entry for _, entry in store.history_find(Match("tenant-a", memory_ids=("m2",)))
        } == {kept}

    def test_purging_an_unchanged_table_keeps_every_entry(self, store: VectorStore) -> None:
        store.purge_history()
        entries = [memory("m1", "one"), message("c1", "msg1", "two")]
        store.upsert(entries)
        store.purge_history()
        store.purge_history()
        assert store.get("tenant-a", [entry.id for entry in entries]) == entries
        assert store.history_versions() == 0

    def test_tenants_whose_ids_join_alike_keep_their_own_memories(self, store: VectorStore) -> None:
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

    def test_messages_whose_ids_join_alike_are_erased_apart(self, store: VectorStore) -> None:
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
        self,
        store: VectorStore,
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

    def test_the_audit_reads_in_bounded_batches_and_finds_a_ghost_in_the_last_one(
        self, store: VectorStore, monkeypatch: pytest.MonkeyPatch
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
        covered = {
            "tenant-a": ErasureIndex({subject_key("tenant-a", *alice): Erasure("d1", cut_off)})
        }
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

    def test_an_erasure_reaches_a_rebuild_table_left_behind_and_old_ones_are_dropped(
        self, store: VectorStore, shadows: RebuildTables
    ) -> None:
        """A killed ``memproj replay embeddings`` leaves its table: erasures reach it until the
        rebuild grace period drops it."""
        created = T0 + timedelta(days=1)
        left_behind = shadows.create(created)
        alice = memory("m_alice", "alice's memory", tenant_id="acme")
        bob = memory("m_bob", "bob's memory", tenant_id="acme")
        store.upsert([alice, bob])
        left_behind.upsert([alice, bob])
        embeddings = EmbeddingsStore(store, asyncio.Lock(), ProbeSealer(new_data_key()), shadows)
        gone = tombstone(
            "acme", ("memory", "m_alice"), [TombstoneItem(type="memory", id="m_alice")]
        )

        erased = asyncio.run(embeddings.erase(gone))

        assert erased.removed == 2 and erased.reachable == []
        assert left_behind.entries("acme") == [bob] and left_behind.history_versions() == 0
        (left_behind_name,) = shadows.tables()
        grace = timedelta(days=7)
        assert asyncio.run(embeddings.expire_copies(created + timedelta(days=6), grace)) == []
        assert asyncio.run(embeddings.expire_copies(created + grace, grace)) == [left_behind_name]
        assert shadows.tables() == {} and store.entries("acme") == [bob]

    def test_a_batch_of_erasures_is_removed_with_one_purge_and_verified_each(
        self, store: VectorStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        purges = count_purges(store, monkeypatch)

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
        for entries in (
            about("alice", 3),
            about("bob", 2),
            about("carol", 1, "beta"),
            kept,
            [later],
        ):
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
        assert purges == [1] and store.history_versions() == 0
        assert store.entries("acme") == sorted([*kept, later], key=lambda entry: entry.id)
        assert store.entries("beta") == []
        for erasure in batch:
            assert store.history_find(match_of(erasure)) == []
        assert asyncio.run(embeddings.erase_many([])) == [] and purges == [1]

    def test_the_verification_finds_erased_content_kept_under_another_id(
        self, store: VectorStore
    ) -> None:
        """The probe vectors of the erased text find a copy of it the erasure missed (written
        under another id), ranked by the store's ``nearest``."""
        secret = memory("m1", "the user's door code is 4711")
        store.upsert([secret, memory("m2", "likes jazz")])

        async def probes(*_: object) -> list[tuple[str, str, list[float]]]:
            return [("memory", "m1", list(secret.vector))]

        embeddings = EmbeddingsStore(
            store, asyncio.Lock(), ProbeSealer(new_data_key()), load_probes=probes
        )
        gone = tombstone("tenant-a", ("memory", "m1"), [TombstoneItem(type="memory", id="m1")])
        assert asyncio.run(embeddings.erase(gone)) == Erased(1, [])
        assert asyncio.run(embeddings.reachable(None, gone)) == []  # type: ignore[arg-type]

        store.upsert([dataclasses.replace(secret, id=f"{secret.id}:copy")])

        found = asyncio.run(embeddings.reachable(None, gone))  # type: ignore[arg-type]
        assert f"content:{secret.id}:copy" in found

    def test_a_batch_erasure_reports_what_is_left_per_tombstone(
        self, store: VectorStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The check is per tombstone: an old version the purge left is on each of them."""
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
        if not self.keeps_versions:
            assert all(e.reachable == [] for e in erased)  # no version left to purge
            return
        assert all(e.reachable and e.reachable[-1].endswith("old table versions") for e in erased)

    # -- selecting -----------------------------------------------------------------------

    @pytest.mark.parametrize(("match", "expected"), REMOVALS.values(), ids=REMOVALS.keys())
    def test_find_and_remove_take_exactly_the_matching_entries(
        self, store: VectorStore, match: Match, expected: set[str]
    ) -> None:
        everything = population()
        store.upsert(everything)
        assert ids(entry for entry in everything if match.matches(entry)) == expected

        found = store.find(match)
        assert ids(found) == expected
        assert [entry.id for entry in found] == sorted(expected)

        assert store.remove(match) == len(expected)
        assert ids(stored(store, everything)) == ids(everything) - expected
        assert store.remove(match) == 0

    @pytest.mark.parametrize("nasty", NASTY)
    def test_identifiers_with_any_characters_select_only_themselves(
        self, store: VectorStore, nasty: str
    ) -> None:
        victim = message(nasty, nasty, "the nasty one", tenant_id=nasty, subject=(nasty, nasty))
        victim = dataclasses.replace(victim, memory_id=nasty)
        bystanders = [
            memory("m1", "the nasty one", tenant_id="tenant-a"),
            memory("m2", "the nasty one", tenant_id="x"),
            memory(nasty + "2", "the nasty one", tenant_id=nasty, subject=(nasty, nasty + "2")),
        ]
        if nasty in self.unstorable:
            with pytest.raises(ValueError, match=r"cannot store"):
                store.upsert([*bystanders[:2], victim])
            assert store.count() == 0
            return
        store.upsert([victim, *bystanders])

        assert store.get(nasty, [victim.id]) == [victim]
        hits = store.search(nasty, victim.vector, limit=10, subject=(nasty, nasty))
        assert [hit.entry for hit in hits] == [victim]
        for match in (
            Match(nasty, subject=(nasty, nasty)),
            Match(nasty, conversation_ids=(nasty,)),
            Match(nasty, memory_ids=(nasty,)),
            Match(nasty, entry_ids=(victim.id,)),
        ):
            assert store.find(match) == [victim]
        assert store.remove(Match(nasty, memory_ids=(nasty,))) == 1
        assert ids(stored(store, bystanders)) == ids(bystanders)
