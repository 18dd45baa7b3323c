"""The plaintext audit of PostgreSQL: every row, every column, of every memproj schema, and
every dead tuple.

memproj's schemas are the live one (the DSN's current schema), the rebuild shadows
(``replay_*``) and retired tables (``retired_*``) of ``streams/replay.py``, those registered
in the live ``rebuild_schemas``, and any other schema holding memproj's migration table. Each
table is read in one pass (one sequential scan) inside one read-only snapshot; a table that
holds the marker is read again for a few of its primary keys (or ctids), never its content.

Then each table is read again through the ``pg_dirtyread`` extension, which returns every
tuple still on its pages, deleted and superseded ones included, until a vacuum removes them:
the tuples the snapshot does not see are the dead ones. Without the extension (or without the
superuser right it needs) the audit reports that it could not look at dead tuples: an
incomplete look.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import errors, sql

from projections.sql import Conn
from streams.audit.plaintext import Hit, Matcher, PlaceKind, Report

MIGRATION_TABLE = "schema_migrations"
REBUILD_PREFIXES = ("replay_", "retired_")
# Types whose text form cannot hold a marker (numbers, booleans, times): not cast to text.
_SKIPPED_TYPE_CATEGORIES = ("N", "B", "D", "T")


DIRTYREAD = "pg_dirtyread"


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    is_bytes: bool
    # Its SQL type (format_type), for pg_dirtyread's column definition list.
    type: str = "text"


@dataclass(frozen=True, slots=True)
class TableShape:
    schema: str
    table: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"


async def memproj_schemas(conn: Conn) -> list[str]:
    """Every schema memproj writes in this database, the live one first."""
    cursor = await conn.execute("SELECT current_schema()")
    row = await cursor.fetchone()
    live = str(row[0]) if row and row[0] else None
    cursor = await conn.execute(
        "SELECT n.nspname FROM pg_namespace n WHERE n.nspname LIKE ANY (%s)"
        " OR EXISTS (SELECT 1 FROM pg_class c"
        " WHERE c.relnamespace = n.oid AND c.relname = %s AND c.relkind IN ('r', 'p'))",
        ([prefix.replace("_", "\\_") + "%" for prefix in REBUILD_PREFIXES], MIGRATION_TABLE),
    )
    found = {str(name) for (name,) in await cursor.fetchall()}
    found.update(await _registered_rebuilds(conn, live))
    ordered = sorted(found - {live}) if live else sorted(found)
    return [live, *ordered] if live else ordered


async def _registered_rebuilds(conn: Conn, live: str | None) -> set[str]:
    """The rebuild schemas the live schema registered (``rebuild_schemas``), where it has
    that table: a shadow under another name is still a copy."""
    if live is None:
        return set()
    cursor = await conn.execute(
        "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = 'rebuild_schemas'",
        (live,),
    )
    if await cursor.fetchone() is None:
        return set()
    cursor = await conn.execute(
        sql.SQL(
            "SELECT r.schema_name FROM {}.rebuild_schemas r JOIN pg_namespace n"
            " ON n.nspname = r.schema_name"
        ).format(sql.Identifier(live))
    )
    return {str(name) for (name,) in await cursor.fetchall()}


async def table_shapes(conn: Conn, schemas: Sequence[str]) -> list[TableShape]:
    cursor = await conn.execute(
        "SELECT n.nspname, c.relname, a.attname, t.typname = 'bytea',"
        " coalesce(a.attnum = ANY (i.indkey), false), format_type(a.atttypid, a.atttypmod)"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped"
        " JOIN pg_type t ON t.oid = a.atttypid"
        " LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary"
        " WHERE n.nspname = ANY (%s) AND c.relkind IN ('r', 'm')"
        " AND (t.typcategory <> ALL (%s) OR coalesce(a.attnum = ANY (i.indkey), false))"
        " ORDER BY n.nspname, c.relname, a.attnum",
        (list(schemas), list(_SKIPPED_TYPE_CATEGORIES)),
    )
    shapes: dict[tuple[str, str], tuple[list[Column], list[str]]] = {}
    for schema, table, column, is_bytes, in_key, type_name in await cursor.fetchall():
        columns, key = shapes.setdefault((schema, table), ([], []))
        columns.append(Column(column, bool(is_bytes), str(type_name)))
        if in_key:
            key.append(column)
    return [
        TableShape(schema, table, tuple(columns), tuple(key))
        for (schema, table), (columns, key) in shapes.items()
    ]


def _column_condition(column: Column, matcher: Matcher) -> sql.Composable:
    """Whether this column holds the marker: in a bytea's bytes, or in the text form of any
    other type (a jsonb's text escapes like JSON, which one of the needles is)."""
    ident = sql.Identifier(column.name)
    if column.is_bytes:
        tests = [
            sql.SQL("position({} IN {}) > 0").format(sql.Literal(needle), ident)
            for needle in matcher.needles
        ]
    else:
        tests = [
            sql.SQL("strpos({}::text, {}) > 0").format(ident, sql.Literal(text))
            for text in matcher.texts
        ]
    return sql.SQL("({})").format(sql.SQL(" OR ").join(tests))


async def scan_table(conn: Conn, shape: TableShape, matcher: Matcher, report: Report) -> None:
    searched = [column for column in shape.columns if column.name not in shape.primary_key]
    searched += [column for column in shape.columns if column.name in shape.primary_key]
    if not searched:
        return
    conditions = [_column_condition(column, matcher) for column in searched]
    relation = sql.Identifier(shape.schema, shape.table)
    counts = sql.SQL(", ").join(
        sql.SQL("count(*) FILTER (WHERE {})").format(condition) for condition in conditions
    )
    where = sql.SQL(" OR ").join(conditions)
    # One pass: the rows, the rows holding the marker, and per column the rows it is in.
    cursor = await conn.execute(
        sql.SQL("SELECT count(*), count(*) FILTER (WHERE {}), {} FROM {}").format(
            where, counts, relation
        )
    )
    row = await cursor.fetchone()
    assert row is not None
    report.source("postgres").items += int(row[0])
    if not row[1]:
        return
    columns = tuple(column.name for column, hits in zip(searched, row[2:], strict=True) if hits)
    cursor = await conn.execute(
        sql.SQL("SELECT {} FROM {} WHERE {} LIMIT 5").format(_ids(shape), relation, where)
    )
    _report(report, PlaceKind.TABLE, shape, columns, int(row[1]), await cursor.fetchall())


def _ids(shape: TableShape) -> sql.Composable:
    if not shape.primary_key:
        return sql.SQL("ctid::text")
    return sql.SQL(", ").join(
        sql.SQL("{}::text").format(sql.Identifier(c)) for c in shape.primary_key
    )


def _report(
    report: Report,
    kind: PlaceKind,
    shape: TableShape,
    columns: tuple[str, ...],
    count: int,
    rows: Sequence[Sequence[object]],
) -> None:
    examples = [_example(shape, values) for values in rows]
    report.add(Hit(kind, shape.name, examples[0], columns), count=count)
    for example in examples[1:]:
        report.add(Hit(kind, shape.name, example, columns), count=0)


async def dirtyread_schema(conn: Conn) -> str | None:
    """The schema the extension's function is in (called by its qualified name: the live
    schema's search path need not hold it); None when it is not installed."""
    cursor = await conn.execute(
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
        " WHERE e.extname = %s",
        (DIRTYREAD,),
    )
    row = await cursor.fetchone()
    return str(row[0]) if row else None


async def scan_dead_tuples(
    conn: Conn, shape: TableShape, matcher: Matcher, report: Report, dirtyread: str
) -> None:
    """The table's tuples that the snapshot does not see (deleted, superseded, or left by an
    aborted insert) and that hold the marker: what a vacuum has not removed yet."""
    searched = [column for column in shape.columns if column.name not in shape.primary_key]
    searched += [column for column in shape.columns if column.name in shape.primary_key]
    if not searched:
        return
    conditions = [_column_condition(column, matcher) for column in searched]
    definitions = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(column.name), sql.SQL(column.type))
        for column in searched
    )
    dead = sql.SQL(
        "{function}({relation}::regclass) AS t(ctid tid, {definitions})"
        " WHERE NOT EXISTS (SELECT 1 FROM {table} l WHERE l.ctid = t.ctid)"
    ).format(
        function=sql.Identifier(dirtyread, DIRTYREAD),
        relation=sql.Literal(f"{_quoted(shape.schema)}.{_quoted(shape.table)}"),
        definitions=definitions,
        table=sql.Identifier(shape.schema, shape.table),
    )
    counts = sql.SQL(", ").join(
        sql.SQL("count(*) FILTER (WHERE {})").format(condition) for condition in conditions
    )
    where = sql.SQL(" OR ").join(conditions)
    cursor = await conn.execute(
        sql.SQL("SELECT count(*), count(*) FILTER (WHERE {}), {} FROM {}").format(
            where, counts, dead
        )
    )
    row = await cursor.fetchone()
    assert row is not None
    report.source("postgres").items += int(row[0])
    if not row[1]:
        return
    columns = tuple(column.name for column, hits in zip(searched, row[2:], strict=True) if hits)
    ids = sql.SQL("t.ctid::text") if not shape.primary_key else _ids(shape)
    cursor = await conn.execute(
        sql.SQL("SELECT {} FROM {} AND ({}) LIMIT 5").format(ids, dead, where)
    )
    _report(report, PlaceKind.DEAD_TUPLES, shape, columns, int(row[1]), await cursor.fetchall())


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _example(shape: TableShape, values: Sequence[object]) -> str:
    if not shape.primary_key:
        return f"ctid={values[0]}"
    return ", ".join(
        f"{name}={value}" for name, value in zip(shape.primary_key, values, strict=True)
    )


