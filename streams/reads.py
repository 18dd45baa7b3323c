"""The read path: recall (through the cache), semantic recall (through the vector store), and
the context view (through the cache), each hydrated through the authoritative projection and
the deletion ledger.

The hydration guard: whatever an index or a cache returns is only a candidate. It is re-read
from the projection and checked against the erasure index; anything deleted, revoked,
superseded, expired or of another tenant is dropped, and each drop is counted per store in
``memproj_ghost_reads_blocked_total``. Reads that fill the cache hold the shared tenant lock,
so a deletion cannot slip between reading the projection and writing the cache.

A paused subject (``projections.access.pauses``) is served by none of them: each asks the
pause table first in the transaction it reads the projection with, and raises
``SubjectPaused`` before it hydrates or serves anything (a cached answer or ranked candidates
are never served while the subject is paused, and no cache entry is filled).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import orjson

from projections.access.pauses import check_serving
from projections.cache.port import RecallCache
from projections.conversation import store as conversation_store
from projections.deletion import guard as erasure_guard
from projections.deletion import queries as ledger_queries
from projections.deletion.erasure import memory_key, subject_key
from projections.embeddings.embedder import Embedder
from projections.embeddings.lexical import fuse
from projections.embeddings.vectors import (
    Candidate,
    LexicalCandidate,
    MemoryOnly,
    SearchMode,
    VectorStore,
    check_embedder,
)
from projections.memory import store as memory_store
from projections.memory.store import RecallQuery
from projections.sql import ONE_TENANT, Conn
from topics.outputs import MemoryRecord


@dataclass(slots=True)
class Hydrated:
    records: list[MemoryRecord]
    # Why candidates were dropped, per store: {"embeddings": {"erased": 2}, ...}.
    blocked: dict[str, Counter[str]] = field(default_factory=dict)
    # The ids of the candidates the guard dropped, and of those hydrated but outside the
    # query's filters (a purpose policy's among them): what a read audit records.
    blocked_ids: list[str] = field(default_factory=list)
    filtered_ids: list[str] = field(default_factory=list)

    @property
    def blocked_total(self) -> int:
        return sum(sum(reasons.values()) for reasons in self.blocked.values())


def _query_key(query: RecallQuery, text: str | None) -> str:
    described = orjson.dumps(
        {**asdict(query), "max_age": str(query.max_age), "text": text}, default=sorted
    )
    return hashlib.sha256(described).hexdigest()[:32]


async def hydrate(
    conn: Conn,
    tenant_id: str,
    candidates: Sequence[tuple[str, int | None]],
    now: datetime,
) -> tuple[list[MemoryRecord], Counter[str], list[str]]:
    """Re-read candidate memories (id, the version the index holds) through the projection and
    the erasure index; keep the eligible ones, in candidate order, and say why the others
    were dropped, and which."""
    ids = list(dict.fromkeys(memory_id for memory_id, _ in candidates))
    records = await memory_store.load_records(conn, ((tenant_id, m) for m in ids), ONE_TENANT)
    keys = [memory_key(tenant_id, m) for m in ids]
    keys += [subject_key(tenant_id, r.subject.type, r.subject.id) for r in records.values()]
    erasures = await erasure_guard.load_erasures(conn, keys, ONE_TENANT)
    kept: list[MemoryRecord] = []
    dropped: Counter[str] = Counter()
    dropped_ids: list[str] = []
    seen: set[str] = set()
    for memory_id, version in candidates:
        if memory_id in seen:
            continue
        seen.add(memory_id)
        record = records.get((tenant_id, memory_id))
        erased = erasures.entries.get(memory_key(tenant_id, memory_id))
        reason: str | None = None
        if record is None:
            reason = "erased" if erased else "deleted"
        elif record.tenant_id != tenant_id:
            reason = "other_tenant"
        elif not record.servable:
            reason = record.status
        elif version is not None and version != record.version:
            reason = "superseded"
        elif not record.is_eligible(now):
            reason = "expired"
        if reason is None and record is not None:
            kept.append(record)
        else:
            dropped[reason or "deleted"] += 1
            dropped_ids.append(memory_id)
    return kept, dropped, dropped_ids


def _wanted(record: MemoryRecord, query: RecallQuery, now: datetime) -> bool:
    """The query's own filters, applied to hydrated candidates (not ghosts: just not asked for)."""
    return (
        record.subject.type == query.subject_type
        and record.subject.id == query.subject_id
        and record.status in query.statuses
        and (query.scope is None or record.scope == query.scope)
        and (query.kind is None or record.kind == query.kind)
        and (query.kinds is None or record.kind in query.kinds)
        and (query.scopes is None or record.scope in query.scopes)
        and (query.max_age is None or record.observed_at >= now - query.max_age)
    )


