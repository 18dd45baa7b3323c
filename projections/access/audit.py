"""The read audit (``api_read_audit``): every read's policy decision, by ids, and its
retention. Nothing here is ever given content: a row names the key, purpose, route, subject
and the ids returned and filtered. What a read was about is personal data about whom it was
about: an erasure deletes the rows that name what it erases (``erase_reads``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from projections.access.policy import ReadDecision
from projections.deletion.erasure import ErasureScope
from projections.distribution import cross_tenant
from projections.sql import Conn


def subject_read(subject_type: str, subject_id: str) -> str:
    """What a row names when a read was about a subject's memories."""
    return f"{subject_type}:{subject_id}"


def memory_read(memory_id: str) -> str:
    return f"memory:{memory_id}"


def conversation_read(conversation_id: str) -> str:
    return f"conversation:{conversation_id}"


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
    cursor = await conn.execute(
        cross_tenant("read-audit-trim") + "DELETE FROM api_read_audit WHERE at < %s",
        (now - retention,),
    )
    return cursor.rowcount


async def erase(conn: Conn, tenant_id: str, about: Sequence[str]) -> int:
    """Delete the rows of reads about ``about`` (``subject_read``, ``memory_read``,
    ``conversation_read``); how many."""
    cursor = await conn.execute(
        "DELETE FROM api_read_audit WHERE tenant_id = %s AND subject = ANY(%s)",
        (tenant_id, list(about)),
    )
    return cursor.rowcount


async def erase_reads(conn: Conn, scope: ErasureScope) -> None:
    """What was read about an erased subject, memories and conversations, and by whom."""
    about = [memory_read(m) for m in scope.memories]
    about += [conversation_read(c) for c in scope.conversations]
    if scope.subject is not None:
        about.append(subject_read(scope.subject.type, scope.subject.id))
    await erase(conn, scope.tenant_id, about)
