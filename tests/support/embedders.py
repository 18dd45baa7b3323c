"""The configured embedder and vector store of a test's settings, as the workers build them:
a test that embeds a text to look it up must embed it with the workers' model."""

from __future__ import annotations

from functools import cache

from projections.embeddings.embedder import Embedder
from projections.embeddings.factory import EmbedderKind, build_embedder
from projections.embeddings.vectors import VectorStore
from streams.services import open_vector_store
from streams.settings import Settings


@cache
def loaded_embedder(kind: EmbedderKind, hashing_dim: int = 256) -> Embedder:
    """The one embedder of each kind a test session builds (wordllama loads in a second)."""
    return build_embedder(kind, hashing_dim)


def embedder_of(settings: Settings) -> Embedder:
    return loaded_embedder(settings.embedder, settings.embedding_dim)


def vectors_of(settings: Settings) -> VectorStore:
    """The vector store the settings' workers write (``MEMPROJ_VECTOR_STORE``)."""
    return open_vector_store(settings)
