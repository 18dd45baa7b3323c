"""PostgreSQL side of deletion: tenant locks, the erasure index, resolving a target into its
items, recording ledger entries and probes, and erasing authoritative rows (a request's
lifecycle afterwards is in ``lifecycle``).

Consistency with the projections rests on one lock per tenant: a deletion takes it
exclusively for its transaction; every projection batch, index update and cache fill takes it
shared before it writes, and reads the erasure index under it: most before they read anything,
the memory stage's batches after a first read without it, re-read under it (``read_erasures``,
``erasures_changed``: the batch is read and reduced again if an erasure of its keys was
recorded since). A write either commits before the deletion (and the deletion then removes
it) or sees the erasure (and is refused).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from projections import rebuilds
from projections.access import audit as read_audit
from projections.access import pauses
from projections.admission import flags as evidence_flags
from projections.bookkeeping import (
    Conn,
    copy_new_rows,
    copy_rows,
    keyset,
    keyset_param,
    remove_pending_messages,
)
from projections.deadletters import keys as letter_key_store
from projections.deletion import coverage
from projections.deletion.erasure import (
    EntityKey,
    ErasureIndex,
    ErasureRow,
    erasure_row,
    latest_erasures,
)
from projections.deletion.ledger import (
    LedgerEntry,
    ResolvedTarget,
)
from projections.embeddings.embedder import memory_text, message_text
from projections.sealing.fields import SOURCE_KEY_ENTITY
from projections.sealing.keys import shred
from projections.sealing.probes import ProbeSealer
from topics.deletion import DeletionTarget
from topics.registry import MEMORY_CURRENT


async def lock_tenants(conn: Conn, tenants: Iterable[str], *, exclusive: bool) -> None:
    """Take the tenant locks for this transaction, in a fixed order (no deadlocks).

    Exclusive tenant locks are taken to erase, so they come after the erasures lock, shared:
    a rebuild's swap holds that one exclusively while it sweeps and swaps.
    """
    ordered = sorted(set(tenants))
    if not ordered:
        return
    if exclusive:
        await conn.execute(
            "SELECT pg_advisory_xact_lock_shared(hashtextextended(%s, 0))", (_ERASURES_LOCK,)
        )
    function = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
    await conn.execute(
        f"SELECT {function}(hashtextextended('memproj:tenant:' || t, 0))"
        " FROM unnest(%s::text[]) WITH ORDINALITY AS x(t, n) ORDER BY n",
        (ordered,),
    )


async def try_lock_tenants_shared(conn: Conn, tenants: Iterable[str]) -> bool:
    """Take the shared tenant locks for this transaction if every one is free now (no
    deletion of these tenants holds or awaits its exclusive lock); False, with some perhaps
    taken, if not: the caller rolls back."""
    ordered = sorted(set(tenants))
    if not ordered:
        return True
    cursor = await conn.execute(
        "SELECT bool_and(pg_try_advisory_xact_lock_shared("
        "hashtextextended('memproj:tenant:' || t, 0))) FROM unnest(%s::text[]) AS x(t)",
        (ordered,),
    )
    row = await cursor.fetchone()
    return bool(row and row[0])


_ERASURES_LOCK = "memproj:erasures"


async def hold_erasures(conn: Conn) -> None:
    """Until this transaction ends, no erasure commits: one that committed before is visible
    to whatever this transaction reads next, and one that starts waits. A rebuild's swap
    takes it so that its sweep of erased items and the swap see the same erasures."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (_ERASURES_LOCK,))


@dataclass(frozen=True, slots=True)
class ErasuresRead:
    """What one read of the erasure index found for a batch's keys: every row, so that a
    read of the same keys later tells whether an erasure was recorded (or forgotten) since."""

    keys: tuple[EntityKey, ...] = ()
    rows: frozenset[ErasureRow] = frozenset()

    @property
    def index(self) -> ErasureIndex:
        return ErasureIndex(latest_erasures(self.rows))


async def read_erasures(conn: Conn, keys: Iterable[EntityKey]) -> ErasuresRead:
    wanted = tuple(sorted(set(keys)))
    if not wanted:
        return ErasuresRead()
    return ErasuresRead(wanted, await _erasure_rows(conn, wanted))


async def erasures_changed(conn: Conn, read: ErasuresRead) -> bool:
    """Whether an erasure of ``read``'s keys was recorded or forgotten since ``read``."""
    if not read.keys:
        return False
    return await _erasure_rows(conn, read.keys) != read.rows


