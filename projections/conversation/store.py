"""PostgreSQL persistence of the conversation projection and its context view, and the reads
behind ``memproj conversation ...``. Every read takes the tenant."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, LiteralString

import orjson
from psycopg.rows import dict_row

from projections.conversation.context import (
    ContextSettings,
    NoFinishedTurns,
    StaleTurnIndex,
    TurnIndex,
    advance_context,
    new_tool_results,
    resumes,
)
from projections.conversation.reducer import (
    BatchResult,
    ConversationKey,
    ConversationRecord,
    ConversationState,
    MessageKey,
    MessageRecord,
    SummaryRecord,
)
from projections.deletion.erasure import ErasureScope
from projections.memory import store as memory_store
from projections.sql import ONE_TENANT, Conn, KeyLookups, copy_rows, staging_table
from topics.conversation import ConversationEvent, MessageAdded, SummaryUpdated

CONVERSATION_FIELDS = (
    "tenant_id", "conversation_id", "owner_type", "owner_id", "channel", "retention_class",
    "provider_conversation_ref", "started_at", "updated_at", "last_event_id", "message_count",
    "summary_version", "last_message_at",
)  # fmt: skip
MESSAGE_FIELDS = (
    "tenant_id", "conversation_id", "message_id", "seq", "role", "content", "occurred_at",
    "event_id", "redactions", "owner_type", "owner_id",
)  # fmt: skip
SUMMARY_FIELDS = (
    "tenant_id", "conversation_id", "summary_version", "text", "source_message_ids",
    "occurred_at", "event_id", "redactions", "owner_type", "owner_id",
)  # fmt: skip
CONTEXT_FIELDS = (
    "tenant_id", "conversation_id", "owner_type", "owner_id", "view", "token_estimate",
    "budget_tokens", "through_message_id", "built_at", "turn_index",
)  # fmt: skip


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


async def load_state(
    conn: Conn, events: Sequence[ConversationEvent], lookups: KeyLookups
) -> ConversationState:
    keys = {(e.tenant_id, e.conversation_id) for e in events}
    records: dict[ConversationKey, ConversationRecord] = {}
    for row in await lookups.fetch(
        conn,
        f"SELECT {', '.join(CONVERSATION_FIELDS)} FROM conversations"
        " JOIN {keys} USING (tenant_id, conversation_id)"
        " WHERE conversations.tenant_id = {tenant}",
        ("tenant_id", "conversation_id"),
        keys,
        row_factory=dict_row,
    ):
        records[(row["tenant_id"], row["conversation_id"])] = ConversationRecord(**row)
    wanted: set[MessageKey] = set()
    for event in events:
        if isinstance(event, MessageAdded):
            wanted.add((event.tenant_id, event.conversation_id, event.payload.message_id))
        elif isinstance(event, SummaryUpdated):
            wanted.update(
                (event.tenant_id, event.conversation_id, m)
                for m in event.payload.source_message_ids
            )
    known = await held_messages(conn, wanted, lookups)
    return ConversationState(records, frozenset(known))


def _message_row(m: MessageRecord) -> tuple[Any, ...]:
    return (
        m.tenant_id, m.conversation_id, m.message_id, m.seq, m.role, _json(m.content),
        m.occurred_at, m.event_id, _json(m.redactions), m.owner_type, m.owner_id,
    )  # fmt: skip


def _summary_row(s: SummaryRecord) -> tuple[Any, ...]:
    return (
        s.tenant_id, s.conversation_id, s.summary_version, s.text, list(s.source_message_ids),
        s.occurred_at, s.event_id, _json(s.redactions), s.owner_type, s.owner_id,
    )  # fmt: skip


@dataclass(slots=True)
class ContextStats:
    """What rebuilding the context views of a batch read."""

    rows_read: int = 0  # message rows read (from the active turns, kept items, summaries)
    full_rebuilds: int = 0  # conversations rebuilt from all their messages


async def save_batch(
    conn: Conn, result: BatchResult, context: ContextSettings, lookups: KeyLookups
) -> ContextStats | None:
    if result.records:
        staging = await staging_table(conn, "conversations")
        await copy_rows(
            conn,
            staging,
            CONVERSATION_FIELDS,
            ([getattr(r, f) for f in CONVERSATION_FIELDS] for r in result.records.values()),
        )
        columns = ", ".join(CONVERSATION_FIELDS)
        await conn.execute(
            f"INSERT INTO conversations ({columns}) SELECT {columns} FROM {staging}"
            " ON CONFLICT (tenant_id, conversation_id) DO UPDATE SET"
            " updated_at = EXCLUDED.updated_at, last_event_id = EXCLUDED.last_event_id,"
            " message_count = EXCLUDED.message_count,"
            " summary_version = EXCLUDED.summary_version,"
            " last_message_at = EXCLUDED.last_message_at".encode()
        )
    if result.messages:
        await copy_rows(
            conn, "conversation_messages", MESSAGE_FIELDS, map(_message_row, result.messages)
        )
    if result.summaries:
        await copy_rows(
            conn, "conversation_summaries", SUMMARY_FIELDS, map(_summary_row, result.summaries)
        )
    if result.records:
        return await rebuild_context(conn, list(result.records), context, lookups)
    return None


async def rebuild_context(
    conn: Conn, keys: Sequence[ConversationKey], settings: ContextSettings, lookups: KeyLookups
) -> ContextStats:
    """Recompute the context view of ``keys`` from their active turn, the newest finished
    turns that fit the budget and the stored ``TurnIndex`` (``context.advance_context``), or
    from all their messages when the index is missing or no longer holds (the first batch
    after the upgrade, a conversation begun again, a tool result that reopens a finished
    turn). Either way the view is ``build_context`` of every message and the latest summary.
    """
    stats = ContextStats()
    if not keys:
        return stats
    owners = await _owners(conn, keys, lookups)
    wanted = [key for key in sorted(set(keys)) if key in owners]
    if not wanted:
        return stats
    summaries = await _latest_summaries(conn, wanted, lookups)
    indexes = await _turn_indexes(conn, wanted, lookups)
    starts = {key: _resume_seq(indexes.get(key)) for key in wanted}
    tails = await _tails(conn, starts, lookups)
    stats.rows_read += sum(len(tail) for tail in tails.values()) + len(summaries)
    answered = {
        key: ids
        for key, index in indexes.items()
        if index.active_seq > 1 and (ids := new_tool_results(index, tails.get(key, [])))
    }
    earlier_uses = await tool_use_seqs(conn, answered, lookups)
    stats.rows_read += sum(len(seqs) for seqs in earlier_uses.values())
    history = _FinishedTurns(conn, stats)
    rows: list[list[Any]] = []
    marks: list[tuple[str, ...]] = []  # (tenant_id, conversation_id, message_id, turn)
    unmarked: list[ConversationKey] = []  # rebuilt from every message: marks rewritten
    for key in wanted:
        tail, summary, index = tails.get(key, []), summaries.get(key), indexes.get(key)
        advanced = None
        if index is not None and resumes(index, tail, earlier_uses.get(key, ())):
            try:
                advanced = await advance_context(index, tail, summary, settings, history.of(key))
            except StaleTurnIndex:
                advanced = None
        if advanced is None:
            messages = (
                tail if _resume_seq(index) == 1 else await _all_messages(conn, key, stats, lookups)
            )
            stats.full_rebuilds += 1
            unmarked.append(key)
            advanced = await advance_context(
                TurnIndex.start(messages), messages, summary, settings, NoFinishedTurns()
            )
        marks.extend((*key, message_id, str(turn)) for message_id, turn in advanced.marks)
        owner_type, owner_id, built_at = owners[key]
        view = advanced.view
        rows.append(
            [
                *key,
                owner_type,
                owner_id,
                _json(view.to_json()),
                view.token_estimate,
                view.budget_tokens,
                view.through_message_id,
                built_at,
                _json(advanced.index.to_json()),
            ]
        )
    for tenant_id, conversation_id in unmarked:  # rare: a statement each is fine
        await conn.execute(
            "UPDATE conversation_messages SET context_turn = NULL WHERE tenant_id = %s"
            " AND conversation_id = %s AND context_turn IS NOT NULL",
            (tenant_id, conversation_id),
        )
    await lookups.fetch(
        conn,
        "UPDATE conversation_messages m SET context_turn = k.turn::integer FROM {keys}"
        " WHERE m.tenant_id = {tenant} AND m.conversation_id = k.conversation_id"
        " AND m.message_id = k.message_id RETURNING m.message_id",
        ("tenant_id", "conversation_id", "message_id", "turn"),
        marks,
    )
    staging = await staging_table(conn, "conversation_context")
    await copy_rows(conn, staging, CONTEXT_FIELDS, rows)
    columns = ", ".join(CONTEXT_FIELDS)
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in CONTEXT_FIELDS[4:])
    await conn.execute(
        f"INSERT INTO conversation_context ({columns}) SELECT {columns} FROM {staging}"
        f" ON CONFLICT (tenant_id, conversation_id) DO UPDATE SET {updates}".encode()
    )
    return stats


def _resume_seq(index: TurnIndex | None) -> int:
    """The first message the rebuild reads: the active turn's, or the first of all."""
    return index.active_seq if index is not None else 1


