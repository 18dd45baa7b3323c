"""The copies rebuilds leave beside the live schema, and how erasure reaches them.

A rebuild's shadow (``replay_*``) holds a full copy of a projection until it is swapped in or
abandoned; a swap moves the replaced tables to a retired schema (``retired_*``), kept so that
an operator can go back. Each is registered in ``rebuild_schemas`` of the live schema when it
is created, and from then on:

- every erasure removes what it covers from them too, in the erasure's own transaction (the
  rule of ``coverage``), so no full copy outlives an erasure;
- the verification probe and the ghost audit read them like the live tables;
- the deletion worker drops them once they are older than the grace period
  (``MEMPROJ_REBUILD_GRACE_SECONDS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from psycopg import errors, sql

from projections.deletion import coverage
from projections.deletion.erasure import ErasureScope
from projections.sql import Conn

Role = Literal["shadow", "retired"]


@dataclass(frozen=True, slots=True)
class RebuildSchema:
    name: str
    projection: str
    role: Role
    created_at: datetime


async def register(conn: Conn, schema: str, projection: str, role: Role) -> None:
    await conn.execute(
        "INSERT INTO rebuild_schemas (schema_name, projection, role) VALUES (%s, %s, %s)"
        " ON CONFLICT (schema_name) DO UPDATE SET role = EXCLUDED.role",
        (schema, projection, role),
    )


async def forget(conn: Conn, schema: str) -> None:
    await conn.execute("DELETE FROM rebuild_schemas WHERE schema_name = %s", (schema,))


async def registered(conn: Conn, *, hold: bool = False) -> list[RebuildSchema]:
    """The registered schemas that still exist (an operator may have dropped one by hand).

    With ``hold``, their rows stay share-locked until the transaction ends: ``drop_expired``
    deletes a row before it drops its schema, so a schema an erasure is reaching is not
    dropped under it (and one being dropped is skipped)."""
    cursor = await conn.execute(
        "SELECT r.schema_name, r.projection, r.role, r.created_at FROM rebuild_schemas r"
        " JOIN pg_namespace n ON n.nspname = r.schema_name ORDER BY r.schema_name"
        + (" FOR SHARE OF r" if hold else "")
    )
    return [RebuildSchema(*row) for row in await cursor.fetchall()]


async def _covered_tables(conn: Conn, schema: str) -> list[coverage.Coverage]:
    cursor = await conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
        (schema,),
    )
    present = {row[0] for row in await cursor.fetchall()}
    return [rule for table, rule in sorted(coverage.BY_TABLE.items()) if table in present]


async def erase_copies(conn: Conn, erasure: dict[str, object]) -> int:
    """In the erasure's transaction, after its ``erased_entities`` rows: remove from every
    rebuild schema what the erasure removes from the live one (``erasure``: the params of
    ``coverage.deletion_params``). A rebuild writing its shadow at the same time takes the
    tenant lock this transaction holds, so it waits, then sees the erasure."""
    removed = 0
    for schema in await registered(conn, hold=True):
        try:
            async with conn.transaction():  # a savepoint: see below
                for rule in await _covered_tables(conn, schema.name):
                    cursor = await conn.execute(rule.of_deletion("DELETE", schema.name), erasure)
                    removed += cursor.rowcount
        except (errors.UndefinedTable, errors.InvalidSchemaName):
            # Dropped by hand since it was read: nothing of it is left to erase.
            continue
    return removed


async def erase(conn: Conn, scope: ErasureScope) -> None:
    """Rebuild shadows and retired tables hold full copies: an erasure reaches them too."""
    await erase_copies(
        conn,
        coverage.deletion_params(
            scope.tenant_id,
            scope.deletion_id,
            scope.memories,
            scope.conversations,
            sources=scope.sources,
        ),
    )


async def covered_copies(conn: Conn, erasure: dict[str, object] | None = None) -> list[str]:
    """``<schema>.<table>: <rows>`` for every rebuild-schema table that still holds rows
    that one erasure removes (verification: ``erasure`` as for ``erase_copies``) or that any
    erasure covers (the ghost audit)."""
    every = sql.Identifier("erased_entities")
    found = []
    for schema in await registered(conn):
        for rule in await _covered_tables(conn, schema.name):
            query = (
                rule.count(schema.name, every, deletion=False)
                if erasure is None
                else rule.of_deletion("SELECT count(*)", schema.name)
            )
            cursor = await conn.execute(query, erasure)
            row = await cursor.fetchone()
            if row and row[0]:
                found.append(f"{schema.name}.{rule.table}: {row[0]}")
    return found


async def drop_expired(conn: Conn, now: datetime, grace: timedelta) -> list[str]:
    """Drop the rebuild schemas older than ``grace``; returns their names."""
    # The rows first: an erasure holding one (``registered(hold=True)``) is waited for, and
    # one that comes later finds the row gone and skips the schema.
    cursor = await conn.execute(
        "DELETE FROM rebuild_schemas WHERE created_at + %s <= %s RETURNING schema_name",
        (grace, now),
    )
    dropped = sorted(row[0] for row in await cursor.fetchall())
    for name in dropped:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    # Rows of schemas dropped by hand are forgotten too.
    await conn.execute(
        "DELETE FROM rebuild_schemas r WHERE NOT EXISTS"
        " (SELECT 1 FROM pg_namespace n WHERE n.nspname = r.schema_name)"
    )
    return dropped
