"""The default embedder, WordLlama l2_supercat: offline, deterministic, unit float32 vectors."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from array import array
from pathlib import Path

import numpy as np
import pytest

from projections.embeddings.embedder import (
    WORDLLAMA_DIM,
    WORDLLAMA_NAME,
    Embedder,
    wordless_vector,
)
from projections.embeddings.factory import build_embedder, embedder_identity
from projections.embeddings.wordllama import (
    BATCH_CHARS,
    BATCH_TEXTS,
    MAX_TOKENS,
    TENSOR_KEY,
    WEIGHTS_FILE,
    WordLlamaEmbedder,
    length_batches,
    mapped_float16_tensor,
    unit_rows,
    wordllama_package,
)
from support.embedders import loaded_embedder

REPO = Path(__file__).resolve().parents[2]
TEXTS = [
    "prefers email receipts",
    "wants invoices by mail",
    "the ferry to Helsinki is my favourite",
    "Ünïcödé wörds, 東京 and emoji ☃ count too",
]
# Run in a fresh interpreter with every way out to the network refused: a connection attempt
# (Hugging Face's download) raises instead of waiting on a network that is not there.
OFFLINE = """
import json, socket, sys

def refuse(*args, **kwargs):
    raise OSError("memproj test: no network")

socket.socket.connect = refuse
socket.socket.connect_ex = refuse
socket.create_connection = refuse
socket.getaddrinfo = refuse
from projections.embeddings.factory import build_embedder

embedder = build_embedder("wordllama", 256)
vectors = embedder.embed(json.loads(sys.argv[1]))
# The wheel's files are read, its code not run (requests, pydantic: memory of every worker).
imported = "wordllama" in sys.modules
print(json.dumps({"name": embedder.name, "vectors": vectors, "imported": imported}))
"""


def embedder() -> Embedder:
    return loaded_embedder("wordllama")  # the session's one load, shared with other modules


def cosine(first: list[float], second: list[float]) -> float:
    return sum(a * b for a, b in zip(first, second, strict=True))


def test_it_loads_from_the_wheel_without_any_network() -> None:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    # No cache either: the weights must come from the installed package itself.
    environment["HOME"] = environment["XDG_CACHE_HOME"] = "/nonexistent"
    result = subprocess.run(
        [sys.executable, "-c", OFFLINE, json.dumps(TEXTS)],
        env=environment,
        capture_output=True,
        text=True,
        cwd="/",
        check=False,
    )
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.splitlines()[-1])
    assert loaded["name"] == WORDLLAMA_NAME == "wordllama/l2_supercat/256"
    assert loaded["imported"] is False
    # The same vectors in another process: a replay rebuilds what the worker built.
    assert loaded["vectors"] == embedder().embed(TEXTS)


def test_it_is_a_named_embedder_of_the_identity_the_factory_gives() -> None:
    model: Embedder = embedder()
    assert (model.name, model.dim) == (WORDLLAMA_NAME, WORDLLAMA_DIM)
    identity = embedder_identity("wordllama", 8)  # the hashing dimension does not apply
    assert (identity.name, identity.dim) == (model.name, model.dim)
    assert isinstance(build_embedder("wordllama", 256), WordLlamaEmbedder)


def test_vectors_are_unit_float32() -> None:
    for vector in embedder().embed(TEXTS):
        assert len(vector) == WORDLLAMA_DIM
        assert array("f", vector).tolist() == vector  # exactly representable in float32
        assert math.isclose(math.sqrt(sum(v * v for v in vector)), 1.0, rel_tol=1e-5)


def test_a_text_gets_the_same_vector_alone_or_in_any_batch() -> None:
    long_text = "a customer who writes long messages about many things " * 40
    batch = [long_text, *TEXTS, "x"]
    together = embedder().embed(batch)
    alone = [embedder().embed([text])[0] for text in batch]
    assert together == alone
    assert embedder().embed(list(reversed(batch))) == list(reversed(together))
    assert embedder().embed([]) == []


def test_an_empty_text_gets_the_fixed_wordless_vector() -> None:
    # No token to average (a space is a token of this model's vocabulary: it has a vector).
    assert embedder().embed([""]) == [wordless_vector(WORDLLAMA_DIM)]


def test_only_the_first_tokens_of_a_huge_text_count() -> None:
    head = "the customer prefers email receipts and paper invoices " * (MAX_TOKENS // 4)
    huge = head + "something else entirely about trains " * 20_000
    first, whole = embedder().embed([head, huge])
    assert cosine(first, whole) == pytest.approx(1.0, abs=1e-6)


def test_paraphrases_are_nearer_than_an_unrelated_sentence() -> None:
    receipts, invoices, ferry, _ = embedder().embed(TEXTS)
    assert cosine(receipts, invoices) > cosine(receipts, ferry) + 0.1


def test_its_vectors_are_the_wordllama_librarys_bit_for_bit() -> None:
    # Vectors stored by the library's inference (before the weights were memory-mapped) stay
    # valid: the same model name, no rebuild.
    import wordllama
    from wordllama import WordLlama

    library = WordLlama.load(
        "l2_supercat",
        dim=WORDLLAMA_DIM,
        cache_dir=Path(wordllama.__file__).parent,
        disable_download=True,
    )
    library.tokenizer.enable_truncation(max_length=MAX_TOKENS)
    paraphrases = json.loads((Path(__file__).parent / "data" / "paraphrases.json").read_text())
    texts = [
        *TEXTS,
        "",
        " ",
        "x",
        "the customer prefers email receipts " * (MAX_TOKENS // 2),  # truncated
        *(memory["text"] for memory in paraphrases["memories"]),
        *(query["text"] for query in paraphrases["queries"]),
    ]
    expected = [unit_rows(library.embed([text]))[0] for text in texts]
    assert [embedder().embed([text])[0] for text in texts] == expected
    assert embedder().embed(texts) == expected


def test_the_weights_are_the_wheels_float16_matrix_mapped_read_only() -> None:
    weights = mapped_float16_tensor(wordllama_package() / WEIGHTS_FILE, TENSOR_KEY)
    assert isinstance(weights, np.memmap)
    assert (weights.shape, weights.dtype, weights.flags.writeable) == (
        (32_000, WORDLLAMA_DIM),
        np.dtype(np.float16),
        False,
    )


def test_batches_are_of_alike_lengths_and_bounded_in_texts_and_characters() -> None:
    lengths = [5] * 40 + [BATCH_CHARS * 3, 0, BATCH_CHARS // 2, BATCH_CHARS // 2 + 1, 7]
    batches = length_batches(lengths)
    assert sorted(index for batch in batches for index in batch) == list(range(len(lengths)))
    flat = [lengths[index] for batch in batches for index in batch]
    assert flat == sorted(lengths)  # shortest first
    for batch in batches:
        assert len(batch) <= BATCH_TEXTS
        assert len(batch) == 1 or sum(lengths[index] for index in batch) <= BATCH_CHARS
    # Two halves of the budget and one more character do not fit together; three budgets alone.
    assert [[lengths[index] for index in batch] for batch in batches[-2:]] == [
        [BATCH_CHARS // 2 + 1],
        [BATCH_CHARS * 3],
    ]
    assert length_batches([]) == []
