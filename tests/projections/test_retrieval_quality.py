"""Semantic recall on paraphrases: the default embedder finds meaning, the hashing one words.

The labelled set (tests/projections/data/paraphrases.json) is one customer's memories and
queries that say the same thing in other words: no query shares a content word (or a word's
first five letters) with a memory relevant to it, which this module checks first; distractors
are memories of the same customer on neighbouring subjects. Ranking is exact cosine over the
whole set, as the vector store ranks one subject's entries. ``pytest -s`` prints both scores.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from projections.embeddings.embedder import Embedder, HashingEmbedder, memory_text
from support.embedders import loaded_embedder

DATA = Path(__file__).parent / "data" / "paraphrases.json"
K = 5
# Function words a paraphrase may keep: they carry no subject.
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "to",
        "in",
        "on",
        "at",
        "by",
        "for",
        "with",
        "from",
        "and",
        "or",
        "not",
        "no",
        "is",
        "are",
        "be",
        "as",
        "it",
        "its",
        "their",
        "them",
        "they",
        "when",
        "during",
        "after",
        "before",
        "instead",
        "over",
        "into",
        "out",
    ]
)


@dataclass(frozen=True)
class LabelledSet:
    memories: dict[str, str]  # id: the text the indexer embeds (kind, then value)
    queries: list[tuple[str, frozenset[str]]]


@cache
def labelled() -> LabelledSet:
    data = json.loads(DATA.read_text())
    memories = {m["id"]: memory_text({"text": m["text"]}, m["kind"]) for m in data["memories"]}
    queries = [(q["text"], frozenset(q["relevant"])) for q in data["queries"]]
    return LabelledSet(memories, queries)


def content_words(text: str) -> set[str]:
    words = {word.strip(".,:;!?'()").lower() for word in text.replace("-", " ").split()}
    return {word.removesuffix("'s") for word in words if word and word not in STOPWORDS}


def recall_at_k(embedder: Embedder, k: int = K) -> float:
    """The mean over queries of the share of its relevant memories in its k nearest."""
    found = labelled()
    ids = list(found.memories)
    memories = np.asarray(embedder.embed([found.memories[i] for i in ids]), dtype=np.float32)
    queries = np.asarray(embedder.embed([text for text, _ in found.queries]), dtype=np.float32)
    similarity = queries @ memories.T  # unit vectors: cosine
    scores = []
    for row, (_, relevant) in zip(similarity, found.queries, strict=True):
        # Ties by id, as the store breaks them.
        nearest = sorted(range(len(ids)), key=lambda index: (-row[index], ids[index]))[:k]
        scores.append(len(relevant & {ids[index] for index in nearest}) / len(relevant))
    return float(np.mean(scores))


def test_the_set_is_paraphrases_with_same_subject_distractors() -> None:
    found = labelled()
    assert 30 <= len(found.memories) <= 60 and len(found.queries) >= 30
    relevant_ids = set().union(*(relevant for _, relevant in found.queries))
    assert relevant_ids <= set(found.memories)
    assert len(set(found.memories) - relevant_ids) >= 10, "distractors, relevant to no query"
    for text, relevant in found.queries:
        query = content_words(text)
        for memory_id in relevant:
            memory = content_words(found.memories[memory_id])
            shared = {q for q in query for m in memory if q == m or (q[:5] == m[:5] and len(q) > 4)}
            assert not shared, f"{text!r} shares {shared} with {memory_id}"


def test_the_default_model_recalls_paraphrases_the_hashing_embedder_misses() -> None:
    model, words = loaded_embedder("wordllama"), HashingEmbedder(256)
    wordllama, hashing = recall_at_k(model), recall_at_k(words)
    first = f"recall@1 wordllama {recall_at_k(model, 1):.3f}, hashing {recall_at_k(words, 1):.3f}"
    print(f"\n{DATA.name}: recall@{K} wordllama {wordllama:.3f}, hashing {hashing:.3f}; {first}")
    assert wordllama > hashing