async def _turn_indexes(
    conn: Conn, keys: Sequence[ConversationKey], lookups: KeyLookups
) -> dict[ConversationKey, TurnIndex]:
    rows = await lookups.fetch(
        conn,
        "SELECT tenant_id, conversation_id, turn_index FROM conversation_context"
        " JOIN {keys} USING (tenant_id, conversation_id)"
        " WHERE conversation_context.tenant_id = {tenant}",
        ("tenant_id", "conversation_id"),
        keys,
    )
    found = {}
    for tenant_id, conversation_id, value in rows:
        index = TurnIndex.from_json(value)
        if index is not None:
            found[(tenant_id, conversation_id)] = index
    return found


async def _tails(
    conn: Conn, starts: dict[ConversationKey, int], lookups: KeyLookups
) -> dict[ConversationKey, list[MessageRecord]]:
    """Each conversation's messages from the given seq on, in order: a range of the
    (tenant_id, conversation_id, seq) index per conversation (``OFFSET 0`` keeps the planner
    from turning the lateral join into a hash join over the whole table)."""
    found: dict[ConversationKey, list[MessageRecord]] = {}
    rows = await lookups.fetch(
        conn,
        f"SELECT {', '.join(f'm.{f}' for f in MESSAGE_FIELDS)}"
        " FROM {keys} CROSS JOIN LATERAL ("
        f" SELECT {', '.join(MESSAGE_FIELDS)} FROM conversation_messages c"
        " WHERE c.tenant_id = {tenant} AND c.conversation_id = k.conversation_id"
        " AND c.seq >= k.from_seq::integer ORDER BY c.seq OFFSET 0) AS m",
        ("tenant_id", "conversation_id", "from_seq"),
        ((*key, str(seq)) for key, seq in starts.items()),
        row_factory=dict_row,
    )
    for row in rows:
        message = _message_from_row(row)
        found.setdefault((message.tenant_id, message.conversation_id), []).append(message)
    return found


