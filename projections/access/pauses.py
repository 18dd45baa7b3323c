"""Subject pause (``subject_pauses``, ``subject_pause_log``): an operator stops every read path
from serving one subject's memories and the conversations it owns, while the workers keep
applying its events. The recovery runbook's first step.

PostgreSQL is the truth, and there is no cache of it: every read asks ``check_serving`` in
the connection it reads the projection with, so a pause holds for every read, in every
process and API replica, that begins after ``pause`` commits, and a resume likewise
(ops/decisions/subject-pause.md measures the cost of asking each time). A read that began
before the commit may still answer once.

The log records who paused or resumed which subject, when and why. The subject is named by
its ids (pseudonymous, as everywhere in memproj); the reason is an operator's free text that
may name the person, so it is stored with credentials masked (``redaction.redact_text``) and
replaced by ``ERASED_REASON`` when the subject is erased (``erase_subject``). A pause row
holds ids, the operator and a time only: an erasure leaves it in force (what the subject
writes after the erasure stays unserved until an operator resumes it, never by accident).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from psycopg.rows import dict_row

from projections.deletion.erasure import ErasureScope
from projections.distribution import cross_tenant
from projections.redaction import redact_text
from projections.sql import Conn

Action = Literal["pause", "resume"]

ERASED_REASON = "[erased with the subject]"
REASON_MAX_LENGTH = 2000


class SubjectPaused(Exception):
    """A read asked for a paused subject's memories or conversations (the API's 423)."""

    code = "subject_paused"

    def __init__(self, tenant_id: str, subject_type: str, subject_id: str) -> None:
        self.tenant_id = tenant_id
        self.subject_type = subject_type
        self.subject_id = subject_id
        self.message = (
            f"subject {subject_type}:{subject_id} is paused by an operator: its memories and"
            " conversations are not served until it is resumed"
        )
        super().__init__(self.message)


@dataclass(frozen=True, slots=True)
class Pause:
    tenant_id: str
    subject_type: str
    subject_id: str
    paused_at: datetime
    paused_by: str


@dataclass(frozen=True, slots=True)
class LogEntry:
    at: datetime
    tenant_id: str
    subject_type: str
    subject_id: str
    action: Action
    operator: str
    reason: str
    reason_erased_at: datetime | None


def stored_reason(reason: str) -> str:
    """The reason as the log keeps it: credentials masked, bounded in length."""
    return redact_text(reason.strip(), Counter())[:REASON_MAX_LENGTH]


def _pause(row: dict[str, Any]) -> Pause:
    return Pause(
        row["tenant_id"], row["subject_type"], row["subject_id"], row["paused_at"], row["paused_by"]
    )


async def _log(
    conn: Conn,
    at: datetime,
    tenant_id: str,
    subject: tuple[str, str],
    action: Action,
    operator: str,
    reason: str,
) -> None:
    await conn.execute(
        "INSERT INTO subject_pause_log"
        " (at, tenant_id, subject_type, subject_id, action, operator, reason)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s)",
        (at, tenant_id, subject[0], subject[1], action, operator, stored_reason(reason)),
    )


async def pause(
    conn: Conn, tenant_id: str, subject: tuple[str, str], operator: str, reason: str, now: datetime
) -> Pause | None:
    """Pause a subject and log it, in the caller's transaction; None if it was paused
    already (nothing is changed or logged: the first pause stands)."""
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            "INSERT INTO subject_pauses (tenant_id, subject_type, subject_id, paused_at, paused_by)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
            " RETURNING tenant_id, subject_type, subject_id, paused_at, paused_by",
            (tenant_id, subject[0], subject[1], now, operator),
        )
        row = await cursor.fetchone()
    if row is None:
        return None
    await _log(conn, now, tenant_id, subject, "pause", operator, reason)
    return _pause(row)


async def resume(
    conn: Conn, tenant_id: str, subject: tuple[str, str], operator: str, reason: str, now: datetime
) -> bool:
    """Resume a paused subject and log it, in the caller's transaction; False if it was not
    paused (nothing is logged)."""
    cursor = await conn.execute(
        "DELETE FROM subject_pauses WHERE tenant_id = %s AND subject_type = %s AND subject_id = %s",
        (tenant_id, subject[0], subject[1]),
    )
    if cursor.rowcount == 0:
        return False
    await _log(conn, now, tenant_id, subject, "resume", operator, reason)
    return True


async def is_paused(conn: Conn, tenant_id: str, subject_type: str, subject_id: str) -> bool:
    cursor = await conn.execute(
        "SELECT 1 FROM subject_pauses"
        " WHERE tenant_id = %s AND subject_type = %s AND subject_id = %s",
        (tenant_id, subject_type, subject_id),
    )
    return await cursor.fetchone() is not None


async def check_serving(conn: Conn, tenant_id: str, subject_type: str, subject_id: str) -> None:
    """Raise ``SubjectPaused`` if the subject is paused: every read path asks before it
    serves a subject's memories or a conversation it owns."""
    if await is_paused(conn, tenant_id, subject_type, subject_id):
        raise SubjectPaused(tenant_id, subject_type, subject_id)


async def list_pauses(conn: Conn, tenant_id: str | None = None) -> list[Pause]:
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            cross_tenant("operator-listing")
            + "SELECT tenant_id, subject_type, subject_id, paused_at, paused_by FROM subject_pauses"
            " WHERE %(tenant)s::text IS NULL OR tenant_id = %(tenant)s"
            " ORDER BY tenant_id, paused_at, subject_type, subject_id",
            {"tenant": tenant_id},
        )
        return [_pause(row) for row in await cursor.fetchall()]


async def log_of(
    conn: Conn, tenant_id: str, subject: tuple[str, str] | None = None
) -> list[LogEntry]:
    """The pause log of a tenant, or of one of its subjects, oldest first."""
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            "SELECT at, tenant_id, subject_type, subject_id, action, operator, reason,"
            " reason_erased_at FROM subject_pause_log WHERE tenant_id = %(tenant)s"
            " AND (%(type)s::text IS NULL OR (subject_type = %(type)s AND subject_id = %(id)s))"
            " ORDER BY at, id",
            {
                "tenant": tenant_id,
                "type": subject[0] if subject else None,
                "id": subject[1] if subject else None,
            },
        )
        return [LogEntry(**row) for row in await cursor.fetchall()]


async def erase_subject(
    conn: Conn, tenant_id: str, subject_type: str, subject_id: str, now: datetime
) -> None:
    """An erased subject: the log's reasons about it are replaced by ``ERASED_REASON``; who
    acted, on which ids and when stay, and so does a pause in force (ids only)."""
    await conn.execute(
        "UPDATE subject_pause_log SET reason = %s, reason_erased_at = %s"
        " WHERE tenant_id = %s AND subject_type = %s AND subject_id = %s"
        " AND reason_erased_at IS NULL",
        (ERASED_REASON, now, tenant_id, subject_type, subject_id),
    )


async def erase(conn: Conn, scope: ErasureScope) -> None:
    """Why an operator paused an erased subject is free text about the person."""
    if scope.subject is not None:
        await erase_subject(
            conn, scope.tenant_id, scope.subject.type, scope.subject.id, scope.cut_off
        )
