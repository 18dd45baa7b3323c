"""Legal holds (``legal_holds``): a subject or a conversation an operator holds; retention and
expiry skip it and an erasure of it is refused while held. A hold is never deleted: its
release is a time, so that every decision can be taken again under the holds in force when
its request occurred."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from projections.conversation import store as conversation_store
from projections.deletion import store as deletion_store
from projections.deletion.ledger import HeldBy, ResolvedTarget, held_by
from projections.distribution import cross_tenant
from projections.memory import store as memory_store
from projections.sql import Conn
from topics.deletion import DeletionTarget

HoldTarget = Literal["subject", "conversation"]


@dataclass(frozen=True, slots=True)
class Hold:
    tenant_id: str
    hold_id: str
    target_type: HoldTarget
    subject_type: str  # "" unless the target is a subject
    target_id: str
    reason: str
    held_by: str
    held_at: datetime
    released_by: str | None = None
    released_at: datetime | None = None

    @property
    def window(self) -> HeldBy:
        return HeldBy(self.held_at, self.released_at, self.names())

    def names(self) -> str:
        """The hold as an error names it."""
        target = (
            f"subject {self.subject_type}:{self.target_id}"
            if self.target_type == "subject"
            else f"conversation {self.target_id}"
        )
        return f"legal hold {self.hold_id} on {target} ({self.reason}; by {self.held_by})"


_COLUMNS = (
    "tenant_id, hold_id, target_type, subject_type, target_id, reason, held_by, held_at,"
    " released_by, released_at"
)


def in_force_on(tenant: str, conversation: str, subject_type: str, subject_id: str) -> str:
    """SQL: whether a hold in force reaches the row whose tenant, conversation id and owning
    subject are the expressions given, for the queries that leave held rows out in SQL (the
    retention schedule's receipt)."""
    return (
        f"EXISTS (SELECT 1 FROM legal_holds h WHERE h.tenant_id = {tenant}"
        " AND h.released_at IS NULL AND ((h.target_type = 'conversation'"
        f" AND h.target_id = {conversation}) OR (h.target_type = 'subject'"
        f" AND h.subject_type = {subject_type} AND h.target_id = {subject_id})))"
    )


def _hold(row: Sequence[object]) -> Hold:
    return Hold(*row)  # type: ignore[arg-type]


async def add(
    conn: Conn,
    tenant_id: str,
    target_type: HoldTarget,
    target_id: str,
    subject_type: str,
    reason: str,
    by: str,
    now: datetime,
) -> Hold:
    hold = Hold(
        tenant_id,
        f"hold-{uuid.uuid4().hex[:16]}",
        target_type,
        subject_type if target_type == "subject" else "",
        target_id,
        reason,
        by,
        now,
    )
    await conn.execute(
        f"INSERT INTO legal_holds ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            hold.tenant_id,
            hold.hold_id,
            hold.target_type,
            hold.subject_type,
            hold.target_id,
            hold.reason,
            hold.held_by,
            hold.held_at,
            None,
            None,
        ),
    )
    return hold


async def release(conn: Conn, tenant_id: str, hold_id: str, by: str, now: datetime) -> Hold | None:
    """Release a hold in force (None: no such hold, or released already)."""
    cursor = await conn.execute(
        "UPDATE legal_holds SET released_by = %s, released_at = %s"
        " WHERE tenant_id = %s AND hold_id = %s AND released_at IS NULL"
        f" RETURNING {_COLUMNS}",
        (by, now, tenant_id, hold_id),
    )
    row = await cursor.fetchone()
    return None if row is None else _hold(row)


async def list_holds(
    conn: Conn, tenant_id: str | None = None, *, include_released: bool = False
) -> list[Hold]:
    cursor = await conn.execute(
        cross_tenant("operator-listing") + f"SELECT {_COLUMNS} FROM legal_holds"
        " WHERE (%(tenant)s::text IS NULL OR tenant_id = %(tenant)s)"
        " AND (%(all)s OR released_at IS NULL) ORDER BY tenant_id, held_at, hold_id",
        {"tenant": tenant_id, "all": include_released},
    )
    return [_hold(row) for row in await cursor.fetchall()]