async def scan_postgres(
    conn: Conn, matcher: Matcher, report: Report, only: Sequence[str] = ()
) -> list[str]:
    """Scan every memproj schema (or only the schemas ``only`` names) in one snapshot; return
    the schemas scanned. The caller opened ``conn`` in a repeatable-read transaction."""
    started = time.monotonic()
    scanned = report.source("postgres")
    schemas = list(only) or await memproj_schemas(conn)
    dirtyread = await dirtyread_schema(conn)
    if dirtyread is None:
        report.error(
            "dead tuples",
            f"could not look at dead tuples: the {DIRTYREAD} extension is not installed in"
            " this database (CREATE EXTENSION pg_dirtyread, as a superuser)",
        )
    for shape in await table_shapes(conn, schemas):
        try:
            async with conn.transaction():  # a savepoint: one failing table spoils no other
                await scan_table(conn, shape, matcher, report)
                if dirtyread is not None:
                    await scan_dead_tuples(conn, shape, matcher, report, dirtyread)
        except (errors.UndefinedTable, errors.InvalidSchemaName):
            # Dropped since the catalog was read (a rebuild copy past its grace period, a
            # shadow abandoned): nothing is readable there any more, so nothing to report.
            continue
        except errors.InsufficientPrivilege as error:
            report.error(f"table {shape.name}", f"could not look at dead tuples: {error}")
        except Exception as error:  # reported; the audit goes on
            report.error(f"table {shape.name}", error)
        scanned.places += 1
    cursor = await conn.execute(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = ANY (%s) AND c.relkind IN ('r', 'm')",
        (schemas,),
    )
    row = await cursor.fetchone()
    scanned.bytes += int(row[0]) if row is not None else 0
    scanned.seconds += time.monotonic() - started
    return schemas
