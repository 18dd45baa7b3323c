"""The default embedder: WordLlama's ``l2_supercat`` model, 256 dimensions, loaded offline.

WordLlama (https://github.com/dleemiller/WordLlama) is a token-embedding matrix distilled from
large language models, averaged over a text's tokens: no neural network runs at inference, so a
short text costs tens of microseconds of CPU, and the weights (16 MB) ship inside the
``wordllama`` wheel. Averaging is a sum over each text's own tokens (padding is masked out), so
a text's vector does not depend on the batch it is embedded in.

Loading never touches the network: ``WordLlama.load()`` with its defaults looks for the wheel's
files under ``wordllama/tokenizer/`` while the wheel ships ``wordllama/tokenizers/``, misses
them, and downloads from Hugging Face. Pointing its cache directory at the installed package
(where ``tokenizers/`` and ``weights/`` are) with downloads disabled finds them
(ops/decisions/embedder.md).

wordllama imports numpy and tokenizers (about half a second): this module is imported only
where an embedder is built (``projections.embeddings.factory``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import wordllama
from wordllama import WordLlama

from projections.embeddings.embedder import wordless_vector
from projections.embeddings.factory import WORDLLAMA_CONFIG, WORDLLAMA_DIM, WORDLLAMA_NAME

# Tokens of a text that count: the vector is the mean of its first MAX_TOKENS tokens. A batch
# is padded to its longest text and gathered whole (tokens x 256 float32 each, 1 KB a token),
# so an uncapped 100,000-token tool result would take 100 MB for itself and as much again per
# text of its batch; capped, a batch of BATCH_TEXTS takes at most 16 MB.
MAX_TOKENS = 1024
BATCH_TEXTS = 16


class WordLlamaEmbedder:
    """Mean token embedding of WordLlama ``l2_supercat`` (256 dimensions), L2-normalised."""

    __slots__ = ("_model",)

    name = WORDLLAMA_NAME
    dim = WORDLLAMA_DIM

    def __init__(self) -> None:
        self._model: Any = WordLlama.load(
            WORDLLAMA_CONFIG,
            dim=WORDLLAMA_DIM,
            cache_dir=Path(wordllama.__file__).parent,
            disable_download=True,
        )
        self._model.tokenizer.enable_truncation(max_length=MAX_TOKENS)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        # Texts of alike length batched together: a batch is padded to its longest text.
        order = sorted(range(len(texts)), key=lambda index: len(texts[index]))
        pooled = self._model.embed([texts[index] for index in order], batch_size=BATCH_TEXTS)
        vectors: list[list[float]] = [[] for _ in texts]
        for index, vector in zip(order, unit_rows(pooled), strict=True):
            vectors[index] = vector
        return vectors


def unit_rows(matrix: np.ndarray[Any, np.dtype[np.float32]]) -> list[list[float]]:
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
