"""Derived tables of the conversation projection, keyed by conversation and owner: the
summaries (``conversation_summaries``) and the context views (``conversation_context``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from projections.deletion import coverage
from projections.deletion.erasure import ErasureIndex
from projections.deletion.purge import PurgeCheck, TablesVacuumed, live_tables, of_stores
from projections.sql import Conn
from projections.stores.base import CONVERSATION_TARGETS, DerivedStore, Erased, StoreResources
from topics.deletion import Tombstone


class ConversationTableStore(DerivedStore):
    covers = CONVERSATION_TARGETS
    table: ClassVar[coverage.Coverage]

    def __init__(self, pool: AsyncConnectionPool[Conn]) -> None:
        self._pool = pool

    @classmethod
    def open(cls, resources: StoreResources) -> ConversationTableStore:
        return cls(resources.pool)

    def purge_check(self) -> PurgeCheck:
        """The removed rows are dead tuples until the table is vacuumed past them."""

        async def tables(conn: Conn) -> list[sql.Composable]:
            return await live_tables(conn, [self.table.table])

        return TablesVacuumed(self.name, self._pool, tables, of_stores(self.name))

    def _of(self, tombstone: Tombstone, select: str) -> tuple[sql.Composed, dict[str, object]]:
        return self.table.of_deletion(select), coverage.tombstone_params(tombstone)

    async def erase(self, tombstone: Tombstone) -> Erased:
        (erased,) = await self.erase_many([tombstone])
        return erased

    async def erase_many(self, tombstones: Sequence[Tombstone]) -> list[Erased]:
        """The batch's deletes in one transaction, then its checks, each sent in one
        pipeline: two round trips for the batch, not two per tombstone."""
        if not tombstones:
            return []
        async with self._pool.connection() as conn:
            async with conn.pipeline():
                deletes = [await conn.execute(*self._of(t, "DELETE")) for t in tombstones]
            await conn.commit()
            async with conn.pipeline():
                checks = [await conn.execute(*self._reachable(t)) for t in tombstones]
            return [
                Erased(deleted.rowcount, self._names(await check.fetchall()))
                for deleted, check in zip(deletes, checks, strict=True)
            ]

    async def reachable(self, conn: Conn, tombstone: Tombstone) -> list[str]:
        cursor = await conn.execute(*self._reachable(tombstone))
        return self._names(await cursor.fetchall())

    def _reachable(self, tombstone: Tombstone) -> tuple[sql.Composed, dict[str, object]]:
        return self._of(tombstone, "SELECT DISTINCT t.conversation_id")

    def _names(self, rows: Sequence[tuple[Any, ...]]) -> list[str]:
        return [f"{self.table.table}:{row[0]}" for row in rows]

    async def ghosts(self, conn: Conn, covered: Mapping[str, ErasureIndex]) -> list[str]:
        cursor = await conn.execute(self.table.covered_conversations())
        return [row[0] for row in await cursor.fetchall()]


class SummariesStore(ConversationTableStore):
    name = "summaries"
    metrics_port = 9105
    deletion_slo_seconds = 600
    table = coverage.SUMMARIES


class ContextStore(ConversationTableStore):
    name = "context"
    metrics_port = 9107
    deletion_slo_seconds = 600
    table = coverage.CONTEXT
