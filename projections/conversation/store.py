"""PostgreSQL persistence of the conversation projection and its context view, and the reads
behind ``memproj conversation ...``. Every read takes the tenant."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import orjson
from psycopg.rows import dict_row

from projections.bookkeeping import Conn, copy_rows, keyset, keyset_param, staging_table
from projections.conversation.context import ContextSettings, build_context
from projections.conversation.reducer import (
    BatchResult,
    ConversationKey,
    ConversationRecord,
    ConversationState,
    MessageKey,
    MessageRecord,
    SummaryRecord,
)
from projections.memory.store import RECORD_COLUMNS, record_from_row
from topics.conversation import ConversationEvent, MessageAdded, SummaryUpdated
from topics.outputs import MemoryRecord

CONVERSATION_FIELDS = (
    "tenant_id", "conversation_id", "owner_type", "owner_id", "channel", "retention_class",
    "provider_conversation_ref", "started_at", "updated_at", "last_event_id", "message_count",
    "summary_version",
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
    "budget_tokens", "through_message_id", "built_at",
)  # fmt: skip


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def _keys(keys: Iterable[tuple[str, ...]]) -> str:
    return keyset_param(sorted(set(keys)))


async def load_state(conn: Conn, events: Sequence[ConversationEvent]) -> ConversationState:
    keys = {(e.tenant_id, e.conversation_id) for e in events}
    records: dict[ConversationKey, ConversationRecord] = {}
    if keys:
        keys_param = _keys(keys)
        async with conn.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(
                f"SELECT {', '.join(CONVERSATION_FIELDS)} FROM conversations"
                f" JOIN {keyset('tenant_id', 'conversation_id')}"
                " USING (tenant_id, conversation_id)",
                (keys_param,),
            )
            for row in await cursor.fetchall():
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
    known: set[MessageKey] = set()
    if wanted:
        found = await conn.execute(
            "SELECT tenant_id, conversation_id, message_id FROM conversation_messages"
            f" JOIN {keyset('tenant_id', 'conversation_id', 'message_id')}"
            " USING (tenant_id, conversation_id, message_id)",
            (_keys(wanted),),
        )
        known = {(row[0], row[1], row[2]) for row in await found.fetchall()}
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


async def save_batch(conn: Conn, result: BatchResult, context: ContextSettings) -> None:
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
            " summary_version = EXCLUDED.summary_version".encode()
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
        await rebuild_context(conn, list(result.records), context)


async def rebuild_context(
    conn: Conn, keys: Sequence[ConversationKey], settings: ContextSettings
) -> None:
    """Recompute the context view of ``keys`` from their stored messages and latest summary."""
    if not keys:
        return
    keys_param = _keys(keys)
    messages = await _messages(conn, keys_param)
    summaries = await _latest_summaries(conn, keys_param)
    owners = await _owners(conn, keys_param)
    rows = []
    for key in sorted(set(keys)):
        if key not in owners:
            continue
        conversation_messages = messages.get(key, [])
        view = build_context(conversation_messages, summaries.get(key), settings)
        owner_type, owner_id, built_at = owners[key]
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
            ]
        )
    if not rows:
        return
    staging = await staging_table(conn, "conversation_context")
    await copy_rows(conn, staging, CONTEXT_FIELDS, rows)
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in CONTEXT_FIELDS[4:])
    await conn.execute(
        f"INSERT INTO conversation_context SELECT * FROM {staging}"
        f" ON CONFLICT (tenant_id, conversation_id) DO UPDATE SET {updates}".encode()
    )


async def _messages(conn: Conn, keys_param: str) -> dict[ConversationKey, list[MessageRecord]]:
    found: dict[ConversationKey, list[MessageRecord]] = {}
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            f"SELECT {', '.join(MESSAGE_FIELDS)} FROM conversation_messages"
            f" JOIN {keyset('tenant_id', 'conversation_id')} USING (tenant_id, conversation_id)"
            " ORDER BY tenant_id, conversation_id, seq",
            (keys_param,),
        )
        for row in await cursor.fetchall():
            message = _message_from_row(row)
            found.setdefault((message.tenant_id, message.conversation_id), []).append(message)
    return found


def _message_from_row(row: dict[str, Any]) -> MessageRecord:
    return MessageRecord(**{**row, "content": tuple(row["content"])})


def _summary_from_row(row: dict[str, Any]) -> SummaryRecord:
    return SummaryRecord(**{**row, "source_message_ids": tuple(row["source_message_ids"])})


async def _latest_summaries(conn: Conn, keys_param: str) -> dict[ConversationKey, SummaryRecord]:
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            f"SELECT DISTINCT ON (tenant_id, conversation_id) {', '.join(SUMMARY_FIELDS)}"
            " FROM conversation_summaries"
            f" JOIN {keyset('tenant_id', 'conversation_id')} USING (tenant_id, conversation_id)"
            " ORDER BY tenant_id, conversation_id, summary_version DESC",
            (keys_param,),
        )
        return {
            (row["tenant_id"], row["conversation_id"]): _summary_from_row(row)
            for row in await cursor.fetchall()
        }


async def _owners(conn: Conn, keys_param: str) -> dict[ConversationKey, tuple[Any, ...]]:
    cursor = await conn.execute(
        "SELECT tenant_id, conversation_id, owner_type, owner_id, updated_at FROM conversations"
        f" JOIN {keyset('tenant_id', 'conversation_id')} USING (tenant_id, conversation_id)",
        (keys_param,),
    )
    return {(row[0], row[1]): (row[2], row[3], row[4]) for row in await cursor.fetchall()}


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
    keys_param = _keys([(tenant_id, conversation_id)])
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
    messages = (await _messages(conn, keys_param)).get((tenant_id, conversation_id), [])
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


async def memories_from_conversation(
    conn: Conn, tenant_id: str, conversation_id: str
) -> list[MemoryRecord]:
    """Every memory whose source is a message of this conversation, whatever its status."""
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            f"SELECT {RECORD_COLUMNS} FROM memories"
            " WHERE tenant_id = %s AND source_conversation_id = %s ORDER BY memory_id",
            (tenant_id, conversation_id),
        )
        return [record_from_row(row) for row in await cursor.fetchall()]
