"""The summaries and context stores in memory: the derived-store contract
(tests/support/contracts/derived.py) without PostgreSQL.

A row is a conversation's copy for its owner at a time. An erasure removes the rows of the
conversations its tombstone lists, and the rows its ledger entry covers (``erasures``: what
``erased_entities`` holds in PostgreSQL) by the rule written once for stores that are not
tables: ``keys_of`` and ``ErasureIndex.covering``. Removed rows are gone at once, so the
purge check is the default one (purged at the acknowledgement).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

from projections.deletion import coverage
from projections.deletion.coverage import keys_of
from projections.deletion.erasure import ErasureIndex, ErasureRow, latest_erasures
from projections.sql import Conn
from projections.stores.base import CONVERSATION_TARGETS, DerivedStore, Erased, StoreResources
from projections.stores.tables import ContextStore, SummariesStore
from topics.deletion import Tombstone


@dataclass(frozen=True, slots=True)
class Row:
    tenant_id: str
    conversation_id: str
    owner: tuple[str, str]
    at: datetime


class InMemoryConversationTable(DerivedStore):
    covers = CONVERSATION_TARGETS
    table: ClassVar[coverage.Coverage]

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.erasures: list[ErasureRow] = []

    @classmethod
    def open(cls, resources: StoreResources) -> InMemoryConversationTable:
        return cls()

    async def erase(self, tombstone: Tombstone) -> Erased:
        (erased,) = await self.erase_many([tombstone])
        return erased

    async def erase_many(self, tombstones: Sequence[Tombstone]) -> list[Erased]:
        removed = []
        for tombstone in tombstones:
            doomed = self._of(tombstone)
            self.rows = [row for row in self.rows if row not in doomed]
            removed.append(len(doomed))
        return [
            Erased(count, self._reachable(t)) for count, t in zip(removed, tombstones, strict=True)
        ]

    async def reachable(self, conn: Conn, tombstone: Tombstone) -> list[str]:
        return self._reachable(tombstone)

    async def ghosts(self, conn: Conn, covered: Mapping[str, ErasureIndex]) -> list[str]:
        every = ErasureIndex(latest_erasures(self.erasures))
        return sorted(
            {f"{row.tenant_id}:{row.conversation_id}" for row in self.rows if _covered(every, row)}
        )

    def _of(self, tombstone: Tombstone) -> list[Row]:
        """The rows one erasure removes: of its listed conversations, and of what its own
        ledger entry covers up to its cut-off."""
        mine = ErasureIndex(
            latest_erasures(e for e in self.erasures if e[1] == tombstone.deletion_id)
        )
        listed = set(tombstone.conversation_ids())
        return [
            row
            for row in self.rows
            if row.tenant_id == tombstone.tenant_id
            and (row.conversation_id in listed or _covered(mine, row))
        ]

    def _reachable(self, tombstone: Tombstone) -> list[str]:
        found = {row.conversation_id for row in self._of(tombstone)}
        return [f"{self.table.table}:{conversation}" for conversation in sorted(found)]


def _covered(index: ErasureIndex, row: Row) -> bool:
    keys = keys_of(row.tenant_id, row.owner, conversation_id=row.conversation_id)
    return index.covering(keys, row.at) is not None


class InMemorySummaries(InMemoryConversationTable):
    name = SummariesStore.name
    metrics_port = SummariesStore.metrics_port
    deletion_slo_seconds = SummariesStore.deletion_slo_seconds
    table = SummariesStore.table


class InMemoryContext(InMemoryConversationTable):
    name = ContextStore.name
    metrics_port = ContextStore.metrics_port
    deletion_slo_seconds = ContextStore.deletion_slo_seconds
    table = ContextStore.table