async def _all_messages(
    conn: Conn, key: ConversationKey, stats: ContextStats, lookups: KeyLookups
) -> list[MessageRecord]:
    messages = (await _tails(conn, {key: 1}, lookups)).get(key, [])
    stats.rows_read += len(messages)
    return messages


async def tool_use_seqs(
    conn: Conn, answered: dict[ConversationKey, set[str]], lookups: KeyLookups
) -> dict[ConversationKey, list[int]]:
    """The seqs of the messages holding a tool_use with one of the given ids, per
    conversation: one lookup of the ``conversation_tool_use_keys`` index for every id, with
    keys made by the function the index is on. The join with the keys' tenants adds nothing
    to what the index finds (its keys hold the tenant); it ties each statement to its tenant
    (``{tenant}``) for Citus, and the planner still starts from the index (plans measured by
    ops/bench/tool_use_plans.py, in ops/decisions/citus.md)."""
    found: dict[ConversationKey, list[int]] = {}
    if not answered:
        return found
    rows = await lookups.fetch(
        conn,
        "SELECT m.tenant_id, m.conversation_id, m.seq"
        " FROM (SELECT DISTINCT k.tenant_id FROM {keys}) AS k"
        " JOIN conversation_messages m ON m.tenant_id = {tenant}"
        " WHERE conversation_tool_use_keys(m.tenant_id, m.conversation_id, m.content) && ("
        "  SELECT array_agg(key) FROM {keys},"
        "  unnest(conversation_tool_use_keys(k.tenant_id, k.conversation_id,"
        "   jsonb_build_array(jsonb_build_object('type', 'tool_use', 'id', k.tool_id)))) AS key)",
        ("tenant_id", "conversation_id", "tool_id"),
        ((*key, tool_id) for key, ids in answered.items() for tool_id in ids),
    )
    for tenant_id, conversation_id, seq in rows:
        found.setdefault((tenant_id, conversation_id), []).append(seq)
    return found


