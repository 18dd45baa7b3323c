"""PostgreSQL side of deletion requests: resolving a target into its items (asking the tables'
owners) and recording ledger entries. The tenant locks and the erasure index are in ``guard``,
the probe vectors in ``probes``, the erasure itself in ``erasers``, a request's lifecycle
afterwards in ``lifecycle``.
"""

from __future__ import annotations

from collections.abc import Sequence

from projections.conversation import store as conversation_store
from projections.deletion import guard, lifecycle
from projections.deletion.ledger import LedgerEntry, ResolvedTarget
from projections.embeddings.embedder import memory_text, message_text
from projections.memory import store as memory_store
from projections.sql import Conn
from topics.deletion import DeletionTarget


async def resolve(
    conn: Conn, tenant_id: str, target: DeletionTarget, *, content_only: bool = False
) -> ResolvedTarget:
    """Everything the target covers: for a subject, its memories and the conversations it owns;
    for a conversation, its messages, summaries and context view; for both, the memories
    whose source points into those conversations (``content_only``: not those)."""
    if target.type == "memory":
        return ResolvedTarget(memories=(target.id,))
    if target.type == "subject":
        owner = (target.subject_type, target.id)
        conversations = await conversation_store.conversations_owned_by(conn, tenant_id, *owner)
        about = await memory_store.memories_about(conn, tenant_id, *owner)
    else:
        conversations, about = [target.id], []
    derived = (
        []
        if content_only
        else await memory_store.memories_taken_from(conn, tenant_id, conversations)
    )
    messages, summaries, contexts = await conversation_store.held_in(conn, tenant_id, conversations)
    return ResolvedTarget(
        memories=tuple(sorted({*about, *derived})),
        conversations=tuple(conversations),
        messages=tuple(messages),
        summaries=tuple(summaries),
        contexts=tuple(contexts),
    )


async def probe_texts(conn: Conn, entry: LedgerEntry) -> list[tuple[str, str, str]]:
    """The text of every erased memory and message, read before it is erased, so that the
    verification probe can later search the vector store for it. Returned, never stored."""
    tenant = entry.tenant_id
    memories = await memory_store.memory_values(conn, tenant, entry.resolved.memories)
    messages = await conversation_store.message_contents(conn, tenant, entry.resolved.conversations)
    return [
        ("memory", memory_id, memory_text(value, kind)) for memory_id, kind, value in memories
    ] + [("message", message_id, message_text(content)) for message_id, content in messages]


async def record_entries(conn: Conn, entries: Sequence[LedgerEntry]) -> None:
    """The requests, their items, the erasure index rows and one pending ack per store.
    Idempotent: a rebuild that replays a revocation finds its entry already recorded."""
    if not entries:
        return
    await lifecycle.record_requests(conn, entries)
    await guard.record_erasures(
        conn, ((key, e.cut_off, e.deletion_id) for e in entries for key in e.erased)
    )
    await lifecycle.record_pending_acks(conn, entries)
