"""The configured embedder and vector store of a test's settings, as the workers build them:
a test that embeds a text to look it up must embed it with the workers' model."""

from __future__ import annotations

from functools import cache

from projections.embeddings.embedder import Embedder
from projections.embeddings.factory import EmbedderKind, build_embedder
from projections.embeddings.lance import LanceVectorStore
from streams.settings import Settings


@cache
def loaded_embedder(kind: EmbedderKind, hashing_dim: int = 256) -> Embedder:
    """The one embedder of each kind a test session builds (wordllama loads in a second)."""
    return build_embedder(kind, hashing_dim)


def embedder_of(settings: Settings) -> Embedder:
    return loaded_embedder(settings.embedder, settings.embedding_dim)


def vectors_of(settings: Settings) -> LanceVectorStore:
    model = settings.embedder_identity
    return LanceVectorStore(settings.vector_store_path, model.dim, model=model.name)
