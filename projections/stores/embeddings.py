"""The vector store of memories and messages, for semantic recall."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from functools import cached_property
from typing import TypeVar

from projections.deletion import probes as deletion_probes
from projections.deletion.coverage import keys_of
from projections.deletion.derived import erased_by, erased_by_each, first_claims, match_of
from projections.deletion.erasure import ErasureIndex
from projections.deletion.ledger import RequestKey
from projections.deletion.purge import DuePurge, Mark, PurgeCheck
from projections.embeddings.vectors import (
    EntryRef,
    Match,
    VectorEntry,
    VectorStore,
    memory_entry_id,
)
from projections.sealing.probes import ProbeSealer
from projections.sql import Conn
from projections.stores.base import (
    DerivedStore,
    Erased,
    StoreResources,
    VectorShadows,
)
from topics.deletion import Tombstone

# Entries per batch of the scans of the ghost audit and the verification probe: what they
# hold at once, however much of a table an erasure matches.
SCAN_BATCH_ROWS = 4096
# How many nearest entries of each probe vector the verification probe looks at.
PROBE_HITS = 5
_Entry = TypeVar("_Entry", VectorEntry, EntryRef)
# The probe vectors of an erasure (``deletion_probes.load_probes``: item type, id, vector).
ProbeLoader = Callable[[Conn, str, str, ProbeSealer], Awaitable[list[tuple[str, str, list[float]]]]]


class EmbeddingsStore(DerivedStore):
    """Removal is complete only once no old table version holds what was removed: a removed
    vector must not stay readable through the store's history.

    ``writes`` is the lock the worker's index updates take too: between removing, purging
    the history and checking, no other write adds a table version.

    ``vectors`` and ``shadows`` may be given as how to open them: they are then opened on
    first use. LanceDB and pyarrow are some 100 MB of a process, which the ledger and the
    monitor need only once an erasure is verified or audited.

    ``load_probes`` reads an erasure's probe vectors; by default from the ledger's tables
    (``deletion_probes.load_probes``), and a test of the store without PostgreSQL gives its own.
    """

    name = "embeddings"
    metrics_port = 9104
    deletion_slo_seconds = 900
    # The vectors are in PostgreSQL (MEMPROJ_VECTOR_STORE=postgres): any number of writers,
    # no files. With lancedb, one writer on a volume: ops/DEPLOY.md, "LanceDB instead".
    single_writer = None
    single_writer_with = (
        "MEMPROJ_VECTOR_STORE=lancedb",
        "LanceDB's history purge assumes one writer process, on the volume of its files",
    )
    volume = None

    def __init__(
        self,
        vectors: VectorStore | Callable[[], VectorStore],
        writes: asyncio.Lock,
        probes: ProbeSealer,
        shadows: VectorShadows | Callable[[], VectorShadows] | None = None,
        load_probes: ProbeLoader | None = None,
    ) -> None:
        self._open_vectors = vectors
        self._load_probes = load_probes
        self._writes = writes
        self._probes = probes
        self._open_shadows = shadows

    @classmethod
    def open(cls, resources: StoreResources) -> EmbeddingsStore:
        return cls(
            lambda: resources.vectors,
            resources.vector_writes,
            resources.probes,
            lambda: resources.vector_shadows,
        )

    @cached_property
    def _vectors(self) -> VectorStore:
        opened = self._open_vectors
        return opened() if callable(opened) else opened

    @cached_property
    def _shadows(self) -> VectorShadows | None:
        opened = self._open_shadows
        return opened() if callable(opened) else opened

    def _tables(self) -> list[tuple[str, VectorStore]]:
        """The live table, then every rebuild table beside it (a rebuild that was killed
        leaves its own: until it is dropped, erasures reach it too)."""
        shadows = self._shadows
        names = sorted(shadows.tables()) if shadows is not None else []
        return [("", self._vectors)] + [(f"{n}:", shadows.open(n)) for n in names if shadows]

    async def erase(self, tombstone: Tombstone) -> Erased:
        (erased,) = await self.erase_many([tombstone])
        return erased

    async def erase_many(self, tombstones: Sequence[Tombstone]) -> list[Erased]:
        """One delete, one purge of the old versions and one check per table for the whole
        batch, under one hold of the write lock: the purge is what an erasure costs (it
        rewrites the table), and it costs the same for one tombstone as for a hundred."""
        if not tombstones:
            return []
        matches = [match_of(tombstone) for tombstone in tombstones]
        removed = [0] * len(tombstones)
        left: list[list[str]] = [[] for _ in tombstones]
        async with self._writes:
            for label, vectors in await asyncio.to_thread(self._tables):
                found = await asyncio.to_thread(vectors.find_any, matches)
                claims = first_claims(erased_by_each(tombstones, found))
                doomed = [
                    Match(tombstone.tenant_id, entry_ids=tuple(entry.id for entry in claim))
                    for tombstone, claim in zip(tombstones, claims, strict=True)
                ]
                await asyncio.to_thread(vectors.remove_any, doomed)
                await asyncio.to_thread(vectors.purge_history)
                still = erased_by_each(
                    tombstones, await asyncio.to_thread(vectors.find_any, matches)
                )
                versions = await asyncio.to_thread(vectors.history_versions)
                for n, claim in enumerate(claims):
                    removed[n] += len(claim)
                    left[n] += [f"{label}{e.id}" for e in still[n]]
                    if versions:
                        left[n].append(f"{label}{versions} old table versions")
        return [Erased(count, reachable) for count, reachable in zip(removed, left, strict=True)]

    def purge_check(self) -> PurgeCheck:
        return VersionsCleaned(self)

    async def kept_in_history(self, tombstone: Tombstone) -> list[str]:
        """What of the tombstone's target an old version of any table (live or rebuild)
        still holds: removed entries stay in the data files of the versions before the
        removal until they are cleaned up."""
        match = match_of(tombstone)
        found: list[str] = []
        for label, vectors in await asyncio.to_thread(self._tables):
            kept = await asyncio.to_thread(vectors.history_find, match)
            found += [f"{label}version {v}:{e.id}" for v, e in kept if erased_by(tombstone, [e])]
        return found

    async def expire_copies(self, now: datetime, grace: timedelta) -> list[str]:
        if self._shadows is None:
            return []
        expired = [name for name, at in self._shadows.tables().items() if at + grace <= now]
        for name in expired:
            await asyncio.to_thread(self._shadows.drop, name)
        return sorted(expired)

    async def reachable(self, conn: Conn, tombstone: Tombstone) -> list[str]:
        """By target, by item id, by content (the probe vectors of the erased text: a hit of
        the target is a copy that survived under another id) and through old versions."""
        tenant = tombstone.tenant_id
        match = match_of(tombstone)
        found = {f"target:{e.id}" for e in await _still_refs(self._vectors, tombstone, match)}
        memories = [memory_entry_id(tenant, m) for m in tombstone.ids("memory")]
        found |= {
            f"id:{e.id}" for e in await asyncio.to_thread(self._vectors.get, tenant, memories)
        }
        load = self._load_probes or deletion_probes.load_probes
        probes = await load(conn, tenant, tombstone.deletion_id, self._probes)
        vectors = [vector for _, _, vector in probes]
        for hits in await asyncio.to_thread(self._vectors.nearest, tenant, vectors, PROBE_HITS):
            found |= {f"content:{hit.entry.id}" for hit in hits if match.matches(hit.entry)}
        # Old table versions: the ones an erasure left would still hold the target. Versions
        # the indexer wrote since hold only what the erasure index let through, and are clean.
        kept = await asyncio.to_thread(self._vectors.history_find, match)
        found |= {f"version {v}:{e.id}" for v, e in kept if erased_by(tombstone, [e])}
        for label, shadow in (await asyncio.to_thread(self._tables))[1:]:
            found |= {f"{label}{e.id}" for e in await _still_refs(shadow, tombstone, match)}
        return sorted(found)

    async def ghosts(self, conn: Conn, covered: Mapping[str, ErasureIndex]) -> list[str]:
        if not covered:
            return []  # nothing was erased: no entry can be a ghost (the store stays unopened)
        found: set[str] = set()
        for label, vectors in await asyncio.to_thread(self._tables):
            found |= {f"{label}{entry_id}" for entry_id in await _ghosts(vectors, covered)}
        return sorted(found)


async def _still(vectors: VectorStore, tombstone: Tombstone, match: Match) -> list[VectorEntry]:
    """What of the tombstone's target a table still holds."""
    return erased_by(tombstone, await asyncio.to_thread(vectors.find, match))


