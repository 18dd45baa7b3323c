"""``VectorStore`` in memory: the port's contract (tests/support/contracts/vectors.py) without
LanceDB, for tests of what uses a vector store (the embeddings store, the tombstone and index
agents, the reads).

Every write that changes something is a commit that keeps the version before it, as LanceDB
keeps its table versions: a removed entry stays in ``history_find`` until ``purge_history``,
which is what an erasure has to prove gone. Ranking is brute-force cosine distance in float32
(the vectors are kept as float32, as the port says), ties by id.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime

import numpy as np

from projections.embeddings.lexical import lexical_ranking, query_terms, terms
from projections.embeddings.vectors import (
    Candidate,
    EntryRef,
    LexicalCandidate,
    Match,
    MemoryOnly,
    RefHit,
    VectorEntry,
    VectorHit,
)

Key = tuple[str, str]  # (tenant_id, id): what names an entry
Content = dict[Key, VectorEntry]


class InMemoryVectorStore:
    def __init__(self, dim: int, *, model: str) -> None:
        self.dim = dim
        self.model = model
        # Every committed version, oldest first; the last one is the live content.
        self._versions: list[Content] = [{}]

    @property
    def _live(self) -> Content:
        return self._versions[-1]

    def _commit(self, content: Content) -> None:
        self._versions.append(content)

    def upsert(self, entries: Sequence[VectorEntry]) -> None:
        if not entries:
            return
        for entry in entries:
            _check_entry(entry, self.dim)
        content = dict(self._live)
        for entry in entries:
            content[(entry.tenant_id, entry.id)] = _stored(entry)
        self._commit(content)

    def remove(self, match: Match) -> int:
        return self.remove_any([match])

    def remove_any(self, matches: Sequence[Match]) -> int:
        doomed = {key for key, entry in self._live.items() if _any(matches, entry)}
        if doomed:
            self._commit({k: e for k, e in self._live.items() if k not in doomed})
        return len(doomed)

    def find(self, match: Match) -> list[VectorEntry]:
        return self.find_any([match])

    def find_any(self, matches: Sequence[Match]) -> list[VectorEntry]:
        return [self._live[key] for key in sorted(self._live) if _any(matches, self._live[key])]

    def get(self, tenant_id: str, entry_ids: Sequence[str]) -> list[VectorEntry]:
        keys = [(tenant_id, entry_id) for entry_id in dict.fromkeys(entry_ids)]
        return [self._live[key] for key in keys if key in self._live]

    def search(
        self,
        tenant_id: str,
        vector: Sequence[float],
        limit: int,
        subject: tuple[str, str] | None = None,
        only: MemoryOnly | None = None,
    ) -> list[VectorHit]:
        self._check_query(vector)
        if limit < 1 or (only is not None and only.admits_nothing):
            return []
        admitted = self._admitted(tenant_id, subject, only)
        return [VectorHit(entry, distance) for distance, entry in _ranked(vector, admitted, limit)]

    def _admitted(
        self, tenant_id: str, subject: tuple[str, str] | None, only: MemoryOnly | None
    ) -> list[VectorEntry]:
        return [
            entry
            for (tenant, _), entry in self._live.items()
            if tenant == tenant_id
            and (subject is None or (entry.subject_type, entry.subject_id) == subject)
            and (only is None or only.admits(entry))
        ]

    def lexical_candidates(
        self,
        tenant_id: str,
        text: str,
        limit: int,
        subject: tuple[str, str] | None = None,
        only: MemoryOnly | None = None,
    ) -> list[LexicalCandidate]:
        if limit < 1 or (only is not None and only.admits_nothing):
            return []
        admitted = {entry.id: entry for entry in self._admitted(tenant_id, subject, only)}
        documents = [(entry.id, terms(entry.text)) for entry in admitted.values()]
        ranking = lexical_ranking(query_terms(text), documents, len(documents), limit)
        return [
            LexicalCandidate(e.id, e.kind, e.tenant_id, e.memory_id, e.version, score)
            for score, entry_id in ranking
            for e in [admitted[entry_id]]
        ]

    def search_candidates(
        self,
        tenant_id: str,
        vector: Sequence[float],
        limit: int,
        subject: tuple[str, str] | None = None,
        only: MemoryOnly | None = None,
    ) -> list[Candidate]:
        return [
            Candidate(e.id, e.kind, e.tenant_id, e.memory_id, e.version, hit.distance)
            for hit in self.search(tenant_id, vector, limit, subject, only)
            for e in [hit.entry]
        ]

    def nearest(
        self, tenant_id: str, vectors: Sequence[Sequence[float]], limit: int
    ) -> list[list[RefHit]]:
        for vector in vectors:
            self._check_query(vector)
        return [
            [RefHit(_ref(hit.entry), hit.distance) for hit in self.search(tenant_id, v, limit)]
            for v in vectors
        ]

    def find_refs(self, match: Match, batch_rows: int) -> Iterator[list[EntryRef]]:
        refs = [_ref(entry) for entry in self.find(match)]
        for start in range(0, len(refs), batch_rows):
            yield refs[start : start + batch_rows]

    def purge_history(self) -> None:
        self._versions = [self._live]

    def history_versions(self) -> int:
        return len(self._versions) - 1

    def history_find(self, match: Match) -> list[tuple[int, VectorEntry]]:
        return [
            (version, entry)
            for version, content in enumerate(self._versions[:-1], start=1)
            for _, entry in sorted(content.items())
            if match.matches(entry)
        ]

    def count(self) -> int:
        return len(self._live)

    def tenants(self) -> list[str]:
        return sorted({tenant for tenant, _ in self._live})

    def entries(self, tenant_id: str) -> list[VectorEntry]:
        return [entry for (tenant, _), entry in sorted(self._live.items()) if tenant == tenant_id]

    def replace_all(self, entries: Sequence[VectorEntry]) -> None:
        for entry in entries:
            _check_entry(entry, self.dim)
        self._commit({(e.tenant_id, e.id): _stored(e) for e in entries})
        self.purge_history()

    def _check_query(self, vector: Sequence[float]) -> None:
        if len(vector) != self.dim:
            raise ValueError(f"the query vector has {len(vector)} dimensions, not {self.dim}")


class InMemoryShadows:
    """The rebuild tables beside a live in-memory store (``VectorShadows``)."""

    def __init__(self, dim: int, *, model: str) -> None:
        self._dim = dim
        self._model = model
        self._tables: dict[str, tuple[datetime, InMemoryVectorStore]] = {}

    def add(self, name: str, created: datetime) -> InMemoryVectorStore:
        """A rebuild table named ``name``, made at ``created`` (as a rebuild leaves it)."""
        store = InMemoryVectorStore(self._dim, model=self._model)
        self._tables[name] = (created, store)
        return store

    def tables(self) -> Mapping[str, datetime]:
        return {name: created for name, (created, _) in self._tables.items()}

    def open(self, name: str) -> InMemoryVectorStore:
        return self._tables[name][1]

    def drop(self, name: str) -> None:
        self._tables.pop(name, None)


def _check_entry(entry: VectorEntry, dim: int) -> None:
    if len(entry.vector) != dim:
        raise ValueError(
            f"entry {entry.id!r} has a vector of {len(entry.vector)} dimensions,"
            f" the store holds {dim}"
        )
    if entry.occurred_at.tzinfo is None:
        raise ValueError(f"entry {entry.id!r} has a naive occurred_at; it must be UTC-aware")
    if entry.kind == "memory" and (entry.memory_kind is None or entry.scope is None):
        raise ValueError(f"memory entry {entry.id!r} has no kind or scope")


def _stored(entry: VectorEntry) -> VectorEntry:
    """The entry as a store keeps it: its vector as float32, its time in UTC."""
    vector = tuple(float(x) for x in np.asarray(entry.vector, dtype=np.float32))
    return replace(entry, vector=vector, occurred_at=entry.occurred_at.astimezone(UTC))


def _any(matches: Sequence[Match], entry: VectorEntry) -> bool:
    return any(match.matches(entry) for match in matches)


def _ranked(
    query: Sequence[float], entries: Sequence[VectorEntry], limit: int
) -> list[tuple[float, VectorEntry]]:
    """The ``limit`` entries nearest to ``query`` by cosine distance (ties by id); a zero
    vector has no direction and ranks nowhere."""
    if not entries:
        return []
    q = np.asarray(query, dtype=np.float32)
    vectors = np.asarray([entry.vector for entry in entries], dtype=np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        distances = 1.0 - (vectors @ q) / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(q))
    ranked = sorted(
        (float(d), entry.id, entry)
        for d, entry in zip(distances, entries, strict=True)
        if not np.isnan(d)
    )
    return [(distance, entry) for distance, _, entry in ranked[:limit]]


def _ref(entry: VectorEntry) -> EntryRef:
    return EntryRef(
        id=entry.id,
        kind=entry.kind,
        tenant_id=entry.tenant_id,
        subject_type=entry.subject_type,
        subject_id=entry.subject_id,
        memory_id=entry.memory_id,
        conversation_id=entry.conversation_id,
        occurred_at=entry.occurred_at,
    )
