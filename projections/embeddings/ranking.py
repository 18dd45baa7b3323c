"""Exact cosine ranking in numpy, shared by the vector stores that rank themselves (LanceDB's
streamed ``nearest``, PostgreSQL's every search): one distance, one order, one rule for the
vectors that have no direction, so that every store gives the same hits and distances.

numpy only: the PostgreSQL store must not pay for LanceDB's import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

Vectors = np.ndarray[Any, np.dtype[np.float32]]


def as_vectors(buffer: bytes, dim: int) -> Vectors:
    """Vectors stored back to back as little-endian float32 (``vector_bytes``), as rows."""
    return np.frombuffer(buffer, dtype="<f4").reshape(-1, dim)


def vector_bytes(vector: Sequence[float]) -> bytes:
    """A vector as the stores keep it: float32, little-endian."""
    return np.asarray(vector, dtype="<f4").tobytes()


# How far a float32 distance may be from the exact one (256 dimensions: about 1e-6): every
# entry within it of the keep-th nearest is ranked again, exactly.
APPROXIMATION_MARGIN = 1e-4


def cosine_distances(queries: Vectors, vectors: Vectors) -> Vectors:
    """Each query's cosine distance to each vector (a row per query), in float32: 0 the same
    direction, 2 the opposite one; NaN where either has no direction (a zero vector), which
    LanceDB's cosine search leaves out and so does every ranking here. Approximate: a float32
    product sums in an order that depends on how many vectors and queries go together
    (``exact_distances`` does not)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        query_norms = np.sqrt(np.einsum("ij,ij->i", queries, queries))
        vector_norms = np.sqrt(np.einsum("ij,ij->i", vectors, vectors))
        products = (queries @ vectors.T) / np.outer(query_norms, vector_norms)
    distances: Vectors = (1.0 - products).astype(np.float32, copy=False)
    return distances


def exact_distances(query: Vectors, vectors: Vectors) -> Vectors:
    """One query's cosine distances to a few vectors, computed in float64 and rounded to
    float32: two entries at one distance tie whatever else was ranked with them (in float32
    they came apart by a few units in the last place, ordered one way by a search and the
    other by a batch of many queries), and ties go by id."""
    wide_query, wide = query.astype(np.float64), vectors.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        norms = np.linalg.norm(wide_query) * np.linalg.norm(wide, axis=1)
        distances: Vectors = (1.0 - (wide @ wide_query) / norms).astype(np.float32)
    return distances


class NearestIds:
    """The ``limit`` nearest ids to each query vector (cosine distance, ties by id) of the
    batches seen so far: a ranking whose memory is one batch, however many batches come.
    Each batch is ranked in float32, and the entries near enough to the cut are ranked again
    exactly (``exact_distances``): the distances do not depend on the batching."""

    def __init__(self, queries: Vectors, limit: int) -> None:
        self._queries = queries
        self._limit = limit
        self._seen = 0
        # Per query: (distance, id, position among every row added).
        self._best: list[list[tuple[float, str, int]]] = [[] for _ in range(len(queries))]

    @property
    def best(self) -> list[list[tuple[float, str]]]:
        return [[(distance, entry_id) for distance, entry_id, _ in hits] for hits in self._best]

    @property
    def positions(self) -> list[list[tuple[float, int]]]:
        """Per query, the nearest rows as (distance, position among every row added)."""
        return [[(distance, at) for distance, _, at in hits] for hits in self._best]

    def add(self, ids: Sequence[str], vectors: Vectors) -> None:
        offset, self._seen = self._seen, self._seen + len(ids)
        if not ids:
            return
        approximate = cosine_distances(self._queries, vectors)
        keep = min(self._limit, len(ids))
        for query, row in enumerate(approximate):
            chosen = np.flatnonzero(~np.isnan(row))
            if len(chosen) > keep:
                cut = np.partition(row[chosen], keep - 1)[keep - 1]
                chosen = chosen[row[chosen] <= cut + APPROXIMATION_MARGIN]
            exact = exact_distances(self._queries[query], vectors[chosen])
            merged = self._best[query] + [
                (float(distance), ids[int(at)], offset + int(at))
                for distance, at in zip(exact, chosen, strict=True)
                if not np.isnan(distance)
            ]
            self._best[query] = sorted(merged)[: self._limit]


def nearest(
    query: Sequence[float], ids: Sequence[str], vectors: Vectors, limit: int
) -> list[tuple[float, int]]:
    """The ``limit`` rows of ``vectors`` nearest to ``query``: (distance, row) pairs, nearest
    first, ties by id."""
    ranking = NearestIds(np.asarray([query], dtype=np.float32), limit)
    ranking.add(ids, vectors)
    return ranking.positions[0]
