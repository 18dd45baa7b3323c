"""Shadow copies of a projection's tables, for rebuilds: create them next to the live ones,
compare the two per tenant, sweep erased data out, and swap them in atomically.

A shadow lives in its own PostgreSQL schema holding only the projection's tables and the
bookkeeping it writes; everything else (the ledger, the erasure index, the data keys)
resolves to the live schema through the search path, so a rebuild consults the live ledger.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql

from projections.deletion import coverage
from projections.sql import Conn

BOOKKEEPING = ("processed_events", "projection_offsets", "rejections", "outbox")


@dataclass(frozen=True, slots=True)
class ShadowSpec:
    projection: str
    # (table, columns that order its rows for the checksum)
    tables: tuple[tuple[str, str], ...]

    @property
    def table_names(self) -> tuple[str, ...]:
        return tuple(table for table, _ in self.tables)


MEMORY = ShadowSpec(
    "memory", (("memories", "memory_id"), ("memory_versions", "memory_id, version"))
)
CONVERSATION = ShadowSpec(
    "conversation",
    (
        ("conversations", "conversation_id"),
        ("conversation_messages", "conversation_id, seq"),
        ("conversation_summaries", "conversation_id, summary_version"),
        ("conversation_context", "conversation_id"),
    ),
)
SPECS = {spec.projection: spec for spec in (MEMORY, CONVERSATION)}


@dataclass(frozen=True, slots=True)
class TenantDigest:
    rows: dict[str, int]
    digest: str


async def checksums(conn: Conn, spec: ShadowSpec) -> dict[str, TenantDigest]:
    """Row counts per table and one content digest per tenant, over the tables the search
    path resolves to: two copies are the same exactly when their checksums are."""
    per_table = []
    for table, order in spec.tables:
        query = sql.SQL(
            "SELECT tenant_id, count(*), md5(string_agg(row_to_json(t)::text, '|' ORDER BY {}))"
            " FROM {} t GROUP BY tenant_id"
        ).format(sql.SQL(order), sql.Identifier(table))
        cursor = await conn.execute(query)
        per_table.append(
            (table, {row[0]: (int(row[1]), row[2]) for row in await cursor.fetchall()})
        )
    tenants = sorted({tenant for _, found in per_table for tenant in found})
    result = {}
    for tenant in tenants:
        rows = {table: found.get(tenant, (0, ""))[0] for table, found in per_table}
        digest = "|".join(found.get(tenant, (0, ""))[1] or "" for _, found in per_table)
        result[tenant] = TenantDigest(rows, digest)
    return result


def differences(
    live: dict[str, TenantDigest], shadow: dict[str, TenantDigest]
) -> dict[str, dict[str, dict[str, int] | None]]:
    """Per tenant that differs: the row counts of each side."""
    found: dict[str, dict[str, dict[str, int] | None]] = {}
    for tenant in sorted(set(live) | set(shadow)):
        left, right = live.get(tenant), shadow.get(tenant)
        if left is None or right is None or left != right:
            found[tenant] = {
                "live": left.rows if left else None,
                "rebuilt": right.rows if right else None,
            }
    return found


async def current_schema(conn: Conn) -> str:
    cursor = await conn.execute("SELECT current_schema()")
    row = await cursor.fetchone()
    assert row is not None and row[0], "the live DSN resolves to no schema"
    return str(row[0])


async def create_shadow(conn: Conn, spec: ShadowSpec, live: str, shadow: str) -> None:
    await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(shadow)))
    for table in (*spec.table_names, *BOOKKEEPING):
        await conn.execute(
            sql.SQL("CREATE TABLE {}.{} (LIKE {}.{} INCLUDING ALL)").format(
                sql.Identifier(shadow),
                sql.Identifier(table),
                sql.Identifier(live),
                sql.Identifier(table),
            )
        )


async def sweep_erased(conn: Conn, spec: ShadowSpec) -> int:
    """Deletes, from the tables of the current search path, everything an erasure covers (the
    rule of ``coverage``). A rebuild that ran while deletions happened is swept before it is
    swapped in; deleting nothing is the expected outcome."""
    removed = 0
    schema = await current_schema(conn)
    for table in spec.table_names:
        cursor = await conn.execute(
            coverage.BY_TABLE[table].erase(schema, sql.Identifier("erased_entities"))
        )
        removed += cursor.rowcount
    return removed


async def swap(
    conn: Conn, spec: ShadowSpec, live: str, shadow: str, retired: str, live_topics: Sequence[str]
) -> None:
    """In the caller's transaction: the live tables move to ``retired`` and the shadow's take
    their place; the projection's processed event ids and rejections are replaced by the
    shadow's. Its tracking rows stay those of the topics the live worker reads
    (``live_topics``), each raised to the shadow's where the shadow read further: the shadow
    was caught up to what the live worker applied, so the rows hold of the new tables. Rows
    of any other topic (the sealed log, which a sealing worker does not read) are dropped."""
    ident = sql.Identifier
    await conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident(retired)))
    for table in spec.table_names:
        await conn.execute(
            sql.SQL("ALTER TABLE {}.{} SET SCHEMA {}").format(
                ident(live), ident(table), ident(retired)
            )
        )
        await conn.execute(
            sql.SQL("ALTER TABLE {}.{} SET SCHEMA {}").format(
                ident(shadow), ident(table), ident(live)
            )
        )
    for table in ("processed_events", "rejections"):
        await conn.execute(
            sql.SQL("DELETE FROM {}.{} WHERE projection = %s").format(ident(live), ident(table)),
            (spec.projection,),
        )
        await conn.execute(
            # The shadow's serial columns draw from the live sequences (LIKE copies the
            # defaults), so its ids never collide with the live ones.
            sql.SQL("INSERT INTO {}.{} SELECT * FROM {}.{} WHERE projection = %s").format(
                ident(live), ident(table), ident(shadow), ident(table)
            ),
            (spec.projection,),
        )
    topics = list(live_topics)
    await conn.execute(
        sql.SQL(
            "DELETE FROM {}.projection_offsets WHERE projection = %s AND topic <> ALL(%s)"
        ).format(ident(live)),
        (spec.projection, topics),
    )
    await conn.execute(
        sql.SQL(
            "INSERT INTO {live}.projection_offsets AS o (projection, topic, partition, next_offset)"
            " SELECT projection, topic, partition, next_offset FROM {shadow}.projection_offsets"
            " WHERE projection = %s AND topic = ANY(%s)"
            " ON CONFLICT (projection, topic, partition) DO UPDATE"
            " SET next_offset = GREATEST(o.next_offset, EXCLUDED.next_offset), updated_at = now()"
        ).format(live=ident(live), shadow=ident(shadow)),
        (spec.projection, topics),
    )


async def drop_schema(conn: Conn, schema: str) -> None:
    await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
