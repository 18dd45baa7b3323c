"""Embeddings: the deterministic default embedder and the vector store adapters."""