async def _erasure_rows(conn: Conn, wanted: Sequence[EntityKey]) -> frozenset[ErasureRow]:
    cursor = await conn.execute(
        "SELECT e.tenant_id, e.entity_type, e.subject_type, e.entity_id, e.deletion_id, e.cut_off"
        " FROM erased_entities e"
        f" JOIN {keyset('tenant_id', 'entity_type', 'subject_type', 'entity_id')}"
        " USING (tenant_id, entity_type, subject_type, entity_id)",
        (keyset_param(wanted),),
    )
    return frozenset(erasure_row(row) for row in await cursor.fetchall())


async def load_erasures(conn: Conn, keys: Iterable[EntityKey]) -> ErasureIndex:
    return (await read_erasures(conn, keys)).index


async def _column(conn: Conn, query: str, params: Sequence[Any]) -> list[Any]:
    cursor = await conn.execute(query.encode(), params)
    return [row[0] if len(row) == 1 else tuple(row) for row in await cursor.fetchall()]


async def resolve(
    conn: Conn, tenant_id: str, target: DeletionTarget, *, content_only: bool = False
) -> ResolvedTarget:
    """Everything the target covers: for a subject, its memories and the conversations it owns;
    for a conversation, its messages, summaries and context view; for both, the memories
    whose source points into those conversations (``content_only``: not those)."""
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
    derived = (
        []
        if content_only
        else await _column(
            conn,
            "SELECT memory_id FROM memories"
            " WHERE tenant_id = %s AND source_conversation_id = ANY(%s)",
            (tenant_id, conversations),
        )
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
    await copy_new_rows(
        conn,
        "erased_entities",
        ("tenant_id", "entity_type", "subject_type", "entity_id", "cut_off", "deletion_id"),
        ((*key, e.cut_off, e.deletion_id) for e in entries for key in e.erased),
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


async def record_probes(
    conn: Conn,
    entry: LedgerEntry,
    vectors: Sequence[tuple[str, str, Sequence[float]]],
    probes: ProbeSealer,
) -> None:
    """The probe vectors, sealed (``ProbeSealer``): nothing stored lets anyone without the
    master key test a guess of the erased words against them."""
    tenant, deletion = entry.tenant_id, entry.deletion_id
    await copy_rows(
        conn,
        "deletion_probes",
        ("tenant_id", "deletion_id", "item_type", "item_id", "sealed_vector"),
        ((tenant, deletion, t, i, probes.seal(tenant, deletion, t, i, v)) for t, i, v in vectors),
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
    # A content erasure leaves the memories taken from its conversations, history included.
    sources = [] if entry.scope == "content" else conversations
    await conn.execute(
        "DELETE FROM memories WHERE tenant_id = %s AND memory_id = ANY(%s)", (tenant, memories)
    )
    await conn.execute(
        "DELETE FROM memory_versions WHERE tenant_id = %s"
        " AND (memory_id = ANY(%s) OR source_conversation_id = ANY(%s))",
        (tenant, memories, sources),
    )
    await conn.execute(
        "DELETE FROM conversation_messages WHERE tenant_id = %s AND conversation_id = ANY(%s)",
        (tenant, conversations),
    )
    await conn.execute(
        "DELETE FROM conversations WHERE tenant_id = %s AND conversation_id = ANY(%s)",
        (tenant, conversations),
    )
    # Crypto-shredding: the sealed log keeps the events, but no key opens them any more. A
    # content erasure leaves the source keys: the values of the memories taken from the
    # conversation are sealed under them (``projections.sealing.fields``, format 4).
    await shred(
        conn,
        [(tenant, "memory", m) for m in memories]
        + [(tenant, "conversation", c) for c in conversations]
        + [(tenant, SOURCE_KEY_ENTITY, c) for c in sources],
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
        conn,
        coverage.deletion_params(
            tenant, entry.deletion_id, memories, conversations, sources=sources
        ),
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


async def load_probes(
    conn: Conn, tenant_id: str, deletion_id: str, probes: ProbeSealer
) -> list[tuple[str, str, list[float]]]:
    """The probe vectors, opened. A plaintext ``vector`` is one written before migration 008
    (or by a worker of the release before it): read as it is, deleted like the others."""
    cursor = await conn.execute(
        "SELECT item_type, item_id, sealed_vector, vector FROM deletion_probes"
        " WHERE tenant_id = %s AND deletion_id = %s",
        (tenant_id, deletion_id),
    )
    return [
        (
            item_type,
            item_id,
            list(vector)
            if sealed is None
            else probes.open(tenant_id, deletion_id, item_type, item_id, bytes(sealed)),
        )
        for item_type, item_id, sealed, vector in await cursor.fetchall()
    ]
