"""The deletion ledger's reads: request details, lists, pending work per store, and the
blocked-read totals; what operators, metrics and the CLI look at."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from projections.bookkeeping import Conn


async def request_detail(conn: Conn, tenant_id: str, deletion_id: str) -> dict[str, Any] | None:
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            "SELECT tenant_id, deletion_id, kind, target_type, target_id, subject_type, reason,"
            " cut_off, recorded_at, deadline_at, required_stores, status, completed_at,"
            " verification, verified_at, purged_at FROM deletion_requests"
            " WHERE tenant_id = %s AND deletion_id = %s",
            (tenant_id, deletion_id),
        )
        request = await cursor.fetchone()
        if request is None:
            return None
        await cursor.execute(
            "SELECT store, status, deadline_at, acked_at, removed_count, attempts, redeliveries,"
            " last_redelivered_at, error FROM deletion_store_acks"
            " WHERE tenant_id = %s AND deletion_id = %s ORDER BY store",
            (tenant_id, deletion_id),
        )
        stores = {row.pop("store"): row for row in await cursor.fetchall()}
        await cursor.execute(
            "SELECT item_type, count(*) AS n FROM deletion_items"
            " WHERE tenant_id = %s AND deletion_id = %s GROUP BY 1 ORDER BY 1",
            (tenant_id, deletion_id),
        )
        items = {row["item_type"]: row["n"] for row in await cursor.fetchall()}
        await cursor.execute(
            "SELECT place, due_at, purged_at FROM deletion_purges"
            " WHERE tenant_id = %s AND deletion_id = %s ORDER BY place",
            (tenant_id, deletion_id),
        )
        purge = {row.pop("place"): row for row in await cursor.fetchall()}
    requested = request["cut_off"]
    for state in stores.values():
        if state["acked_at"] is not None:
            state["seconds_to_ack"] = (state["acked_at"] - requested).total_seconds()
    for place, state in purge.items():
        if state["purged_at"] is not None:
            state["seconds_to_purge"] = (state["purged_at"] - requested).total_seconds()
        if place in stores:
            stores[place]["purged_at"] = state["purged_at"]
    if request["completed_at"] is not None:
        request["seconds_to_complete"] = (request["completed_at"] - requested).total_seconds()
    if request["purged_at"] is not None:
        request["seconds_to_purge"] = (request["purged_at"] - requested).total_seconds()
    return {**request, "items": items, "stores": stores, "purge": purge}


async def tenants_of(conn: Conn, deletion_id: str) -> list[str]:
    cursor = await conn.execute(
        "SELECT tenant_id FROM deletion_requests WHERE deletion_id = %s ORDER BY 1", (deletion_id,)
    )
    return [row[0] for row in await cursor.fetchall()]


async def list_requests(
    conn: Conn, tenant_id: str | None, pending_only: bool, limit: int = 100
) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            "SELECT r.tenant_id, r.deletion_id, r.kind, r.target_type, r.target_id, r.status,"
            " r.cut_off, r.deadline_at, r.completed_at, r.verified_at,"
            " coalesce(array_agg(a.store ORDER BY a.store)"
            "   FILTER (WHERE a.status <> 'done'), '{}') AS waiting_for"
            " FROM deletion_requests r JOIN deletion_store_acks a USING (tenant_id, deletion_id)"
            " WHERE (%(tenant)s::text IS NULL OR r.tenant_id = %(tenant)s)"
            " AND (NOT %(pending)s OR r.status = 'pending')"
            " GROUP BY r.tenant_id, r.deletion_id ORDER BY r.cut_off DESC LIMIT %(limit)s",
            {"tenant": tenant_id, "pending": pending_only, "limit": limit},
        )
        return list(await cursor.fetchall())


async def unverified(conn: Conn, limit: int = 20) -> list[tuple[str, str]]:
    cursor = await conn.execute(
        "SELECT tenant_id, deletion_id FROM deletion_requests"
        " WHERE status = 'completed' AND verified_at IS NULL ORDER BY completed_at LIMIT %s",
        (limit,),
    )
    return [(row[0], row[1]) for row in await cursor.fetchall()]


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


@dataclass(frozen=True, slots=True)
class PendingDeletions:
    count: int
    oldest_seconds: float
    overdue: int


async def pending_by_store(conn: Conn, now: datetime) -> dict[str, PendingDeletions]:
    """Per store: tombstones not yet acknowledged, the age of the oldest, and how many are past
    their deadline."""
    cursor = await conn.execute(
        "SELECT a.store, count(*), min(r.cut_off), count(*) FILTER (WHERE a.deadline_at < %s)"
        " FROM deletion_store_acks a JOIN deletion_requests r USING (tenant_id, deletion_id)"
        " WHERE a.status <> 'done' GROUP BY a.store",
        (now,),
    )
    return {
        row[0]: PendingDeletions(int(row[1]), max(0.0, (now - row[2]).total_seconds()), int(row[3]))
        for row in await cursor.fetchall()
    }


@dataclass(frozen=True, slots=True)
class Unpurged:
    count: int
    oldest_seconds: float


async def unpurged_by_place(conn: Conn, now: datetime) -> dict[str, Unpurged]:
    """Per place a copy can remain: completed deletions not purged there yet, and the age of
    the oldest (since its request)."""
    cursor = await conn.execute(
        "SELECT p.place, count(*), min(r.cut_off) FROM deletion_purges p"
        " JOIN deletion_requests r USING (tenant_id, deletion_id)"
        " WHERE p.purged_at IS NULL GROUP BY p.place"
    )
    return {
        row[0]: Unpurged(int(row[1]), max(0.0, (now - row[2]).total_seconds()))
        for row in await cursor.fetchall()
    }


async def refusal(conn: Conn, tenant_id: str, deletion_id: str) -> str | None:
    """Why the ledger refused request ``deletion_id`` under a legal hold (None: it did not)."""
    cursor = await conn.execute(
        "SELECT details FROM rejections WHERE projection = 'deletion' AND tenant_id = %s"
        " AND entity_id = %s AND reason = 'legal_hold' ORDER BY id DESC LIMIT 1",
        (tenant_id, deletion_id),
    )
    row = await cursor.fetchone()
    return None if row is None else str(row[0])
