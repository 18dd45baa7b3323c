"""The lifecycle of each deletion request in PostgreSQL: its per-store state (acks, deadlines,
redeliveries), its completion, its verification result and its purge; and the ledger's reports
(request details, lists, pending work per store) that operators, metrics and the CLI look at.
The one module with SQL for ``deletion_requests``, ``deletion_store_acks``, ``deletion_purges``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from projections.deletion import probes
from projections.deletion.ledger import LedgerEntry, RequestKey, RequestState
from projections.distribution import cross_tenant
from projections.sql import Conn, KeyLookups, copy_new_rows
from topics.deletion import DeletionTarget, StoreState, Tombstone

OUTCOME_ROWS = "SELECT tenant_id, deletion_id, deadline_at, completed_at FROM deletion_requests"
"""Each request's deadline and completion: the row source that the retention schedule's
receipt joins (``JOIN ({OUTCOME_ROWS}) r``) to tell erasures on time from late ones."""


async def load_states(
    conn: Conn, keys: Iterable[RequestKey], lookups: KeyLookups
) -> dict[RequestKey, RequestState]:
    wanted = sorted(set(keys))
    if not wanted:
        return {}
    requests = await lookups.fetch(
        conn,
        "SELECT r.tenant_id, r.deletion_id, r.kind, r.target_type, r.target_id,"
        " r.subject_type, r.cut_off, r.completed_at FROM deletion_requests r"
        " JOIN {keys} USING (tenant_id, deletion_id) WHERE r.tenant_id = {tenant}",
        ("tenant_id", "deletion_id"),
        wanted,
        row_factory=dict_row,
    )
    acks = await lookups.fetch(
        conn,
        "SELECT a.* FROM deletion_store_acks a"
        " JOIN {keys} USING (tenant_id, deletion_id) WHERE a.tenant_id = {tenant}",
        ("tenant_id", "deletion_id"),
        wanted,
        row_factory=dict_row,
    )
    stores: dict[RequestKey, dict[str, StoreState]] = {}
    for ack in acks:
        stores.setdefault((ack["tenant_id"], ack["deletion_id"]), {})[ack["store"]] = _store_state(
            ack
        )
    return {
        (r["tenant_id"], r["deletion_id"]): RequestState(
            tenant_id=r["tenant_id"],
            deletion_id=r["deletion_id"],
            kind=r["kind"],
            target=DeletionTarget(
                type=r["target_type"], id=r["target_id"], subject_type=r["subject_type"]
            ),
            requested_at=r["cut_off"],
            completed_at=r["completed_at"],
            stores=stores.get((r["tenant_id"], r["deletion_id"]), {}),
        )
        for r in requests
    }


def _store_state(row: Mapping[str, Any]) -> StoreState:
    return StoreState(
        status=row["status"],
        deadline_at=row["deadline_at"],
        acked_at=row["acked_at"],
        removed_count=row["removed_count"],
        attempts=row["attempts"],
        redeliveries=row["redeliveries"],
        error=row["error"],
    )


async def save_states(conn: Conn, states: Sequence[RequestState]) -> None:
    acks = [
        (ack.status, ack.acked_at, ack.removed_count, ack.attempts, ack.error, *key)
        for state in states
        for key, ack in _store_keys(state)
    ]
    completed = [(s.completed_at, s.tenant_id, s.deletion_id) for s in states if s.completed]
    async with conn.cursor() as cursor:
        if acks:
            await cursor.executemany(
                "UPDATE deletion_store_acks SET status = %s, acked_at = %s,"
                " removed_count = %s, attempts = %s, error = %s"
                " WHERE tenant_id = %s AND deletion_id = %s AND store = %s",
                acks,
            )
        if completed:
            await cursor.executemany(
                "UPDATE deletion_requests SET status = 'completed', completed_at = %s"
                " WHERE tenant_id = %s AND deletion_id = %s AND status = 'pending'",
                completed,
            )


def _store_keys(state: RequestState) -> list[tuple[tuple[str, str, str], StoreState]]:
    return [
        ((state.tenant_id, state.deletion_id, store), ack) for store, ack in state.stores.items()
    ]


async def tombstone_of(conn: Conn, tenant_id: str, deletion_id: str) -> Tombstone:
    cursor = await conn.execute(
        "SELECT tombstone FROM deletion_requests WHERE tenant_id = %s AND deletion_id = %s",
        (tenant_id, deletion_id),
    )
    row = await cursor.fetchone()
    assert row is not None
    return Tombstone.model_validate(row[0])


async def overdue(
    conn: Conn, now: datetime, redelivery_interval: timedelta
) -> list[tuple[str, str, str]]:
    """(tenant, deletion_id, store) not acknowledged by their deadline, and neither published
    nor redelivered within the last interval. Locks the rows for the caller's transaction.

    A tombstone is never redelivered sooner than one interval after the ledger recorded it:
    a request whose deadline had passed before it arrived (a backlog, an old revocation)
    would otherwise be sent twice at once, and under load every store would do each of
    those erasures twice."""
    cursor = await conn.execute(
        cross_tenant("redelivery")
        + "SELECT a.tenant_id, a.deletion_id, a.store FROM deletion_store_acks a"
        " JOIN deletion_requests r USING (tenant_id, deletion_id)"
        " WHERE a.status <> 'done' AND a.deadline_at < %s"
        " AND coalesce(a.last_redelivered_at, r.recorded_at) < %s"
        " ORDER BY a.deadline_at FOR UPDATE OF a SKIP LOCKED",
        (now, now - redelivery_interval),
    )
    return [(row[0], row[1], row[2]) for row in await cursor.fetchall()]


async def mark_redelivered(conn: Conn, rows: Sequence[tuple[str, str, str]], now: datetime) -> None:
    async with conn.cursor() as cursor:
        await cursor.executemany(
            "UPDATE deletion_store_acks SET redeliveries = redeliveries + 1,"
            " last_redelivered_at = %s WHERE tenant_id = %s AND deletion_id = %s AND store = %s",
            [(now, *row) for row in rows],
        )


async def save_verification(
    conn: Conn, tenant_id: str, deletion_id: str, result: Mapping[str, Any], now: datetime
) -> None:
    await conn.execute(
        "UPDATE deletion_requests SET verification = %s, verified_at = %s"
        " WHERE tenant_id = %s AND deletion_id = %s",
        (Jsonb(dict(result)), now, tenant_id, deletion_id),
    )
    await probes.drop_probes(conn, tenant_id, deletion_id)


# -- purge: the second milestone (projections.deletion.purge) ----------------------------------


async def completed_unscheduled(conn: Conn, limit: int = 500) -> list[Tombstone]:
    """Completed deletions whose places are not written yet, oldest first."""
    cursor = await conn.execute(
        cross_tenant("purge-schedule")
        + "SELECT tombstone FROM deletion_requests WHERE status = 'completed'"
        " AND purged_at IS NULL AND purge_due_at IS NULL ORDER BY completed_at LIMIT %s",
        (limit,),
    )
    return [Tombstone.model_validate(row[0]) for row in await cursor.fetchall()]


async def schedule_purges(
    conn: Conn,
    places: Sequence[tuple[str, str, str, Mapping[str, Any]]],
    keys: Sequence[RequestKey],
    now: datetime,
) -> None:
    """One row per (tenant, deletion, place, mark); the deletions ``keys`` are due from now."""
    async with conn.cursor() as cursor:
        if places:
            await cursor.executemany(
                "INSERT INTO deletion_purges (tenant_id, deletion_id, place, mark, due_at)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                [(t, d, place, Jsonb(dict(mark)), now) for t, d, place, mark in places],
            )
        await cursor.executemany(
            "UPDATE deletion_requests SET purge_due_at = %s"
            " WHERE tenant_id = %s AND deletion_id = %s AND purge_due_at IS NULL",
            [(now, *key) for key in keys],
        )


async def due_purges(
    conn: Conn, place: str, limit: int = 500
) -> list[tuple[Tombstone, dict[str, Any]]]:
    """The deletions not purged yet at ``place``, oldest first: tombstone and mark."""
    cursor = await conn.execute(
        cross_tenant("purge-due") + "SELECT r.tombstone, p.mark FROM deletion_purges p"
        " JOIN deletion_requests r USING (tenant_id, deletion_id)"
        " WHERE p.place = %s AND p.purged_at IS NULL ORDER BY p.due_at LIMIT %s",
        (place, limit),
    )
    return [(Tombstone.model_validate(row[0]), dict(row[1])) for row in await cursor.fetchall()]


async def mark_purged(conn: Conn, place: str, keys: Iterable[RequestKey], now: datetime) -> None:
    async with conn.cursor() as cursor:
        await cursor.executemany(
            "UPDATE deletion_purges SET purged_at = %s WHERE tenant_id = %s"
            " AND deletion_id = %s AND place = %s AND purged_at IS NULL",
            [(now, *key, place) for key in sorted(keys)],
        )


async def finish_purged(conn: Conn, now: datetime) -> list[RequestKey]:
    """Every due deletion whose places are all purged is purged now; returns them."""
    cursor = await conn.execute(
        cross_tenant("purge-finish") + "UPDATE deletion_requests r SET purged_at = %s"
        " WHERE r.purge_due_at IS NOT NULL AND r.purged_at IS NULL AND NOT EXISTS"
        " (SELECT 1 FROM deletion_purges p WHERE p.tenant_id = r.tenant_id"
        " AND p.deletion_id = r.deletion_id AND p.purged_at IS NULL)"
        " RETURNING r.tenant_id, r.deletion_id",
        (now,),
    )
    return sorted((row[0], row[1]) for row in await cursor.fetchall())


async def purge_times(
    conn: Conn, keys: Iterable[RequestKey], lookups: KeyLookups
) -> dict[RequestKey, tuple[datetime | None, dict[str, datetime]]]:
    """Per deletion: when it was purged, and when each of its places was."""
    rows = await lookups.fetch(
        conn,
        "SELECT r.tenant_id, r.deletion_id, r.purged_at, p.place, p.purged_at"
        " FROM deletion_requests r JOIN {keys} USING (tenant_id, deletion_id)"
        " LEFT JOIN deletion_purges p USING (tenant_id, deletion_id)"
        " WHERE r.tenant_id = {tenant}",
        ("tenant_id", "deletion_id"),
        keys,
    )
    times: dict[RequestKey, tuple[datetime | None, dict[str, datetime]]] = {}
    for tenant, deletion, purged_at, place, place_purged_at in rows:
        _, places = times.setdefault((tenant, deletion), (purged_at, {}))
        if place is not None and place_purged_at is not None:
            places[place] = place_purged_at
    return times


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
        cross_tenant("operator-listing")
        + "SELECT tenant_id FROM deletion_requests WHERE deletion_id = %s ORDER BY 1",
        (deletion_id,),
    )
    return [row[0] for row in await cursor.fetchall()]


async def list_requests(
    conn: Conn, tenant_id: str | None, pending_only: bool, limit: int = 100
) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            cross_tenant("operator-listing")
            + "SELECT r.tenant_id, r.deletion_id, r.kind, r.target_type, r.target_id, r.status,"
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
        cross_tenant("verification") + "SELECT tenant_id, deletion_id FROM deletion_requests"
        " WHERE status = 'completed' AND verified_at IS NULL ORDER BY completed_at LIMIT %s",
        (limit,),
    )
    return [(row[0], row[1]) for row in await cursor.fetchall()]


@dataclass(frozen=True, slots=True)
class PendingDeletions:
    count: int
    oldest_seconds: float
    overdue: int


async def pending_by_store(conn: Conn, now: datetime) -> dict[str, PendingDeletions]:
    """Per store: tombstones not yet acknowledged, the age of the oldest, and how many are past
    their deadline."""
    cursor = await conn.execute(
        cross_tenant("deletion-gauges")
        + "SELECT a.store, count(*), min(r.cut_off), count(*) FILTER (WHERE a.deadline_at < %s)"
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
        cross_tenant("deletion-gauges")
        + "SELECT p.place, count(*), min(r.cut_off) FROM deletion_purges p"
        " JOIN deletion_requests r USING (tenant_id, deletion_id)"
        " WHERE p.purged_at IS NULL GROUP BY p.place"
    )
    return {
        row[0]: Unpurged(int(row[1]), max(0.0, (now - row[2]).total_seconds()))
        for row in await cursor.fetchall()
    }


async def revoked_memories(conn: Conn) -> list[tuple[Any, ...]]:
    """Every revoked memory, as an erasure row (``coverage.erasure_row``): a revocation erases
    one memory and records no erasure index row."""
    cursor = await conn.execute(
        "SELECT tenant_id, 'memory', '', target_id, deletion_id, cut_off"
        " FROM deletion_requests WHERE kind = 'revocation'"
    )
    return list(await cursor.fetchall())


# -- recording: the requests a ledger batch decided (projections.deletion.store) -------------

REQUEST_COLUMNS = (
    "tenant_id", "deletion_id", "kind", "target_type", "target_id", "subject_type", "reason",
    "cut_off", "deadline_at", "required_stores", "status", "request_event_id", "tombstone",
)  # fmt: skip


def _request_row(e: LedgerEntry) -> tuple[Any, ...]:
    return (
        e.tenant_id, e.deletion_id, e.kind, e.target.type, e.target.id, e.target.subject_type,
        e.reason, e.cut_off, e.deadline_at, list(e.required_stores), "pending",
        e.request_event_id, e.tombstone().model_dump_json(),
    )  # fmt: skip


async def record_requests(conn: Conn, entries: Sequence[LedgerEntry]) -> None:
    """The requests and their items, pending; a request already recorded is left as it is."""
    await copy_new_rows(conn, "deletion_requests", REQUEST_COLUMNS, map(_request_row, entries))
    await copy_new_rows(
        conn,
        "deletion_items",
        ("tenant_id", "deletion_id", "item_type", "item_id", "conversation_id"),
        (
            (e.tenant_id, e.deletion_id, item.type, item.id, item.conversation_id or "")
            for e in entries
            for item in e.resolved.items()
        ),
    )


async def record_pending_acks(conn: Conn, entries: Sequence[LedgerEntry]) -> None:
    """One pending acknowledgement per required store of each request."""
    await copy_new_rows(
        conn,
        "deletion_store_acks",
        ("tenant_id", "deletion_id", "store", "status", "deadline_at"),
        (
            (e.tenant_id, e.deletion_id, store, "pending", e.deadline_at)
            for e in entries
            for store in e.required_stores
        ),
    )
