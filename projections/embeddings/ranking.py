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


def cosine_distances(queries: Vectors, vectors: Vectors) -> Vectors:
    """Each query's cosine distance to each vector (a row per query): 0 the same direction, 2
    the opposite one; NaN where either has no direction (a zero vector), which LanceDB's
    cosine search leaves out and so does every ranking here.

    Computed in float64 and rounded to float32: a float32 product sums in an order that
    depends on how many vectors and queries go together, and two entries at one distance
    would come apart by a few units in the last place, ordered one way by a search and the
    other by a batch of many queries; rounded, they tie, and ties go by id."""
    wide_queries, wide_vectors = queries.astype(np.float64), vectors.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        norms = np.outer(np.linalg.norm(wide_queries, axis=1), np.linalg.norm(wide_vectors, axis=1))
        distances: Vectors = (1.0 - (wide_queries @ wide_vectors.T) / norms).astype(np.float32)
    return distances


class NearestIds:
    """The ``limit`` nearest ids to each query vector (cosine distance, ties by id) of the
    batches seen so far: a ranking whose memory is one batch, however many batches come."""

    def __init__(self, queries: Vectors, limit: int) -> None:
        self._queries = queries
        self._limit = limit
        self.best: list[list[tuple[float, str]]] = [[] for _ in range(len(queries))]

    def add(self, ids: Sequence[str], vectors: Vectors) -> None:
        if not ids:
            return
        distances = cosine_distances(self._queries, vectors)
        keep = min(self._limit, len(ids))
        for query, row in enumerate(distances):
            valid = np.flatnonzero(~np.isnan(row))
            if len(valid) > keep:
                # Every row that ties the keep-th nearest stays a candidate: ties go by id.
                cut = np.partition(row[valid], keep - 1)[keep - 1]
                valid = valid[row[valid] <= cut]
            merged = self.best[query] + [(float(row[i]), ids[int(i)]) for i in valid]
            self.best[query] = sorted(merged)[: self._limit]


def nearest(
    query: Sequence[float], ids: Sequence[str], vectors: Vectors, limit: int
) -> list[tuple[float, int]]:
    """The ``limit`` rows of ``vectors`` nearest to ``query``: (distance, row) pairs, nearest
    first, ties by id."""
    ranking = NearestIds(np.asarray([query], dtype=np.float32), limit)
    ranking.add(ids, vectors)
    row_of = {entry_id: row for row, entry_id in enumerate(ids)}
    return [(distance, row_of[entry_id]) for distance, entry_id in ranking.best[0]]
