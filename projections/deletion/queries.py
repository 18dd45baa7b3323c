"""The blocked-read totals: how many reads the erasure guard dropped per store (the owner of
``ghost_reads_blocked``; the deletion ledger's own reports are in ``lifecycle.py``)."""

from __future__ import annotations

from projections.sql import Conn


async def count_blocked_read(conn: Conn, store: str, count: int) -> None:
    if count:
        await conn.execute(
            "INSERT INTO ghost_reads_blocked (store, blocked) VALUES (%s, %s)"
            " ON CONFLICT (store) DO UPDATE SET blocked = ghost_reads_blocked.blocked + %s",
            (store, count, count),
        )


async def blocked_reads(conn: Conn) -> dict[str, int]:
    cursor = await conn.execute("SELECT store, blocked FROM ghost_reads_blocked")
    return {row[0]: int(row[1]) for row in await cursor.fetchall()}
