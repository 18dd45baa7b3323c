"""PostgreSQL access that every table's owner shares: the connection type, a batch's key
lookups (one statement for all its tenants, or one per tenant for Citus), and binary ``COPY``.

Batches go through binary ``COPY`` (under 1 us a row, against 14 us for parameter arrays):
straight into append-only tables, or into a per-transaction staging table when rows must be
merged. Nothing here names a table of memproj's: the owners pass theirs in.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
from psycopg import AsyncConnection, AsyncCursor, postgres
from psycopg.abc import AdaptContext
from psycopg.adapt import Dumper
from psycopg.pq import Format
from psycopg.rows import AsyncRowFactory

Conn = AsyncConnection[tuple[Any, ...]]


# The tenant column of every key a lookup takes: its first.
TENANT_COLUMN = "tenant_id"


@dataclass(frozen=True, slots=True)
class KeyLookups:
    """How a batch's keys are looked up: one statement for all its tenants (plain PostgreSQL:
    one round trip), or one statement per tenant, pipelined (``per_tenant``: each statement
    says ``tenant_id = <its tenant>``, so that Citus runs it on that tenant's shard alone;
    ops/decisions/citus.md, "Batches").

    A lookup's statement is written once, for both: ``{keys}`` stands for the relation ``k``
    of the keys, with the given columns (``tenant_id`` first), and ``{tenant}`` for the
    tenant of ``k``'s rows, to compare a table's ``tenant_id`` with; its own parameters are
    named (``%(name)s``; ``keys`` and ``tenant`` are taken). Keys of one tenant make one
    statement of that tenant in either mode.
    """

    per_tenant: bool = False

    async def fetch(
        self,
        conn: Conn,
        statement: str,
        columns: Sequence[str],
        keys: Iterable[Sequence[str]],
        params: Mapping[str, Any] | None = None,
        row_factory: AsyncRowFactory[Any] | None = None,
    ) -> list[Any]:
        """The rows of ``statement`` for ``keys``: those of every tenant's statement (one that
        changes rows says ``RETURNING``)."""
        rows: list[Any] = []
        for cursor in await self._run(conn, statement, columns, keys, params, row_factory):
            rows.extend(await cursor.fetchall())
            await cursor.close()
        return rows

    async def _run(
        self,
        conn: Conn,
        statement: str,
        columns: Sequence[str],
        keys: Iterable[Sequence[str]],
        params: Mapping[str, Any] | None,
        row_factory: AsyncRowFactory[Any] | None,
    ) -> list[AsyncCursor[Any]]:
        if columns[0] != TENANT_COLUMN:
            raise ValueError(f"a lookup's keys start with {TENANT_COLUMN}, not {columns[0]}")
        by_tenant: dict[str, list[Sequence[str]]] = {}
        for key in sorted(set(map(tuple, keys))):
            by_tenant.setdefault(key[0], []).append(key[1:])
        if not by_tenant:
            return []
        own = dict(params or {})
        if len(by_tenant) > 1 and not self.per_tenant:
            batch = _render(statement, _batch_keys(columns), f"k.{TENANT_COLUMN}")
            every = [(tenant, *rest) for tenant, group in by_tenant.items() for rest in group]
            return [await _cursor(conn, batch, {**own, "keys": _json(every)}, row_factory)]
        one = _render(statement, _tenant_keys(columns), "%(tenant)s")
        bound = [
            {**own, "keys": _json(group), "tenant": tenant} for tenant, group in by_tenant.items()
        ]
        if len(bound) == 1:
            return [await _cursor(conn, one, bound[0], row_factory)]
        # One round trip for all the tenants' statements: their results are read after it.
        async with conn.pipeline():
            return [await _cursor(conn, one, each, row_factory) for each in bound]


# For keys that are all one tenant's (a read, an erasure): both modes make the same statement.
ONE_TENANT = KeyLookups()


def _render(statement: str, keys: str, tenant: str) -> bytes:
    return statement.replace("{keys}", keys).replace("{tenant}", tenant).encode()


def _batch_keys(columns: Sequence[str]) -> str:
    """The keys of several tenants: one JSON array of them (psycopg dumps list parameters at
    about 0.5 us an element, orjson at 0.01, and the server reads both as fast; batches look
    up one or more keys per event, so this is per-event cost)."""
    fields = ", ".join(f"r->>{index} AS {name}" for index, name in enumerate(columns))
    return f"(SELECT {fields} FROM jsonb_array_elements(%(keys)s::jsonb) AS r) AS k"


def _tenant_keys(columns: Sequence[str]) -> str:
    """The keys of one tenant: the tenant a parameter, the rest a JSON array."""
    fields = ", ".join(
        [f"%(tenant)s::text AS {TENANT_COLUMN}"]
        + [f"r->>{index} AS {name}" for index, name in enumerate(columns[1:])]
    )
    return f"(SELECT {fields} FROM jsonb_array_elements(%(keys)s::jsonb) AS r) AS k"


def _json(keys: Sequence[Sequence[str]]) -> str:
    return orjson.dumps(keys).decode()


async def _cursor(
    conn: Conn,
    statement: bytes,
    params: Mapping[str, Any],
    row_factory: AsyncRowFactory[Any] | None,
) -> AsyncCursor[Any]:
    cursor = conn.cursor(row_factory=row_factory) if row_factory else conn.cursor()
    await cursor.execute(statement, params)
    return cursor


async def copy_rows(
    conn: Conn, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]
) -> None:
    """COPY ``rows`` into ``table`` in PostgreSQL's binary format.

    Binary, with the column types read from the catalog: psycopg then dumps each value by its
    column's type, where the text format spent about 0.8 us on every timestamp and 2 us on
    every array (a memory version row: 5.4 us in text, 0.6 in binary). JSON columns take the
    JSON text the caller serialised. psycopg's binary ``integer`` does not check its range:
    integers from input are bounded by the contract (``topics.envelope.StoredInt``).

    The types are read in the caller's transaction, every time (one round trip a batch and
    table): a cache would outlive a migration that changes a column under a running worker.
    """
    types = await _column_types(conn, table, columns)
    async with conn.cursor() as cursor:
        cursor.adapters.register_dumper(None, _JsonbTextDumper)
        cursor.adapters.register_dumper(None, _TextArrayDumper)
        statement = f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)"
        async with cursor.copy(statement.encode()) as copy:
            copy.set_types(types)
            for row in rows:
                await copy.write_row(row)


async def _column_types(conn: Conn, table: str, columns: Sequence[str]) -> list[int]:
    cursor = await conn.execute(
        "SELECT attname, atttypid FROM pg_attribute"
        " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
        (table,),
    )
    by_name = {str(name): int(oid) for name, oid in await cursor.fetchall()}
    missing = [column for column in columns if column.strip('"') not in by_name]
    if missing:
        # What PostgreSQL itself would say of the COPY: the schema is not the one memproj's
        # migrations made (an environment fault, never one message's).
        raise psycopg.errors.UndefinedColumn(
            f"table {table} has no column {', '.join(missing)}: its schema is not memproj's"
        )
    return [by_name[column.strip('"')] for column in columns]


class _EncodingDumper(Dumper):
    def __init__(self, cls: type, context: AdaptContext | None = None) -> None:
        super().__init__(cls, context)
        # The server reads binary text in the client encoding, as psycopg's own dumpers write.
        self._encoding = self.connection.info.encoding if self.connection else "utf-8"


class _JsonbTextDumper(_EncodingDumper):
    """jsonb from JSON text already serialised (by orjson) rather than from an object."""

    format = Format.BINARY
    oid = postgres.types["jsonb"].oid

    def dump(self, obj: str) -> bytes:
        return b"\x01" + obj.encode(self._encoding)


class _TextArrayDumper(_EncodingDumper):
    """text[] from a sequence of str, in the array's binary layout: psycopg's own list dumper
    is Python code that costs about 1.3 us for a three-item list, this 0.3."""

    format = Format.BINARY
    oid = postgres.types["text"].array_oid
    _element_oid = postgres.types["text"].oid

    def dump(self, obj: Sequence[str | None]) -> bytes:
        if not obj:
            return _ARRAY_HEADER.pack(0, 0, self._element_oid)
        parts = [
            _ARRAY_HEADER.pack(1, None in obj, self._element_oid),
            _ARRAY_DIMENSION.pack(len(obj), 1),
        ]
        for item in obj:
            if item is None:
                parts.append(_LENGTH.pack(-1))
            else:
                data = item.encode(self._encoding)
                parts.append(_LENGTH.pack(len(data)))
                parts.append(data)
        return b"".join(parts)


_ARRAY_HEADER = struct.Struct("!iiI")  # dimensions, has nulls, element type
_ARRAY_DIMENSION = struct.Struct("!ii")  # size, lower bound
_LENGTH = struct.Struct("!i")


async def staging_table(conn: Conn, like: str) -> str:
    """A temporary copy of ``like``'s columns, empty: emptied at every commit, and here too,
    since one transaction may stage several parts of a batch (savepoints of the isolation,
    ``streams.runner``), whose rows must not be merged again with the next part's. One round
    trip: two statements without parameters."""
    name = f"staging_{like}"
    await conn.execute(
        f"CREATE TEMP TABLE IF NOT EXISTS {name} (LIKE {like} INCLUDING DEFAULTS)"
        f" ON COMMIT DELETE ROWS; DELETE FROM {name}".encode()
    )
    return name


async def copy_new_rows(
    conn: Conn, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]
) -> int:
    """COPY ``rows`` in, keeping the rows already there (a replay records nothing twice)."""
    staging = await staging_table(conn, table)
    await copy_rows(conn, staging, columns, rows)
    names = ", ".join(columns)
    cursor = await conn.execute(
        f"INSERT INTO {table} ({names}) SELECT {names} FROM {staging}"
        " ON CONFLICT DO NOTHING".encode()
    )
    return cursor.rowcount