class _FinishedTurns:
    """``context.FinishedTurns`` over the ``context_turn`` marks, counting what it reads."""

    def __init__(self, conn: Conn, stats: ContextStats) -> None:
        self._conn = conn
        self._stats = stats
        self._key: ConversationKey = ("", "")

    def of(self, key: ConversationKey) -> _FinishedTurns:
        self._key = key
        return self

    async def kept(self, first: int, last: int) -> list[tuple[int, MessageRecord]]:
        async with self._conn.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(
                f"SELECT context_turn, {', '.join(MESSAGE_FIELDS)} FROM conversation_messages"
                " WHERE tenant_id = %s AND conversation_id = %s"
                " AND context_turn BETWEEN %s AND %s",
                (*self._key, first, last),
            )
            rows = await cursor.fetchall()
        self._stats.rows_read += len(rows)
        return [(row.pop("context_turn"), _message_from_row(row)) for row in rows]

    async def keeping(self, among: Collection[str], last: int) -> list[tuple[int, str]]:
        cursor = await self._conn.execute(
            "SELECT context_turn, message_id FROM conversation_messages"
            " WHERE tenant_id = %(tenant)s AND conversation_id = %(conversation)s"
            " AND context_turn BETWEEN 1 AND %(last)s AND context_turn IN ("
            "  SELECT context_turn FROM conversation_messages"
            "  WHERE tenant_id = %(tenant)s AND conversation_id = %(conversation)s"
            "  AND message_id = ANY(%(among)s) AND context_turn IS NOT NULL)",
            {
                "tenant": self._key[0],
                "conversation": self._key[1],
                "among": sorted(among),
                "last": last,
            },
        )
        rows = [(int(turn), str(message_id)) for turn, message_id in await cursor.fetchall()]
        self._stats.rows_read += len(among) + len(rows)
        return rows

    async def sources(self, summary_version: int) -> frozenset[str] | None:
        cursor = await self._conn.execute(
            "SELECT source_message_ids FROM conversation_summaries"
            " WHERE tenant_id = %s AND conversation_id = %s AND summary_version = %s",
            (*self._key, summary_version),
        )
        row = await cursor.fetchone()
        self._stats.rows_read += 1
        return None if row is None else frozenset(row[0])


def _message_from_row(row: dict[str, Any]) -> MessageRecord:
    return MessageRecord(**{**row, "content": tuple(row["content"])})


def _summary_from_row(row: dict[str, Any]) -> SummaryRecord:
    return SummaryRecord(**{**row, "source_message_ids": tuple(row["source_message_ids"])})


