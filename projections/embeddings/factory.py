"""Which embedder a setting names: the one place that maps ``MEMPROJ_EMBEDDER`` to a model.

``embedder_identity`` answers what a store must hold (model name and dimension) without
loading any model, for the processes that open the vector store but never embed (the audits,
the tombstone handler); ``build_embedder`` loads the model, once per entry point.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from projections.embeddings.embedder import (
    WORDLLAMA_DIM,
    WORDLLAMA_NAME,
    Embedder,
    HashingEmbedder,
    hashing_name,
)

EmbedderKind = Literal["wordllama", "hashing"]
EMBEDDER_KINDS: tuple[EmbedderKind, ...] = get_args(EmbedderKind)


@dataclass(frozen=True)
class EmbedderIdentity:
    """What the vector store records beside its vectors."""

    name: str
    dim: int


def embedder_identity(kind: EmbedderKind, hashing_dim: int) -> EmbedderIdentity:
    if kind == "wordllama":
        return EmbedderIdentity(WORDLLAMA_NAME, WORDLLAMA_DIM)
    if kind == "hashing":
        return EmbedderIdentity(hashing_name(hashing_dim), hashing_dim)
    raise ValueError(f"unknown embedder {kind!r}: one of {', '.join(EMBEDDER_KINDS)}")


def build_embedder(kind: EmbedderKind, hashing_dim: int) -> Embedder:
    if kind == "wordllama":
        from projections.embeddings.wordllama import WordLlamaEmbedder

        return WordLlamaEmbedder()
    if kind == "hashing":
        return HashingEmbedder(hashing_dim)
    raise ValueError(f"unknown embedder {kind!r}: one of {', '.join(EMBEDDER_KINDS)}")
