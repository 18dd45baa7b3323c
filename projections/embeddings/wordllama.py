"""The default embedder: WordLlama's ``l2_supercat`` model, 256 dimensions, read from the wheel.

WordLlama (https://github.com/dleemiller/WordLlama) is a token-embedding matrix distilled from
large language models, averaged over a text's tokens: no neural network runs at inference, so a
short text costs tens of microseconds of CPU, and the weights (16 MB of float16) ship inside
the ``wordllama`` wheel. Averaging is a sum over each text's own tokens (padding is masked out),
so a text's vector does not depend on the batch it is embedded in.

The wheel's files are read here, not through ``WordLlama.load()``: the library copies the
float16 matrix into a float32 one (32 MB of anonymous memory in every process that embeds,
48 MB at the load's peak) and imports requests, pydantic and its own algorithms (~25 MB)
for a gather and a masked mean. Here the matrix is memory-mapped read-only from the
safetensors file, so only the pages of tokens that occur are resident, as file pages the
processes share; each batch's rows are widened to float32 (exact), then averaged as the
library averages, so the vectors are the library's, bit for bit (tested against it). Nothing
here can reach the network: the files are the installed package's own
(ops/decisions/embedder.md, ops/decisions/worker-memory.md).

numpy and tokenizers take about half a second to import: this module is imported only where
an embedder is built (``projections.embeddings.factory``).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from projections.embeddings.embedder import (
    WORDLLAMA_CONFIG,
    WORDLLAMA_DIM,
    WORDLLAMA_NAME,
    wordless_vector,
)

# Tokens of a text that count: the vector is the mean of its first MAX_TOKENS tokens. A batch
# is padded to its longest text and gathered whole (tokens x 256 float32 each, 1 KB a token),
# so an uncapped 100,000-token tool result would take 100 MB for itself and as much again per
# text of its batch; capped, a batch of BATCH_TEXTS takes at most 16 MB (and 8 MB of float16
# rows while they are widened).
MAX_TOKENS = 1024
BATCH_TEXTS = 16
# The tokenizer reads a text whole before it truncates (its tokens, offsets and strings: ~1.4
# MB for 70 KB of text), so a batch also stops at BATCH_CHARS characters, a longer text
# alone: 16 tool results of 70 KB took 50 MB at once, one at a time 10. A text's vector does
# not depend on its batch, so this changes no vector.
BATCH_CHARS = 16_384
# Where the wheel keeps the model (wordllama.config.WordLlamaModels.l2_supercat names them).
WEIGHTS_FILE = f"weights/{WORDLLAMA_CONFIG}_{WORDLLAMA_DIM}.safetensors"
TOKENIZER_FILE = f"tokenizers/{WORDLLAMA_CONFIG}_tokenizer_config.json"
TENSOR_KEY = "embedding.weight"

FloatMatrix = np.ndarray[Any, np.dtype[np.float32]]


class WordLlamaEmbedder:
    """Mean token embedding of WordLlama ``l2_supercat`` (256 dimensions), L2-normalised."""

    __slots__ = ("_tokenizer", "_weights")

    name = WORDLLAMA_NAME
    dim = WORDLLAMA_DIM

    def __init__(self) -> None:
        package = wordllama_package()
        self._weights = mapped_float16_tensor(package / WEIGHTS_FILE, TENSOR_KEY)
        if self._weights.shape[1] != WORDLLAMA_DIM:
            raise ValueError(f"{WEIGHTS_FILE} holds {self._weights.shape[1]} dimensions")
        self._tokenizer = Tokenizer.from_file(str(package / TOKENIZER_FILE))
        self._tokenizer.enable_padding()
        self._tokenizer.enable_truncation(max_length=MAX_TOKENS)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        pooled = np.empty((len(texts), WORDLLAMA_DIM), dtype=np.float32)
        for batch in length_batches([len(text) for text in texts]):
            pooled[batch] = self._mean_tokens([texts[index] for index in batch])
        return unit_rows(pooled)

    def _mean_tokens(self, texts: list[str]) -> FloatMatrix:
        """The mean of each text's token vectors, computed as ``WordLlamaInference.embed``
        computes it (the same float32 operations in the same order: the same values; the sum
        runs along the tokens one after another, so padding adds only zeros at the end)."""
        encoded = self._tokenizer.encode_batch(texts, add_special_tokens=False)
        ids = np.array([e.ids for e in encoded], dtype=np.int32)
        np.clip(ids, 0, self._weights.shape[0] - 1, out=ids)
        mask = np.array([e.attention_mask for e in encoded], dtype=np.float32)
        tokens = np.asarray(self._weights[ids], dtype=np.float32)
        tokens *= mask[..., np.newaxis]  # in place: a batch of long texts is 16 MB of it
        counts = np.maximum(mask.sum(axis=1, keepdims=True), 1.0).astype(np.float32)
        sums: FloatMatrix = np.sum(tokens, axis=1, dtype=np.float32)
        means: FloatMatrix = sums / counts
        return means


def length_batches(lengths: Sequence[int]) -> list[list[int]]:
    """The indexes of texts of these lengths, shortest first, in batches of at most
    BATCH_TEXTS texts and BATCH_CHARS characters (a longer text in a batch of its own). Texts
    of alike length go together: a batch is padded to its longest text."""
    batches: list[list[int]] = []
    batch: list[int] = []
    characters = 0
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):
        if batch and (len(batch) == BATCH_TEXTS or characters + lengths[index] > BATCH_CHARS):
            batches.append(batch)
            batch, characters = [], 0
        batch.append(index)
        characters += lengths[index]
    if batch:
        batches.append(batch)
    return batches


def wordllama_package() -> Path:
    """The installed ``wordllama`` package's directory, found without importing it."""
    spec = find_spec("wordllama")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the wordllama package is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def mapped_float16_tensor(path: Path, key: str) -> np.memmap[Any, np.dtype[np.float16]]:
    """A float16 matrix of a safetensors file, memory-mapped read-only.

    The format: an 8-byte little-endian header length, a JSON header naming each tensor's
    dtype, shape and byte range within the data that follows it."""
    with path.open("rb") as file:
        (header_length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(header_length))
    tensor = header[key]
    shape = tuple(int(size) for size in tensor["shape"])
    start, end = (int(offset) for offset in tensor["data_offsets"])
    if tensor["dtype"] != "F16" or len(shape) != 2 or end - start != shape[0] * shape[1] * 2:
        raise ValueError(f"{path}: {key} is not a float16 matrix ({tensor})")
    return np.memmap(
        path, dtype=np.float16, mode="r", offset=8 + header_length + start, shape=shape
    )


def unit_rows(matrix: FloatMatrix) -> list[list[float]]:
    """Every row divided by its L2 norm, as float32 values; a row without direction (a text of
    no known token) becomes the embedders' fixed wordless vector."""
    rows = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1)
    unit: list[list[float]] = []
    for row, norm in zip(rows, norms, strict=True):
        if not np.isfinite(norm) or norm == 0.0:
            unit.append(wordless_vector(len(row)))
        else:
            unit.append((row / norm).astype(np.float32).tolist())
    return unit
