"""A deletion's second milestone, ``purged``: no copy of what it erased is left anywhere memproj
writes.

``completed`` means every store has removed the items and checked that no reader reaches
them. Copies can still be there: the erased value on the compacted ``memory.current`` until
the cleaner rewrites its segment, the raw input until it is trimmed, PostgreSQL's dead tuples
until a vacuum whose horizon is past the deleting transactions, a LanceDB table's old
versions. Each place a copy can remain has one small check (``PurgeCheck``), registered in one
list (``streams.purge.purge_checks``): when a deletion is completed, every check that applies
to it notes what it must wait for (its ``mark``: a transaction horizon, offsets); each round
of the deletion worker's purge duty asks it which of its due deletions are purged now. The
deletion is purged when every place is.

The decisions are pure functions here; the checks that read PostgreSQL are here too
(``TablesVacuumed``), the Kafka ones in ``streams.purge``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from projections.deletion.ledger import RequestKey
from projections.sql import Conn
from topics.deletion import Tombstone

# The places outside the derived stores (each store is a place of its own, by its name).
MEMORY_CURRENT_PLACE = "memory.current"
RAW_INPUT_PLACE = "raw_input"
PROJECTION_TABLES_PLACE = "postgres"
REBUILD_COPIES_PLACE = "rebuild_copies"

Mark = dict[str, Any]


@dataclass(frozen=True, slots=True)
class DuePurge:
    """A completed deletion as a purge check sees it: its tombstone (ids only) and what the
    check noted when it became due."""

    tombstone: Tombstone
    mark: Mark

    @property
    def key(self) -> RequestKey:
        return (self.tombstone.tenant_id, self.tombstone.deletion_id)

    @property
    def kind(self) -> str:
        return self.tombstone.kind

    @property
    def memories(self) -> tuple[str, ...]:
        """The erased memories: their keys on memory.current got the ledger's null."""
        return tuple(self.tombstone.ids("memory"))

    @property
    def stores(self) -> tuple[str, ...]:
        """The stores that acknowledged it (those holding copies of its target)."""
        return tuple(self.tombstone.required_stores)


class PurgeCheck(Protocol):
    """One place a copy of erased data can remain after the deletion is completed."""

    @property
    def place(self) -> str: ...

    def applies(self, deletion: DuePurge) -> bool:
        """Whether the deletion left a copy this place must purge."""
        ...

    async def mark(self) -> Mark:
        """What to wait for, noted once when deletions become due (after their completion,
        so everything they removed was removed before)."""
        ...

    async def purged(self, due: Sequence[DuePurge]) -> set[RequestKey]:
        """Of ``due`` (each with its mark), the deletions no copy of which remains here now.
        Idempotent; it may do the work that purges (a vacuum)."""
        ...


# -- the decisions -----------------------------------------------------------------------------


def horizon_passed(mark_xid: int, horizon_xid: int) -> bool:
    """Whether every transaction that committed before ``mark_xid`` (the next transaction id
    when the deletion became due) is older than every snapshot still open (``horizon_xid``):
    then a vacuum removes the tuples they deleted, which nobody can see any more."""
    return horizon_xid >= mark_xid


def compaction_leftovers(
    records: Iterable[tuple[bytes | None, bool]], keys: set[bytes]
) -> set[bytes]:
    """The keys among ``keys`` that still have a value before a later null in a compacted
    log read in order (``records``: key, whether the value is null). The cleaner drops every
    record of a key older than its latest record; a value followed by a null is one it has not
    reached yet. A value after the last null is new data (written after the erasure)."""
    values: set[bytes] = set()
    leftovers: set[bytes] = set()
    for key, is_null in records:
        if key is None or key not in keys:
            continue
        if is_null:
            if key in values:
                leftovers.add(key)
        else:
            values.add(key)
    return leftovers


def trimmed_past(
    mark: Mapping[str, Mapping[str, int]], low: Mapping[str, Mapping[str, int]]
) -> bool:
    """Whether every partition's low watermark (``low``: topic -> partition -> offset) is at
    or past the offset ``mark`` noted for it (the end of the log when the deletion became
    due): no record written before that is left."""
    return all(
        low.get(topic, {}).get(partition, -1) >= offset
        for topic, partitions in mark.items()
        for partition, offset in partitions.items()
    )


# -- PostgreSQL: dead tuples -------------------------------------------------------------------