async def on_conversations(
    conn: Conn, keys: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], list[Hold]]:
    """Per (tenant, conversation): every hold, in force or released, on the conversation or
    on the subject who owns it."""
    return await _holds_by_key(
        conn,
        keys,
        f" LEFT JOIN ({conversation_store.RETENTION_ROWS}) v"
        " ON v.tenant_id = k.t AND v.conversation_id = k.e"
        " JOIN legal_holds h ON h.tenant_id = k.t AND ("
        " (h.target_type = 'conversation' AND h.target_id = k.e)"
        " OR (h.target_type = 'subject' AND h.subject_type = v.owner_type"
        " AND h.target_id = v.owner_id))",
    )


async def on_memories(
    conn: Conn, keys: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], list[Hold]]:
    """Per (tenant, memory): every hold on the memory's subject or on the conversation its
    source points into."""
    return await _holds_by_key(
        conn,
        keys,
        f" JOIN ({memory_store.REACH_ROWS}) m ON m.tenant_id = k.t AND m.memory_id = k.e"
        " JOIN legal_holds h ON h.tenant_id = k.t AND ("
        " (h.target_type = 'conversation' AND h.target_id = m.source_conversation_id)"
        " OR (h.target_type = 'subject' AND h.subject_type = m.subject_type"
        " AND h.target_id = m.subject_id))",
    )


async def _holds_by_key(
    conn: Conn, keys: Iterable[tuple[str, str]], joins: str
) -> dict[tuple[str, str], list[Hold]]:
    """Per (tenant, entity) key: the holds ``joins`` finds for it (k.t the tenant, k.e the
    entity id); every key present, with no hold an empty list."""
    wanted = sorted(set(keys))
    found: dict[tuple[str, str], list[Hold]] = {key: [] for key in wanted}
    if not wanted:
        return found
    columns = ", ".join(f"h.{c.strip()}" for c in _COLUMNS.split(","))
    cursor = await conn.execute(
        f"SELECT k.t, k.e, {columns} FROM unnest(%s::text[], %s::text[]) AS k(t, e)" + joins,
        ([t for t, _ in wanted], [e for _, e in wanted]),
    )
    for row in await cursor.fetchall():
        found[(row[0], row[1])].append(_hold(row[2:]))
    return found


async def on_subject(
    conn: Conn, tenant_id: str, subject_type: str, subject_id: str, conversations: Sequence[str]
) -> list[Hold]:
    """Every hold on the subject, or on one of the conversations its erasure covers."""
    cursor = await conn.execute(
        f"SELECT {_COLUMNS} FROM legal_holds WHERE tenant_id = %s AND ("
        " (target_type = 'subject' AND subject_type = %s AND target_id = %s)"
        " OR (target_type = 'conversation' AND target_id = ANY(%s)))",
        (tenant_id, subject_type, subject_id, list(conversations)),
    )
    return [_hold(row) for row in await cursor.fetchall()]


async def on_request(
    conn: Conn, tenant_id: str, target: DeletionTarget, resolved: ResolvedTarget
) -> list[HeldBy]:
    """Every hold (in force or released) on what an erasure of ``target`` would erase: the
    subject and the conversations it covers, the conversation and its owner, a memory's
    subject and source conversation."""
    if target.type == "subject" and target.subject_type is not None:
        found = await on_subject(
            conn, tenant_id, target.subject_type, target.id, resolved.conversations
        )
    elif target.type == "conversation":
        found = (await on_conversations(conn, [(tenant_id, target.id)]))[(tenant_id, target.id)]
    else:
        found = (await on_memories(conn, [(tenant_id, target.id)]))[(tenant_id, target.id)]
    return [hold.window for hold in found]


async def holding_request(
    conn: Conn, tenant_id: str, target: DeletionTarget, at: datetime
) -> HeldBy | None:
    """The hold that makes the ledger refuse an erasure of ``target`` requested at ``at``,
    read ahead so that the one asking is told at once (the ledger decides, and records)."""
    resolved = await deletion_store.resolve(conn, tenant_id, target)
    return held_by(await on_request(conn, tenant_id, target, resolved), at)