async def _still_refs(vectors: VectorStore, tombstone: Tombstone, match: Match) -> list[EntryRef]:
    """``_still``, read in batches without text or vector (the verification probe)."""

    def scan() -> list[EntryRef]:
        return [
            entry
            for batch in vectors.find_refs(match, SCAN_BATCH_ROWS)
            for entry in erased_by(tombstone, batch)
        ]

    return await asyncio.to_thread(scan)


async def _ghosts(vectors: VectorStore, covered: Mapping[str, ErasureIndex]) -> set[str]:
    """The ids of a table's entries that an erasure or revocation covers. Read in batches of
    ``SCAN_BATCH_ROWS`` entries without text or vector: what the audit holds at once does
    not grow with what the erasures match (a subject's whole history, every revoked memory)."""

    def scan() -> set[str]:
        found: set[str] = set()
        for tenant, index in covered.items():
            subjects = [(k[2], k[3]) for k in index.entries if k[1] == "subject"]
            matches = [_match(tenant, index)] + [
                Match(tenant_id=tenant, subject=subject) for subject in subjects[1:]
            ]
            for match in matches:
                for batch in vectors.find_refs(match, SCAN_BATCH_ROWS):
                    found.update(entry.id for entry in covered_entries(batch, {tenant: index}))
        return found

    return await asyncio.to_thread(scan)


