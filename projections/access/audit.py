"""The read audit (``api_read_audit``): every read's policy decision, by ids, and its
retention. Nothing here is ever given content: a row names the key, purpose, route, subject
and the ids returned and filtered."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from projections.access.policy import ReadDecision
from projections.bookkeeping import Conn


@dataclass(frozen=True, slots=True)
class AuditEntry:
    at: datetime
    key_id: str
    tenant_id: str
    actor: str
    purpose: str
    route: str
    subject: str | None
    decision: ReadDecision


async def record(conn: Conn, entry: AuditEntry) -> None:
    await conn.execute(
        "INSERT INTO api_read_audit (at, key_id, tenant_id, actor, purpose, route, subject,"
        " returned_ids, filtered_ids, decision) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            entry.at,
            entry.key_id,
            entry.tenant_id,
            entry.actor,
            entry.purpose,
            entry.route,
            entry.subject,
            list(entry.decision.returned_ids),
            list(entry.decision.filtered_ids),
            entry.decision.decision,
        ),
    )


async def trim(conn: Conn, now: datetime, retention: timedelta) -> int:
    """Delete the rows older than the retention; how many."""
    cursor = await conn.execute("DELETE FROM api_read_audit WHERE at < %s", (now - retention,))
    return cursor.rowcount