def _narrowed(allowed: frozenset[str] | None, asked: str | None) -> frozenset[str] | None:
    if asked is None:
        return allowed
    return frozenset({asked}) if allowed is None else allowed & {asked}


def confinement(query: RecallQuery) -> MemoryOnly:
    """What the vector store confines a semantic recall to before ranking: the query's kinds
    and scopes (a purpose's, narrowed to the request's own). Its statuses and maximum age are
    not: they change without a new vector, and are judged on the hydrated record."""
    return MemoryOnly(
        kinds=_narrowed(query.kinds, query.kind), scopes=_narrowed(query.scopes, query.scope)
    )


# Candidates ranked by the vector store per result: the ranking is over allowed entries only,
# but the hydration still drops some (superseded, revoked, expired, erased; outside the
# request's statuses or maximum age).
CANDIDATES_PER_RESULT = 4


async def recall(conn: Conn, cache: RecallCache, query: RecallQuery, now: datetime) -> Hydrated:
    """Eligible memories about one subject, through the cache."""
    subject = (query.subject_type, query.subject_id)
    key = _query_key(query, None)
    cached = await cache.get_recall(query.tenant_id, subject, key)
    if cached is not None:
        candidates = [(r["memory_id"], r.get("version")) for r in cached]
        async with conn.transaction():
            await check_serving(conn, query.tenant_id, *subject)
            kept, dropped, dropped_ids = await hydrate(conn, query.tenant_id, candidates, now)
            await _count_blocked(conn, "cache", dropped)
        return Hydrated(kept, {"cache": dropped} if dropped else {}, dropped_ids)
    async with conn.transaction():
        await check_serving(conn, query.tenant_id, *subject)
        await erasure_guard.lock_tenants(conn, [query.tenant_id], exclusive=False)
        records = await memory_store.recall(conn, query, now)
        await cache.put_recall(
            query.tenant_id, subject, key, [r.model_dump(mode="json") for r in records]
        )
    return Hydrated(records)


@dataclass(frozen=True, slots=True)
class Ranked:
    """A ranked candidate of a search by text, whichever ranking proposed it."""

    id: str
    kind: str
    tenant_id: str
    memory_id: str | None
    version: int


async def _ranked(
    search: Callable[..., Sequence[Candidate | LexicalCandidate]],
    query: RecallQuery,
    probe: Sequence[float] | str,
) -> list[Ranked]:
    """One ranking of the store (``search`` of the query vector or text), in a worker thread."""
    found = await asyncio.to_thread(
        search,
        query.tenant_id,
        probe,
        query.limit * CANDIDATES_PER_RESULT,
        (query.subject_type, query.subject_id),
        confinement(query),
    )
    return [Ranked(c.id, c.kind, c.tenant_id, c.memory_id, c.version) for c in found]


async def _semantic(
    vectors: VectorStore, embedder: Embedder, query: RecallQuery, text: str
) -> list[Ranked]:
    check_embedder(vectors, embedder.name)
    (vector,) = await asyncio.to_thread(embedder.embed, [text])
    return await _ranked(vectors.search_candidates, query, vector)


async def _lexical(vectors: VectorStore, query: RecallQuery, text: str) -> list[Ranked]:
    return await _ranked(vectors.lexical_candidates, query, text)


