"""The ``rejections`` table: every event a projection refused, with its reason, where it
came from and whom it was about (so that an erasure can remove it too)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from projections.deletion.erasure import ErasureScope
from projections.sql import Conn, copy_rows
from topics.outputs import Rejection


@dataclass(frozen=True, slots=True)
class RejectionRow:
    rejection: Rejection
    topic: str
    partition: int
    offset: int


async def record_rejections(conn: Conn, projection: str, rows: Sequence[RejectionRow]) -> None:
    if not rows:  # most batches: two round trips saved
        return
    columns = (
        "projection", "tenant_id", "entity_id", "subject_type", "subject_id", "event_id",
        "event_type", "reason", "details", "occurred_at", "topic", "partition", '"offset"',
    )  # fmt: skip
    await copy_rows(
        conn,
        "rejections",
        columns,
        (
            (
                projection,
                row.rejection.tenant_id,
                row.rejection.entity_id,
                row.rejection.subject.type if row.rejection.subject else None,
                row.rejection.subject.id if row.rejection.subject else None,
                row.rejection.event_id,
                row.rejection.event_type,
                row.rejection.reason.value,
                row.rejection.details,
                row.rejection.occurred_at,
                row.topic,
                row.partition,
                row.offset,
            )
            for row in rows
        ),
    )


async def rejection_counts(conn: Conn, projection: str) -> dict[str, int]:
    """How many of the projection's events were rejected, by reason."""
    cursor = await conn.execute(
        "SELECT reason, count(*) FROM rejections WHERE projection = %s GROUP BY 1 ORDER BY 1",
        (projection,),
    )
    return {str(reason): int(count) for reason, count in await cursor.fetchall()}


async def erase_rejections(conn: Conn, scope: ErasureScope) -> None:
    """The rejections of events about what an erasure covers: its memories, conversations
    and subject."""
    subject = scope.subject
    await conn.execute(
        "DELETE FROM rejections WHERE tenant_id = %s AND (entity_id = ANY(%s)"
        " OR (subject_type = %s AND subject_id = %s))",
        (
            scope.tenant_id,
            [*scope.memories, *scope.conversations],
            subject.type if subject else None,
            subject.id if subject else None,
        ),
    )


async def legal_hold_refusal(conn: Conn, tenant_id: str, deletion_id: str) -> str | None:
    """Why the ledger refused request ``deletion_id`` under a legal hold (None: it did not)."""
    cursor = await conn.execute(
        "SELECT details FROM rejections WHERE projection = 'deletion' AND tenant_id = %s"
        " AND entity_id = %s AND reason = 'legal_hold' ORDER BY id DESC LIMIT 1",
        (tenant_id, deletion_id),
    )
    row = await cursor.fetchone()
    return None if row is None else str(row[0])
