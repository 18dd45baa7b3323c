"""The schedule's reads and its memory (``retention_issued``): the conversations and memories
that may be due, the deletions issued, and the receipt.

The candidate queries only narrow the rows down (the period a class resolves to, written
in SQL so that a million kept conversations are never read); ``schedule`` decides. They are
about ``retention_issued`` (what was issued, and what is still to issue), so they live here;
the other tables' rows and rules come from their owners (the conversations' and memories'
row sources, the classes' period, the holds in force, the requests' outcomes)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from projections.conversation import store as conversation_store
from projections.deletion import lifecycle
from projections.distribution import cross_tenant
from projections.memory import store as memory_store
from projections.retention import classes, holds
from projections.retention.schedule import (
    ClassReceipt,
    ConversationDue,
    Issue,
    MemoryDue,
    Period,
)
from projections.sql import Conn

EXPIRED_MEMORIES = "expired memories"
"""The receipt's line for memories erased after their expiry (they have no class)."""

_PERIOD = classes.PERIOD
_CONVERSATIONS = f"({conversation_store.RETENTION_ROWS}) c{classes.period_joins('c')}"


def _seconds(period: Period) -> int | None:
    return None if period is None else round(period.total_seconds())


async def conversation_candidates(
    conn: Conn, now: datetime, global_default: Period, limit: int
) -> list[ConversationDue]:
    """Live conversations past their period by ``now`` whose erasure at that due time was
    not issued yet, oldest due first."""
    cursor = await conn.execute(
        cross_tenant("retention-round")
        + "SELECT tenant_id, conversation_id, retention_class, started_at, last_message_at FROM ("
        " SELECT c.*, coalesce(c.last_message_at, c.started_at)"
        f" + make_interval(secs => {_PERIOD}) AS due_at"
        f" FROM {_CONVERSATIONS}) c"
        " WHERE due_at <= %(now)s AND NOT EXISTS (SELECT 1 FROM retention_issued i"
        " WHERE i.tenant_id = c.tenant_id AND i.target_type = 'conversation'"
        " AND i.target_id = c.conversation_id AND i.due_at = c.due_at)"
        " ORDER BY due_at LIMIT %(limit)s",
        {"global": _seconds(global_default), "now": now, "limit": limit},
    )
    return [ConversationDue(*row) for row in await cursor.fetchall()]


async def memory_candidates(
    conn: Conn, now: datetime, grace: timedelta, limit: int
) -> list[MemoryDue]:
    """Live memories ``grace`` past their expiry by ``now`` whose erasure was not issued."""
    cursor = await conn.execute(
        cross_tenant("retention-round")
        + f"SELECT tenant_id, memory_id, expires_at FROM ({memory_store.REACH_ROWS}) m"
        " WHERE expires_at IS NOT NULL AND expires_at + %(grace)s <= %(now)s"
        " AND NOT EXISTS (SELECT 1 FROM retention_issued i WHERE i.tenant_id = m.tenant_id"
        " AND i.target_type = 'memory' AND i.target_id = m.memory_id"
        " AND i.due_at = m.expires_at + %(grace)s)"
        " ORDER BY expires_at LIMIT %(limit)s",
        {"grace": grace, "now": now, "limit": limit},
    )
    return [MemoryDue(*row) for row in await cursor.fetchall()]


async def record_issued(conn: Conn, issues: Sequence[Issue], now: datetime) -> set[str]:
    """Record ``issues``; the deletion ids this call recorded (an issue another replica
    recorded first is left out: that replica publishes it)."""
    recorded: set[str] = set()
    for issue in issues:
        cursor = await conn.execute(
            "INSERT INTO retention_issued (tenant_id, deletion_id, reason, target_type,"
            " target_id, retention_class, due_at, requested_at, issued_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (tenant_id, deletion_id) DO NOTHING RETURNING deletion_id",
            (
                issue.tenant_id,
                issue.deletion_id,
                issue.reason,
                issue.target_type,
                issue.target_id,
                issue.retention_class,
                issue.due_at,
                issue.requested_at,
                now,
            ),
        )
        if await cursor.fetchone() is not None:
            recorded.add(issue.deletion_id)
    return recorded