def covered_entries(entries: list[_Entry], covered: Mapping[str, ErasureIndex]) -> list[_Entry]:
    """The entries an erasure or revocation covers: ghosts, wherever they are found."""
    return [
        entry
        for entry in entries
        if (index := covered.get(entry.tenant_id)) is not None
        and index.covering(
            keys_of(
                entry.tenant_id,
                (entry.subject_type, entry.subject_id),
                memory_id=entry.memory_id,
                conversation_id=entry.conversation_id,
            ),
            entry.occurred_at,
        )
        is not None
    ]


def _match(tenant: str, index: ErasureIndex) -> Match:
    subjects = [k for k in index.entries if k[1] == "subject"]
    return Match(
        tenant_id=tenant,
        conversation_ids=tuple(
            k[3] for k in index.entries if k[1] in ("conversation", "conversation_content")
        ),
        memory_ids=tuple(k[3] for k in index.entries if k[1] == "memory"),
        # One subject per Match: the others are found through their memories and
        # conversations, and separately.
        subject=(subjects[0][2], subjects[0][3]) if subjects else None,
    )


class VersionsCleaned:
    """The embeddings store's place: purged when no kept version of its tables holds the
    target. Its acknowledgement comes after the compaction and cleanup of old versions, so
    this normally holds at once; a version that still holds the target (written by a copy
    behind memproj's back, say) keeps the deletion unpurged until a later erasure's cleanup
    removes it."""

    def __init__(self, store: EmbeddingsStore) -> None:
        self._store = store

    @property
    def place(self) -> str:
        return self._store.name

    def applies(self, deletion: DuePurge) -> bool:
        return self._store.name in deletion.stores

    async def mark(self) -> Mark:
        return {}

    async def purged(self, due: Sequence[DuePurge]) -> set[RequestKey]:
        return {d.key for d in due if not await self._store.kept_in_history(d.tombstone)}