# The oldest transaction id any open snapshot, running transaction, replication slot or
# prepared transaction still holds back, as a 64-bit id: a vacuum cannot remove a tuple
# deleted at or after it. Compared through age() (one reference for every 32-bit id) and
# taken from the snapshot's xmax, which only makes it lower (safe) when ids are in flight.
HORIZON = """
SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint
       - coalesce(max(greatest(age(x), 0)), 0)
FROM (
    SELECT backend_xmin AS x FROM pg_stat_activity WHERE backend_xmin IS NOT NULL
    UNION ALL SELECT backend_xid FROM pg_stat_activity WHERE backend_xid IS NOT NULL
    UNION ALL SELECT xmin FROM pg_replication_slots WHERE xmin IS NOT NULL
    UNION ALL SELECT transaction FROM pg_prepared_xacts
) AS held
"""


async def next_xid(conn: Conn) -> int:
    """Every transaction committed so far has an id below this one."""
    cursor = await conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
    row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


async def horizon(conn: Conn) -> int:
    cursor = await conn.execute(HORIZON)
    row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


async def vacuum(conn: Conn, tables: Sequence[sql.Composable]) -> None:
    """VACUUM (FREEZE, INDEX_CLEANUP ON) of ``tables``, outside any transaction.

    FREEZE makes it aggressive: a page it cannot lock for cleanup at once (a reader holds a
    pin) is waited for, not skipped, since its dead tuples are old enough to need freezing.
    INDEX_CLEANUP ON: index entries of removed tuples go too (no bypass for few dead ones).
    Pages it leaves all-frozen are skipped by the next one: a round costs the pages changed
    since the last."""
    if not tables:
        return
    await conn.set_autocommit(True)
    try:
        await conn.execute(
            sql.SQL("VACUUM (FREEZE, INDEX_CLEANUP ON) {}").format(sql.SQL(", ").join(tables))
        )
    finally:
        await conn.set_autocommit(False)


async def live_tables(conn: Conn, names: Sequence[str]) -> list[sql.Composable]:
    """``names`` in the live schema (the connection's current schema), those that exist."""
    cursor = await conn.execute(
        "SELECT current_schema(), c.relname FROM pg_class c"
        " WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r'"
        " AND c.relname = ANY (%s) ORDER BY c.relname",
        (list(names),),
    )
    return [sql.Identifier(schema, table) for schema, table in await cursor.fetchall()]


async def schema_tables(conn: Conn, schemas: Sequence[str]) -> list[sql.Composable]:
    """Every table of ``schemas``."""
    cursor = await conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = ANY (%s) AND c.relkind = 'r' ORDER BY 1, 2",
        (list(schemas),),
    )
    return [sql.Identifier(schema, table) for schema, table in await cursor.fetchall()]


TableLister = Callable[[Conn], Awaitable[list[sql.Composable]]]


class TablesVacuumed:
    """A place in PostgreSQL: the tables whose rows the erasure (or a store) deleted, purged
    once a vacuum that started after the horizon passed the deletion's mark has run.

    The mark is the next transaction id when the deletion became due (completed: every
    delete of it committed before). A round with deletions whose mark the horizon passed
    vacuums the tables once for all of them; the others wait for a later round (a long
    transaction anywhere in the cluster holds them back, as it holds back any vacuum)."""

    def __init__(
        self,
        place: str,
        pool: AsyncConnectionPool[Conn],
        tables: TableLister,
        applies: Callable[[DuePurge], bool],
    ) -> None:
        self._place = place
        self._pool = pool
        self._tables = tables
        self._applies = applies

    @property
    def place(self) -> str:
        return self._place

    def applies(self, deletion: DuePurge) -> bool:
        return self._applies(deletion)

    async def mark(self) -> Mark:
        async with self._pool.connection() as conn:
            return {"xid": await next_xid(conn)}

    async def purged(self, due: Sequence[DuePurge]) -> set[RequestKey]:
        async with self._pool.connection() as conn:
            passed = await horizon(conn)
            ready = {d.key for d in due if horizon_passed(int(d.mark["xid"]), passed)}
            if ready:
                tables = await self._tables(conn)
                await conn.commit()  # no snapshot of ours holds the horizon back
                await vacuum(conn, tables)
            return ready


def of_stores(*names: str) -> Callable[[DuePurge], bool]:
    """Applies to the deletions one of these stores acknowledged."""
    return lambda deletion: any(name in deletion.stores for name in names)


def erasures(deletion: DuePurge) -> bool:
    """Applies to erasures (a revocation leaves the authoritative rows and memory.current)."""
    return deletion.kind == "erasure"


class PurgedAtAck:
    """A store whose copies are gone once it acknowledged (Redis without persistence: a
    deleted key's memory is freed at once)."""

    def __init__(self, place: str) -> None:
        self._place = place

    @property
    def place(self) -> str:
        return self._place

    def applies(self, deletion: DuePurge) -> bool:
        return self._place in deletion.stores

    async def mark(self) -> Mark:
        return {}

    async def purged(self, due: Sequence[DuePurge]) -> set[RequestKey]:
        return {d.key for d in due}