async def _latest_summaries(
    conn: Conn, keys: Sequence[ConversationKey], lookups: KeyLookups
) -> dict[ConversationKey, SummaryRecord]:
    # The newest version only, one index probe per conversation: every summary names all the
    # messages it was built from, so reading them all would grow with the conversation.
    rows = await lookups.fetch(
        conn,
        f"SELECT {', '.join(f's.{f}' for f in SUMMARY_FIELDS)}"
        " FROM {keys} CROSS JOIN LATERAL ("
        f" SELECT {', '.join(SUMMARY_FIELDS)} FROM conversation_summaries c"
        " WHERE c.tenant_id = {tenant} AND c.conversation_id = k.conversation_id"
        " ORDER BY c.summary_version DESC LIMIT 1) AS s",
        ("tenant_id", "conversation_id"),
        keys,
        row_factory=dict_row,
    )
    return {(row["tenant_id"], row["conversation_id"]): _summary_from_row(row) for row in rows}


async def _owners(
    conn: Conn, keys: Sequence[ConversationKey], lookups: KeyLookups
) -> dict[ConversationKey, tuple[Any, ...]]:
    rows = await lookups.fetch(
        conn,
        "SELECT tenant_id, conversation_id, owner_type, owner_id, updated_at FROM conversations"
        " JOIN {keys} USING (tenant_id, conversation_id)"
        " WHERE conversations.tenant_id = {tenant}",
        ("tenant_id", "conversation_id"),
        keys,
    )
    return {(row[0], row[1]): (row[2], row[3], row[4]) for row in rows}


@dataclass(frozen=True, slots=True)
class ConversationDetail:
    record: ConversationRecord
    messages: list[MessageRecord]
    summaries: list[SummaryRecord]

    def to_json(self) -> dict[str, Any]:
        by_id = {m.message_id: m for m in self.messages}
        return {
            "conversation": asdict(self.record),
            "messages": [asdict(m) for m in self.messages],
            "summaries": [
                {
                    **asdict(s),
                    "sources": [
                        {"message_id": m, "seq": by_id[m].seq, "role": by_id[m].role}
                        for m in s.source_message_ids
                        if m in by_id
                    ],
                }
                for s in self.summaries
            ],
        }


async def load_conversation(
    conn: Conn, tenant_id: str, conversation_id: str
) -> ConversationDetail | None:
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            f"SELECT {', '.join(CONVERSATION_FIELDS)} FROM conversations"
            " WHERE tenant_id = %s AND conversation_id = %s",
            (tenant_id, conversation_id),
        )
        row = await cursor.fetchone()
        if row is None:
            return None
        await cursor.execute(
            f"SELECT {', '.join(SUMMARY_FIELDS)} FROM conversation_summaries"
            " WHERE tenant_id = %s AND conversation_id = %s ORDER BY summary_version",
            (tenant_id, conversation_id),
        )
        summaries = [_summary_from_row(r) for r in await cursor.fetchall()]
    messages = (await _tails(conn, {(tenant_id, conversation_id): 1}, ONE_TENANT)).get(
        (tenant_id, conversation_id), []
    )
    return ConversationDetail(ConversationRecord(**row), messages, summaries)


async def conversation_exists(conn: Conn, tenant_id: str, conversation_id: str) -> bool:
    cursor = await conn.execute(
        "SELECT 1 FROM conversations WHERE tenant_id = %s AND conversation_id = %s",
        (tenant_id, conversation_id),
    )
    return await cursor.fetchone() is not None


async def load_context(conn: Conn, tenant_id: str, conversation_id: str) -> dict[str, Any] | None:
    cursor = await conn.execute(
        "SELECT view, built_at, owner_type, owner_id FROM conversation_context"
        " WHERE tenant_id = %s AND conversation_id = %s",
        (tenant_id, conversation_id),
    )
    row = await cursor.fetchone()
    if row is None:
        return None
    view: dict[str, Any] = row[0]
    return {**view, "built_at": row[1].isoformat(), "owner": [row[2], row[3]]}


