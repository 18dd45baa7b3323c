"""Search by text, three ways, on one labelled set: by meaning (the default embedder), by exact
words (the lexical terms) and both fused (reciprocal rank), as the read path ranks them
(``streams.reads.rank_by_text`` over the in-memory vector store).

The set is one subject's memories: the paraphrases of tests/projections/data/paraphrases.json
(queries sharing no content word with their memory: meaning only finds them) and the exact
terms of tests/projections/data/exact_terms.json (invoice numbers, ticket ids, product codes,
names, each beside near misses: words find them). ``pytest -s`` prints recall@5 of each way,
on the whole set and on each part.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from projections.embeddings.embedder import Embedder, memory_text
from projections.embeddings.lexical import fuse, lexical_ranking, terms
from projections.embeddings.vectors import SEARCH_MODES, SearchMode
from projections.memory.store import RecallQuery
from streams.reads import rank_by_text
from support.embedders import loaded_embedder
from support.fakes.vectors import InMemoryVectorStore
from support.vector_entries import memory

DATA = Path(__file__).parent / "data"
K = 5
TENANT, SUBJECT = "acme", ("user", "customer")
# Hybrid may lose this much recall@5 to the better of the two on the whole set: a fused list
# can push one of the better ranking's hits out of the first five.
TOLERANCE = 0.03

Query = tuple[str, frozenset[str], str]  # text, relevant memory ids, what it names


@cache
def labelled() -> tuple[dict[str, str], list[Query]]:
    memories: dict[str, str] = {}
    queries: list[Query] = []
    for name, part in (("paraphrases.json", "paraphrase"), ("exact_terms.json", None)):
        data = json.loads((DATA / name).read_text())
        for found in data["memories"]:
            memories[found["id"]] = memory_text({"text": found["text"]}, found["kind"])
        for query in data["queries"]:
            names = part or query["names"]
            queries.append((query["text"], frozenset(query["relevant"]), names))
    return memories, queries


@cache
def indexed() -> InMemoryVectorStore:
    """The labelled memories, embedded by the default model (one store a session)."""
    embedder = loaded_embedder("wordllama")
    memories, _ = labelled()
    store = InMemoryVectorStore(embedder.dim, model=embedder.name)
    vectors = embedder.embed(list(memories.values()))
    store.upsert(
        [
            dataclasses.replace(
                memory(memory_id, text, TENANT, SUBJECT, memory_kind="fact"), vector=tuple(vector)
            )
            for (memory_id, text), vector in zip(memories.items(), vectors, strict=True)
        ]
    )
    return store


def ranked(embedder: Embedder, text: str, mode: SearchMode) -> list[str]:
    query = RecallQuery(TENANT, *SUBJECT, limit=K)
    found = asyncio.run(rank_by_text(indexed(), embedder, query, text, mode))
    return [candidate.memory_id for candidate in found if candidate.memory_id is not None]


def recall_at(embedder: Embedder, mode: SearchMode, queries: Sequence[Query], k: int) -> float:
    """The mean over ``queries`` of the share of its relevant memories in the first k."""
    return float(
        np.mean(
            [
                len(relevant & set(ranked(embedder, text, mode)[:k])) / len(relevant)
                for text, relevant, _ in queries
            ]
        )
    )


def test_the_exact_terms_are_in_their_memories_and_near_misses_beside_them() -> None:
    memories, queries = labelled()
    exact = [query for query in queries if query[2] != "paraphrase"]
    assert len(exact) >= 15 and {names for _, _, names in exact} == {"id", "name"}
    for text, relevant, _ in exact:
        for memory_id in relevant:
            assert set(terms(text)) & set(terms(memories[memory_id])), (text, memory_id)


def test_hybrid_recalls_at_least_the_better_of_meaning_and_words() -> None:
    embedder = loaded_embedder("wordllama")
    _, queries = labelled()
    parts = {
        "whole set": queries,
        "paraphrases": [q for q in queries if q[2] == "paraphrase"],
        "ids": [q for q in queries if q[2] == "id"],
        "names": [q for q in queries if q[2] == "name"],
    }
    scores = {
        (part, mode, k): recall_at(embedder, mode, chosen, k)
        for part, chosen in parts.items()
        for mode in SEARCH_MODES
        for k in (1, K)
    }
    print(f"\n{embedder.name}, recall@{K} (recall@1) of")
    print(f"{'':>17}" + "".join(f"{mode:>16}" for mode in SEARCH_MODES))
    for part, chosen in parts.items():
        print(f"{part:>12} ({len(chosen):>2})" + "".join(
            f"{scores[part, mode, K]:>9.3f} ({scores[part, mode, 1]:.3f})" for mode in SEARCH_MODES
        ))  # fmt: skip

    whole = {mode: scores["whole set", mode, K] for mode in SEARCH_MODES}
    assert whole["hybrid"] >= max(whole["semantic"], whole["lexical"]) - TOLERANCE
    # Each finds what the other misses: fused, more than either.
    assert whole["hybrid"] > whole["semantic"] and whole["hybrid"] > whole["lexical"]
    assert scores["ids", "hybrid", K] == 1.0, "every id-like query finds its memory"
    assert scores["ids", "hybrid", K] > scores["ids", "semantic", K]


# -- the rules, one by one ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("INV-2024-0042", ("0042", "2024", "inv", "inv-2024-0042", "inv20240042")),
        ("SKU AB-12-X.", ("12", "ab", "ab-12-x", "ab12x", "sku", "x")),
        ("Müller's ÉCOLE", ("müller", "s", "école")),
        ("call at 10:30 - ok", ("10", "1030", "10:30", "30", "at", "call", "ok")),
        ("a_b", ("a", "a_b", "ab", "b")),
        ("", ()),
        ("'; DROP --", ("drop",)),
    ],
)
def test_terms_keep_ids_whole_without_separators_and_in_parts(
    text: str, expected: tuple[str, ...]
) -> None:
    assert terms(text) == expected


def test_terms_of_a_huge_text_are_bounded() -> None:
    blob = " ".join(f"w{n}" for n in range(10_000)) + " " + "x" * 500
    found = terms(blob)
    assert len(found) == 4096 and max(map(len, found)) <= 64


def test_a_rare_term_outweighs_common_ones() -> None:
    documents = [
        ("a", terms("invoice INV-2024-0042 paid")),
        ("b", terms("invoice INV-2024-0043 paid")),
        ("c", terms("invoice paid paid")),
        ("d", terms("nothing here")),
    ]
    ranking = lexical_ranking(terms("invoice INV-2024-0042"), documents, 10, 10)
    assert [entry_id for _, entry_id in ranking] == ["a", "b", "c"]
    assert lexical_ranking(terms("unrelated"), documents, 10, 10) == []
    assert lexical_ranking(terms("invoice"), documents, 10, 0) == []
    # Ties by id.
    assert [i for _, i in lexical_ranking(["paid"], documents, 4, 2)] == ["a", "b"]


def test_fusion_adds_reciprocal_ranks() -> None:
    assert fuse([["a", "b", "c"], ["c", "a"]]) == ["a", "c", "b"]
    assert fuse([["a", "b"], ["b", "a"]]) == ["a", "b"]  # a tie, by id
    assert fuse([["x"], []]) == ["x"] and fuse([]) == []
    assert fuse([["a", "a", "b"]], k=1) == ["a", "b"]  # counted at its best rank only
    # With a small k the top of one ranking outweighs agreement lower down.
    rankings = [["a", "x", "y", "b"], ["c", "z", "w", "b"]]
    assert fuse(rankings, k=1)[0] == "a"
    assert fuse(rankings, k=60)[0] == "b"
