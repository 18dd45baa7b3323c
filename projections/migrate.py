"""Schema migrations, applied by every worker at start (and by ``memproj db migrate``).

Migrations are the numbered SQL files beside this module, applied in order, each in its own
transaction. An advisory lock serialises workers that start at the same time.
"""

from __future__ import annotations

from importlib import resources

import psycopg

MIGRATION_LOCK = 0x6D656D70  # "memp"


def available() -> list[tuple[int, str, str]]:
    folder = resources.files("projections") / "migrations"
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            number = int(entry.name.split("_", 1)[0])
            found.append((number, entry.name, entry.read_text()))
    return sorted(found)


async def migrate(conn: psycopg.AsyncConnection[object]) -> list[str]:
    """Apply the migrations not applied yet; return their names."""
    applied_now = []
    await conn.set_autocommit(True)
    try:
        await conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        cursor = await conn.execute("SELECT version FROM schema_migrations")
        done = {row[0] for row in await cursor.fetchall()}  # type: ignore[index]
        for number, name, sql in available():
            if number in done:
                continue
            async with conn.transaction():
                await conn.execute(sql.encode())
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (number, name)
                )
            applied_now.append(name)
    finally:
        await conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
        await conn.set_autocommit(False)
    return applied_now