async def rank_by_text(
    vectors: VectorStore, embedder: Embedder, query: RecallQuery, text: str, mode: SearchMode
) -> list[Ranked]:
    """The candidates of a search by text, best first: by meaning, by shared words, or both
    rankings (run side by side) fused by reciprocal rank (``lexical.fuse``)."""
    if mode == "semantic":
        return await _semantic(vectors, embedder, query, text)
    if mode == "lexical":
        return await _lexical(vectors, query, text)
    semantic, lexical = await asyncio.gather(
        _semantic(vectors, embedder, query, text), _lexical(vectors, query, text)
    )
    by_id = {candidate.id: candidate for candidate in [*lexical, *semantic]}
    fused = fuse([[c.id for c in semantic], [c.id for c in lexical]])
    return [by_id[entry_id] for entry_id in fused[: query.limit * CANDIDATES_PER_RESULT]]


async def recall_by_text(
    conn: Conn,
    vectors: VectorStore,
    embedder: Embedder,
    query: RecallQuery,
    text: str,
    now: datetime,
    mode: SearchMode = "hybrid",
) -> Hydrated:
    """Recall by text: the vector store proposes (ranking the subject's memories of the
    query's kinds and scopes only, by meaning, by shared words or both: ``mode``), the
    projection and the ledger decide.

    The text is embedded and the candidates ranked in worker threads (both are CPU work that
    would stall every other request on the event loop). The ranking answers ids and versions
    only; the candidates are hydrated in rank order, as many at a time as answers are still
    missing, so a read hydrates what it returns plus what the guard or the filters drop on
    the way, not every candidate."""
    ranked = await rank_by_text(vectors, embedder, query, text, mode)
    candidates = [
        (candidate.memory_id, candidate.version)
        for candidate in ranked
        if candidate.kind == "memory"
        and candidate.memory_id is not None
        and candidate.tenant_id == query.tenant_id
    ]
    foreign = sum(1 for candidate in ranked if candidate.tenant_id != query.tenant_id)
    wanted: list[MemoryRecord] = []
    unwanted: list[str] = []
    dropped: Counter[str] = Counter({"other_tenant": foreign} if foreign else {})
    dropped_ids: list[str] = []
    async with conn.transaction():
        await check_serving(conn, query.tenant_id, query.subject_type, query.subject_id)
        position = 0
        while len(wanted) < query.limit and position < len(candidates):
            batch = candidates[position : position + query.limit - len(wanted)]
            position += len(batch)
            kept, batch_dropped, batch_dropped_ids = await hydrate(
                conn, query.tenant_id, batch, now
            )
            dropped += batch_dropped
            dropped_ids += batch_dropped_ids
            wanted += [r for r in kept if _wanted(r, query, now)]
            unwanted += [r.memory_id for r in kept if not _wanted(r, query, now)]
        await _count_blocked(conn, "embeddings", dropped)
    return Hydrated(wanted, {"embeddings": dropped} if dropped else {}, dropped_ids, unwanted)


async def context_view(
    conn: Conn, cache: RecallCache, tenant_id: str, conversation_id: str
) -> dict[str, Any] | None:
    """The context view, through the cache; a cached view of a conversation that is gone is
    a ghost, dropped and counted. ``SubjectPaused`` if the conversation's owner is paused."""
    cached = await cache.get_context(tenant_id, conversation_id)
    async with conn.transaction():
        await erasure_guard.lock_tenants(conn, [tenant_id], exclusive=False)
        view = await conversation_store.load_context(conn, tenant_id, conversation_id)
        shown = view if view is not None else cached
        if shown is not None:
            owner_type, owner_id = shown["owner"]
            await check_serving(conn, tenant_id, owner_type, owner_id)
        if view is not None and not await conversation_store.conversation_exists(
            conn, tenant_id, conversation_id
        ):
            # The ledger has deleted the conversation; the context worker has not removed its
            # view yet. It must neither be served nor cached again.
            await _count_blocked(conn, "context", Counter({"deleted": 1}))
            view = None
        if cached is not None and view is None:
            await _count_blocked(conn, "cache", Counter({"deleted": 1}))
            return None
        if cached is not None:
            # ``get_context`` answers the cached view itself (the entry's "view").
            return dict(cached)
        if view is not None:
            owner_type, owner_id = view["owner"]
            await cache.put_context(tenant_id, conversation_id, (owner_type, owner_id), view)
        return view


async def _count_blocked(conn: Conn, store: str, dropped: Counter[str]) -> None:
    await ledger_queries.count_blocked_read(conn, store, sum(dropped.values()))