async def evidence_messages(
    conn: Conn, tenant_id: str, event_ids: Iterable[str]
) -> dict[str, bool]:
    """Of these event ids, those of messages the tenant holds (applied, not erased): event id
    -> whether the message is primary evidence (a user's message, or one holding a tool
    result)."""
    wanted = sorted(set(event_ids))
    if not wanted:
        return {}
    cursor = await conn.execute(
        "SELECT event_id, role = 'user' OR content @> '[{\"type\": \"tool_result\"}]'::jsonb"
        " FROM conversation_messages WHERE tenant_id = %s AND event_id = ANY(%s)",
        (tenant_id, wanted),
    )
    return {str(row[0]): bool(row[1]) for row in await cursor.fetchall()}


async def messages_by_event_id(
    conn: Conn, tenant_id: str, event_ids: Iterable[str]
) -> list[MessageRecord]:
    """The tenant's stored messages (redacted, as applied) these event ids made, in order."""
    wanted = sorted(set(event_ids))
    if not wanted:
        return []
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            f"SELECT {', '.join(MESSAGE_FIELDS)} FROM conversation_messages"
            " WHERE tenant_id = %s AND event_id = ANY(%s) ORDER BY occurred_at, seq",
            (tenant_id, wanted),
        )
        return [_message_from_row(row) for row in await cursor.fetchall()]


async def event_ids_of_conversations(
    conn: Conn, tenant_id: str, conversations: Iterable[str]
) -> list[str]:
    """The event ids of every message of these conversations: what their erasure removes."""
    cursor = await conn.execute(
        "SELECT event_id FROM conversation_messages"
        " WHERE tenant_id = %s AND conversation_id = ANY(%s)",
        (tenant_id, sorted(set(conversations))),
    )
    return [str(row[0]) for row in await cursor.fetchall()]


async def held_messages(
    conn: Conn, keys: Collection[MessageKey], lookups: KeyLookups
) -> set[MessageKey]:
    """Which of these messages the projection holds."""
    rows = await lookups.fetch(
        conn,
        "SELECT tenant_id, conversation_id, message_id FROM conversation_messages"
        " JOIN {keys} USING (tenant_id, conversation_id, message_id)"
        " WHERE conversation_messages.tenant_id = {tenant}",
        ("tenant_id", "conversation_id", "message_id"),
        keys,
    )
    return {(r[0], r[1], r[2]) for r in rows}


# -- erasure ------------------------------------------------------------------------------------


async def conversations_owned_by(
    conn: Conn, tenant_id: str, owner_type: str | None, owner_id: str
) -> list[str]:
    cursor = await conn.execute(
        "SELECT conversation_id FROM conversations"
        " WHERE tenant_id = %s AND owner_type = %s AND owner_id = %s ORDER BY 1",
        (tenant_id, owner_type, owner_id),
    )
    return [row[0] for row in await cursor.fetchall()]


async def held_in(
    conn: Conn, tenant_id: str, conversation_ids: Sequence[str]
) -> tuple[list[tuple[str, str]], list[tuple[str, int]], list[str]]:
    """What these conversations hold: their (conversation, message) ids in order, their
    (conversation, summary version)s, and the conversations that have a context view."""
    scope = (tenant_id, list(conversation_ids))
    messages = await conn.execute(
        "SELECT conversation_id, message_id FROM conversation_messages"
        " WHERE tenant_id = %s AND conversation_id = ANY(%s) ORDER BY 1, seq",
        scope,
    )
    summaries = await conn.execute(
        "SELECT conversation_id, summary_version FROM conversation_summaries"
        " WHERE tenant_id = %s AND conversation_id = ANY(%s) ORDER BY 1, 2",
        scope,
    )
    contexts = await conn.execute(
        "SELECT conversation_id FROM conversation_context"
        " WHERE tenant_id = %s AND conversation_id = ANY(%s) ORDER BY 1",
        scope,
    )
    return (
        [(row[0], row[1]) for row in await messages.fetchall()],
        [(row[0], row[1]) for row in await summaries.fetchall()],
        [row[0] for row in await contexts.fetchall()],
    )


