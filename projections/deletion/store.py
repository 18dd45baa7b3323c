"""PostgreSQL side of deletion: resolving a target into its items, recording ledger entries,
and erasing authoritative rows (the tenant locks and the erasure index are in ``guard``, the
probe vectors in ``probes``, a request's lifecycle afterwards in ``lifecycle``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from projections import rebuilds
from projections.access import audit as read_audit
from projections.access import pauses
from projections.admission import flags as evidence_flags
from projections.bookkeeping import Conn, copy_new_rows, remove_pending_messages
from projections.deadletters import keys as letter_key_store
from projections.deletion import coverage, guard
from projections.deletion.ledger import LedgerEntry, ResolvedTarget
from projections.embeddings.embedder import memory_text, message_text
from projections.sealing.keys import shred
from topics.deletion import DeletionTarget
from topics.registry import MEMORY_CURRENT


async def _column(conn: Conn, query: str, params: Sequence[Any]) -> list[Any]:
    cursor = await conn.execute(query.encode(), params)
    return [row[0] if len(row) == 1 else tuple(row) for row in await cursor.fetchall()]


async def resolve(conn: Conn, tenant_id: str, target: DeletionTarget) -> ResolvedTarget:
    """Everything the target covers: for a subject, its memories and the conversations it owns;
    for a conversation, its messages, summaries and context view; for both, the memories
    whose source points into those conversations."""
    if target.type == "memory":
        return ResolvedTarget(memories=(target.id,))
    if target.type == "subject":
        owner = (tenant_id, target.subject_type, target.id)
        conversations = await _column(
            conn,
            "SELECT conversation_id FROM conversations"
            " WHERE tenant_id = %s AND owner_type = %s AND owner_id = %s ORDER BY 1",
            owner,
        )
        about = await _column(
            conn,
            "SELECT memory_id FROM memories"
            " WHERE tenant_id = %s AND subject_type = %s AND subject_id = %s",
            owner,
        )
    else:
        conversations, about = [target.id], []
    derived = await _column(
        conn,
        "SELECT memory_id FROM memories WHERE tenant_id = %s AND source_conversation_id = ANY(%s)",
        (tenant_id, conversations),
    )
    scope = (tenant_id, conversations)
    return ResolvedTarget(
        memories=tuple(sorted({*about, *derived})),
        conversations=tuple(conversations),
        messages=tuple(
            await _column(
                conn,
                "SELECT conversation_id, message_id FROM conversation_messages"
                " WHERE tenant_id = %s AND conversation_id = ANY(%s) ORDER BY 1, seq",
                scope,
            )
        ),
        summaries=tuple(
            await _column(
                conn,
                "SELECT conversation_id, summary_version FROM conversation_summaries"
                " WHERE tenant_id = %s AND conversation_id = ANY(%s) ORDER BY 1, 2",
                scope,
            )
        ),
        contexts=tuple(
            await _column(
                conn,
                "SELECT conversation_id FROM conversation_context"
                " WHERE tenant_id = %s AND conversation_id = ANY(%s) ORDER BY 1",
                scope,
            )
        ),
    )


async def probe_texts(conn: Conn, entry: LedgerEntry) -> list[tuple[str, str, str]]:
    """The text of every erased memory and message, read before it is erased, so that the
    verification probe can later search the vector store for it. Returned, never stored."""
    tenant = entry.tenant_id
    memories = await _column(
        conn,
        "SELECT memory_id, kind, value FROM memories WHERE tenant_id = %s AND memory_id = ANY(%s)",
        (tenant, list(entry.resolved.memories)),
    )
    messages = await _column(
        conn,
        "SELECT conversation_id || '/' || message_id, content FROM conversation_messages"
        " WHERE tenant_id = %s AND conversation_id = ANY(%s)",
        (tenant, list(entry.resolved.conversations)),
    )

    return [
        ("memory", memory_id, memory_text(value, kind)) for memory_id, kind, value in memories
    ] + [("message", message_id, message_text(content)) for message_id, content in messages]


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


async def record_entries(conn: Conn, entries: Sequence[LedgerEntry]) -> None:
    """The requests, their items, the erasure index rows and one pending ack per store.
    Idempotent: a rebuild that replays a revocation finds its entry already recorded."""
    if not entries:
        return
    await copy_new_rows(
        conn,
        "deletion_requests",
        REQUEST_COLUMNS,
        map(_request_row, entries),
    )
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
    await guard.record_erasures(
        conn, ((key, e.cut_off, e.deletion_id) for e in entries for key in e.erased)
    )
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


async def erase(conn: Conn, entry: LedgerEntry) -> None:
    """Remove the entry's items from the authoritative projections. Summaries and context
    views are derived stores: their own workers remove them when the tombstone arrives."""
    tenant = entry.tenant_id
    memories = list(entry.resolved.memories)
    conversations = list(entry.resolved.conversations)
    # Memories that cited what goes are flagged, before it goes.
    await evidence_flags.flag_erased_evidence(
        conn, tenant, entry.deletion_id, memories, conversations
    )
    await evidence_flags.forget_memories(conn, tenant, memories)
    await conn.execute(
        "DELETE FROM memories WHERE tenant_id = %s AND memory_id = ANY(%s)", (tenant, memories)
    )
    await conn.execute(
        "DELETE FROM memory_versions WHERE tenant_id = %s"
        " AND (memory_id = ANY(%s) OR source_conversation_id = ANY(%s))",
        (tenant, memories, conversations),
    )
    await conn.execute(
        "DELETE FROM conversation_messages WHERE tenant_id = %s AND conversation_id = ANY(%s)",
        (tenant, conversations),
    )
    await conn.execute(
        "DELETE FROM conversations WHERE tenant_id = %s AND conversation_id = ANY(%s)",
        (tenant, conversations),
    )
    # Crypto-shredding: the sealed log keeps the events, but no key opens them any more.
    await shred(
        conn,
        [(tenant, "memory", m) for m in memories]
        + [(tenant, "conversation", c) for c in conversations],
        entry.deletion_id,
    )
    subject = entry.target.subject()
    await conn.execute(
        "DELETE FROM rejections WHERE tenant_id = %s AND (entity_id = ANY(%s)"
        " OR (subject_type = %s AND subject_id = %s))",
        (
            tenant,
            [*memories, *conversations],
            subject.type if subject else None,
            subject.id if subject else None,
        ),
    )
    # Rebuild shadows and retired tables hold full copies: the erasure reaches them too.
    await rebuilds.erase_copies(
        conn, coverage.deletion_params(tenant, entry.deletion_id, memories, conversations)
    )
    # Dead letters naming what is erased (even malformed copies) no longer open.
    await letter_key_store.shred_dead_letters(
        conn, tenant, subject, memories, conversations, entry.deletion_id
    )
    # What was read about the erased subject, memories and conversations, and by whom.
    reads_about = [read_audit.memory_read(m) for m in memories]
    reads_about += [read_audit.conversation_read(c) for c in conversations]
    if subject is not None:
        reads_about.append(read_audit.subject_read(subject.type, subject.id))
    await read_audit.erase(conn, tenant, reads_about)
    # Why an operator paused the subject is free text about the person.
    if subject is not None:
        await pauses.erase_subject(conn, tenant, subject.type, subject.id, entry.cut_off)
    # The erased memories' values still waiting in any outbox are never published: the
    # ledger's null is the last record of their keys on memory.current (bookkeeping).
    await remove_pending_messages(conn, MEMORY_CURRENT.base_name, tenant, memories)
