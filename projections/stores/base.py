"""The small base every derived store is built on.

A derived store is a copy of projected data kept somewhere else for a reader (vectors, a
cache, a table of summaries). Everything memproj does with one lives on its object: erasing a
tombstone's items, telling the verification probe what of an erased target it still holds,
telling the ghost audit what of every erasure it still holds, and its operational facts (its
worker's metrics port, its deletion SLO, which targets it holds copies of). Workers, the
ledger, the probe, the audit, the metrics and the deployment configs all come from the
registry (``projections.stores``) or are tested against it.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import ClassVar, Protocol

from psycopg_pool import AsyncConnectionPool

from projections.cache.store import RedisCache
from projections.deletion.erasure import ErasureIndex
from projections.deletion.purge import PurgeCheck, PurgedAtAck
from projections.embeddings.vectors import VectorStore
from projections.sealing.probes import ProbeSealer
from projections.sql import Conn
from topics.deletion import TargetType, Tombstone

ALL_TARGETS: frozenset[TargetType] = frozenset({"subject", "conversation", "memory"})
CONVERSATION_TARGETS: frozenset[TargetType] = frozenset({"subject", "conversation"})


@dataclass(frozen=True, slots=True)
class Erased:
    removed: int
    # What of the tombstone's items can still be read in the store; empty means verified.
    reachable: list[str]


class VectorShadows(Protocol):
    def tables(self) -> Mapping[str, datetime]:
        """Every rebuild table, with when it was created."""
        ...

    def open(self, name: str) -> VectorStore: ...

    def drop(self, name: str) -> None: ...


class StoreResources(Protocol):
    """What stores are opened from; a worker opens only what its stores use."""

    @property
    def pool(self) -> AsyncConnectionPool[Conn]: ...

    @property
    def vectors(self) -> VectorStore: ...

    @property
    def cache(self) -> RedisCache: ...

    @property
    def probes(self) -> ProbeSealer:
        """Opens the verification probe's sealed vectors."""
        ...

    @property
    def vector_shadows(self) -> VectorShadows:
        """The vector tables rebuilds write beside the live one."""
        ...

    @property
    def vector_writes(self) -> asyncio.Lock:
        """Held by every write to the vector store (index updates and tombstones)."""
        ...


@dataclass(frozen=True, slots=True)
class StoreVolume:
    """Files a store keeps on its worker's disk, under ``MEMPROJ_DATA_DIR``: a volume its
    worker writes and the kinds that read every store (the verification probe, the ghost
    audit) mount too, on the same node."""

    name: str  # the volume's name in a pod
    claim: str  # its PersistentVolumeClaim (ops/k8s/pvc.yaml)
    directory: str  # where under MEMPROJ_DATA_DIR


class DerivedStore(ABC):
    name: ClassVar[str]
    # The port of the store's worker's /metrics endpoint.
    metrics_port: ClassVar[int]
    # Why only one worker of the store may run at a time (its deployment stops the old one
    # before it starts the new one); None: its workers share the tombstones' partitions.
    single_writer: ClassVar[str | None] = None
    # A setting under which only one worker of the store may write, and why: its deployment
    # says so (an overlay sets one replica); None: any setting scales.
    single_writer_with: ClassVar[tuple[str, str] | None] = None
    # Its files on the worker's disk; None: it keeps its data in PostgreSQL or Redis.
    volume: ClassVar[StoreVolume | None] = None
    # How long the store may take to acknowledge a tombstone before the ledger reports it
    # overdue (``MemprojDeletionPendingTooLong`` compares against it).
    deletion_slo_seconds: ClassVar[int]
    # The deletion targets it holds copies of: the tombstones it must acknowledge.
    covers: ClassVar[frozenset[TargetType]] = ALL_TARGETS

    @classmethod
    @abstractmethod
    def open(cls, resources: StoreResources) -> DerivedStore: ...

    @abstractmethod
    async def erase(self, tombstone: Tombstone) -> Erased:
        """Remove every copy of the tombstone's items, then check they are unreachable."""

    async def erase_many(self, tombstones: Sequence[Tombstone]) -> list[Erased]:
        """``erase`` of every tombstone, one result each in their order, with the same
        guarantee for each. Stores where a batch costs less than its tombstones one by one
        (a purge, a round trip, a transaction) do it at once; the others erase in turn."""
        return [await self.erase(tombstone) for tombstone in tombstones]

    @abstractmethod
    async def reachable(self, conn: Conn, tombstone: Tombstone) -> list[str]:
        """For the verification probe: what of the erased target a reader can still get."""

    def purge_check(self) -> PurgeCheck:
        """When no copy of an acknowledged deletion is left in the store (its ``purged``
        milestone). By default at the acknowledgement: the store keeps nothing it removed."""
        return PurgedAtAck(self.name)

    async def expire_copies(self, now: datetime, grace: timedelta) -> list[str]:
        """Drop the copies the store keeps for rebuilds once older than ``grace``; their
        names. Most stores keep none."""
        return []

    @abstractmethod
    async def ghosts(self, conn: Conn, covered: Mapping[str, ErasureIndex]) -> list[str]:
        """For the ghost audit: what the store holds that an erasure or revocation covers
        (``covered``: per tenant), read from the store itself, not from acknowledgements."""