_LIVE = (
    f"SELECT c.tenant_id, c.retention_class AS class, {_PERIOD} AS period,"
    f" coalesce(c.last_message_at, c.started_at) + make_interval(secs => {_PERIOD}) AS due_at,"
    f" {holds.in_force_on('c.tenant_id', 'c.conversation_id', 'c.owner_type', 'c.owner_id')}"
    f" AS held FROM {_CONVERSATIONS}"
    " WHERE NOT EXISTS (SELECT 1 FROM retention_issued i WHERE i.tenant_id = c.tenant_id"
    " AND i.target_type = 'conversation' AND i.target_id = c.conversation_id)"
)


async def receipt(
    conn: Conn, now: datetime, global_default: Period, tenant_id: str | None = None
) -> list[ClassReceipt]:
    """Per tenant and class: live conversations inside their period, held and due; the
    erasures issued, completed by their deadline or late (or still running: due); the
    oldest overdue item. Memories erased after their expiry are the line
    ``EXPIRED_MEMORIES``."""
    params = {"global": _seconds(global_default), "now": now, "tenant": tenant_id}
    cursor = await conn.execute(
        cross_tenant("retention-receipt") + "SELECT tenant_id, class, max(period),"
        " count(*) FILTER (WHERE period IS NULL OR due_at > %(now)s) - count(*) FILTER"
        " (WHERE held AND (period IS NULL OR due_at > %(now)s)),"
        " count(*) FILTER (WHERE held),"
        " count(*) FILTER (WHERE NOT held AND due_at <= %(now)s),"
        " extract(epoch FROM %(now)s - min(due_at) FILTER (WHERE NOT held))"
        f" FROM ({_LIVE}) live WHERE %(tenant)s::text IS NULL OR tenant_id = %(tenant)s"
        " GROUP BY tenant_id, class",
        params,
    )
    lines: dict[tuple[str, str], ClassReceipt] = {}
    for tenant, name, period, inside, held, due, oldest in await cursor.fetchall():
        lines[(tenant, name)] = ClassReceipt(
            tenant, name, None if period is None else float(period), inside, held, due, 0, 0,
            max(0.0, float(oldest or 0.0)) if due else 0.0,
        )  # fmt: skip
    cursor = await conn.execute(
        cross_tenant("retention-receipt")
        + f"SELECT i.tenant_id, coalesce(i.retention_class, %(expired)s), {_PERIOD},"
        " count(*) FILTER (WHERE r.completed_at IS NOT NULL"
        " AND r.completed_at <= r.deadline_at),"
        " count(*) FILTER (WHERE r.completed_at > r.deadline_at),"
        " count(*) FILTER (WHERE r.completed_at IS NULL),"
        " extract(epoch FROM %(now)s - min(i.due_at) FILTER (WHERE r.completed_at IS NULL))"
        f" FROM retention_issued i LEFT JOIN ({lifecycle.OUTCOME_ROWS}) r"
        " ON r.tenant_id = i.tenant_id AND r.deletion_id = i.deletion_id"
        f"{classes.period_joins('i')}"
        " WHERE %(tenant)s::text IS NULL OR i.tenant_id = %(tenant)s"
        " GROUP BY 1, 2, 3",
        {**params, "expired": EXPIRED_MEMORIES},
    )
    for tenant, name, period, on_time, late, running, oldest in await cursor.fetchall():
        # The class's period now (an expired memory's line has none: its grace applies).
        configured = None if period is None or name == EXPIRED_MEMORIES else float(period)
        known = lines.get((tenant, name)) or ClassReceipt(tenant, name, configured)
        overdue = max(0.0, float(oldest or 0.0)) if running else 0.0
        lines[(tenant, name)] = ClassReceipt(
            tenant, name, known.period_seconds, known.inside_period, known.held,
            known.due + running, known.erased_on_time + on_time, known.erased_late + late,
            max(known.oldest_overdue_seconds, overdue),
        )  # fmt: skip
    return [lines[key] for key in sorted(lines)]