async def message_contents(
    conn: Conn, tenant_id: str, conversation_ids: Sequence[str]
) -> list[tuple[str, list[dict[str, Any]]]]:
    """("conversation/message", content) of every message of these conversations."""
    cursor = await conn.execute(
        "SELECT conversation_id || '/' || message_id, content FROM conversation_messages"
        " WHERE tenant_id = %s AND conversation_id = ANY(%s)",
        (tenant_id, list(conversation_ids)),
    )
    return [(row[0], row[1]) for row in await cursor.fetchall()]


async def erase(conn: Conn, scope: ErasureScope) -> None:
    """The erased conversations and their messages. Their summaries and context views are
    derived stores: their own workers remove them when the tombstone arrives."""
    conversations = (scope.tenant_id, list(scope.conversations))
    await conn.execute(
        "DELETE FROM conversation_messages WHERE tenant_id = %s AND conversation_id = ANY(%s)",
        conversations,
    )
    await conn.execute(
        "DELETE FROM conversations WHERE tenant_id = %s AND conversation_id = ANY(%s)",
        conversations,
    )


# -- rows that other modules' queries join -------------------------------------------------------

RETENTION_ROWS = (
    "SELECT tenant_id, conversation_id, retention_class, owner_type, owner_id, started_at,"
    " last_message_at FROM conversations"
)
"""Each conversation's retention class, owner and activity: the row source that the retention
schedule's and the legal holds' queries join (``FROM ({RETENTION_ROWS}) c``), so that a million
kept conversations are narrowed down in one statement while this module stays the one that
knows the table."""


# -- statistics (the demo's report) --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConversationStatistics:
    conversations: int
    messages: int
    summaries: int
    redactions: dict[str, int]
    """Redacted spans in the stored messages, by kind."""
    context_tool_results_omitted: int
    context_units_dropped: int


async def statistics(conn: Conn) -> ConversationStatistics:
    async def one_row(query: LiteralString) -> tuple[Any, ...]:
        cursor = await conn.execute(query)
        row = await cursor.fetchone()
        assert row is not None  # an aggregate without GROUP BY returns one row
        return tuple(row)

    conversations, messages = await one_row(
        "SELECT count(*), coalesce(sum(message_count), 0) FROM conversations"
    )
    (summaries,) = await one_row("SELECT count(*) FROM conversation_summaries")
    cursor = await conn.execute(
        "SELECT key, sum(value::int) FROM conversation_messages, jsonb_each_text(redactions)"
        " GROUP BY 1 ORDER BY 1"
    )
    redactions = {str(kind): int(count) for kind, count in await cursor.fetchall()}
    omitted, dropped = await one_row(
        "SELECT coalesce(sum((view->>'omitted_tool_results')::int), 0),"
        " coalesce(sum((view->>'dropped_units')::int), 0) FROM conversation_context"
    )
    return ConversationStatistics(
        int(conversations), int(messages), int(summaries), redactions, int(omitted), int(dropped)
    )


async def busiest_with_memories(conn: Conn) -> tuple[str, str] | None:
    """The summarised conversation with the most messages that memories were taken from:
    tenant and conversation id."""
    cursor = await conn.execute(
        "SELECT c.tenant_id, c.conversation_id FROM conversations c"
        f" JOIN ({memory_store.REACH_ROWS}) m ON m.tenant_id = c.tenant_id"
        " AND m.source_conversation_id = c.conversation_id"
        " WHERE c.summary_version > 0 ORDER BY c.message_count DESC, 1, 2 LIMIT 1"
    )
    row = await cursor.fetchone()
    return None if row is None else (str(row[0]), str(row[1]))
