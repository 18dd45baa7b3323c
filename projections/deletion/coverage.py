"""What an erasure covers, written once.

A row (or a vector entry) is covered by an erasure when one of the entities it belongs to (its
memory, its conversation, the conversation its source points into, its subject) is erased and
the row is not newer than the erasure's cut-off: data written after the cut-off is new data,
not a ghost. The items a tombstone lists are removed whatever their time: they existed when
the erasure resolved them (``Tombstone`` items, see ``derived``).

``Coverage`` says, per table, which columns name those entities and when a row came to be.
Everything that removes or looks for erased rows in PostgreSQL builds its SQL here: the
erasure of rebuild schemas, a rebuild's sweep before its swap, the derived tables' erasure,
the verification probe and the ghost audit. The vector store and the cache apply the same
rule in Python through ``ErasureIndex.covering`` and ``keys_of``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from psycopg import sql

from projections.deletion.erasure import (
    EntityKey,
    conversation_content_key,
    conversation_key,
    memory_key,
    subject_key,
)
from topics.deletion import Tombstone

EntityType = str  # "memory" | "conversation" | "conversation_content"


@dataclass(frozen=True, slots=True)
class Coverage:
    """How an erasure reaches the rows of one table."""

    table: str
    # When a row came to be; compared with the erasure's cut-off.
    time_column: str
    # (subject type column, subject id column): whom the row is about or who owns it.
    subject_columns: tuple[str, str]
    # (entity type, column): the memories and conversations a row belongs to.
    entity_columns: tuple[tuple[EntityType, str], ...]

    def covered(self, row: str = "t", erased: str = "e") -> sql.Composed:
        """SQL: the row ``row`` is covered by the ``erased_entities`` row ``erased``."""
        r, e = sql.Identifier(row), sql.Identifier(erased)
        subject_type, subject_id = (sql.Identifier(c) for c in self.subject_columns)
        alternatives = [
            sql.SQL("({e}.entity_type = {kind} AND {e}.entity_id = {r}.{column})").format(
                e=e, kind=sql.Literal(kind), r=r, column=sql.Identifier(column)
            )
            for kind, column in self.entity_columns
        ]
        alternatives.append(
            sql.SQL(
                "({e}.entity_type = 'subject' AND {e}.subject_type = {r}.{st}"
                " AND {e}.entity_id = {r}.{sid})"
            ).format(e=e, r=r, st=subject_type, sid=subject_id)
        )
        return sql.SQL(
            "{e}.tenant_id = {r}.tenant_id AND {r}.{time} <= {e}.cut_off AND ({any})"
        ).format(
            e=e,
            r=r,
            time=sql.Identifier(self.time_column),
            any=sql.SQL(" OR ").join(alternatives),
        )

    def erase(self, schema: str, erasures: sql.Composable, deletion: bool = False) -> sql.Composed:
        """``DELETE`` of the rows of ``schema.table`` covered by ``erasures`` (a qualified
        ``erased_entities``); with ``deletion``, only by the erasure ``%(deletion_id)s`` of
        tenant ``%(tenant_id)s``."""
        return sql.SQL("DELETE FROM {table} t USING {erasures} e WHERE {covered}{only}").format(
            table=sql.Identifier(schema, self.table),
            erasures=erasures,
            covered=self.covered(),
            only=_ONE_DELETION if deletion else sql.SQL(""),
        )

    def covered_conversations(self) -> sql.Composed:
        """``SELECT`` of the conversations (``tenant:conversation``) with rows in the table
        that the erasure index covers: a derived store's ghosts."""
        return sql.SQL(
            "SELECT DISTINCT t.tenant_id || ':' || t.conversation_id FROM {table} t"
            " JOIN erased_entities e ON {covered} ORDER BY 1"
        ).format(table=sql.Identifier(self.table), covered=self.covered())

    def count(self, schema: str | None, erasures: sql.Composable, deletion: bool) -> sql.Composed:
        """``SELECT`` of the number of covered rows, as ``erase`` would delete them."""
        table = sql.Identifier(self.table) if schema is None else sql.Identifier(schema, self.table)
        return sql.SQL(
            "SELECT count(DISTINCT t.ctid) FROM {table} t, {erasures} e WHERE {covered}{only}"
        ).format(
            table=table,
            erasures=erasures,
            covered=self.covered(),
            only=_ONE_DELETION if deletion else sql.SQL(""),
        )

    def of_deletion(self, select: str, schema: str | None = None) -> sql.Composed:
        """``<select> FROM table t WHERE ...``: the rows one erasure removes, with the params
        ``deletion_params``: what it covers, and what its tombstone lists whatever their
        time (the memories and conversations it resolved)."""
        listed = [
            sql.SQL("t.{} = ANY({})").format(
                sql.Identifier(column), sql.Placeholder(_LISTED_BY.get(column, _LISTED[kind]))
            )
            for kind, column in self.entity_columns
        ]
        return sql.SQL(
            "{select} FROM {table} t WHERE t.tenant_id = %(tenant_id)s AND ({listed}"
            " OR EXISTS (SELECT 1 FROM erased_entities e WHERE {covered}{only}))"
        ).format(
            select=sql.SQL(select),
            table=sql.Identifier(self.table)
            if schema is None
            else sql.Identifier(schema, self.table),
            listed=sql.SQL(" OR ").join(listed),
            covered=self.covered(),
            only=_ONE_DELETION,
        )


def deletion_params(
    tenant_id: str,
    deletion_id: str,
    memories: Sequence[str],
    conversations: Sequence[str],
    *,
    sources: Sequence[str] | None = None,
) -> dict[str, object]:
    """The params of ``of_deletion``: the erasure, and the memories and conversations it
    resolved (its tombstone's items). ``sources``: the conversations whose memories it
    covers (by default all of them; none for a content erasure)."""
    return {
        "tenant_id": tenant_id,
        "deletion_id": deletion_id,
        "memories": list(memories),
        "conversations": list(conversations),
        "sources": list(conversations if sources is None else sources),
    }


def tombstone_params(tombstone: Tombstone) -> dict[str, object]:
    conversations = tombstone.conversation_ids()
    return deletion_params(
        tombstone.tenant_id,
        tombstone.deletion_id,
        tombstone.ids("memory"),
        conversations,
        sources=[] if tombstone.scope == "content" else conversations,
    )


_ONE_DELETION = sql.SQL(" AND e.tenant_id = %(tenant_id)s AND e.deletion_id = %(deletion_id)s")

# Which of ``deletion_params`` lists the items of each kind: a memory's source conversation is
# listed apart, since a content erasure lists a conversation without its memories.
_LISTED = {
    "memory": "memories",
    "conversation": "conversations",
    "conversation_content": "conversations",
}
_LISTED_BY = {"source_conversation_id": "sources"}

_OWNER = ("owner_type", "owner_id")
# A conversation's own rows: covered by its erasure and by the erasure of its content.
_IN_CONVERSATION: tuple[tuple[EntityType, str], ...] = (
    ("conversation", "conversation_id"),
    ("conversation_content", "conversation_id"),
)
_MEMORY: tuple[tuple[EntityType, str], ...] = (
    ("memory", "memory_id"),
    ("conversation", "source_conversation_id"),
)

# Every projection table that holds personal data, and how an erasure reaches it.
MEMORIES = Coverage("memories", "created_at", ("subject_type", "subject_id"), _MEMORY)
MEMORY_VERSIONS = Coverage(
    "memory_versions", "occurred_at", ("subject_type", "subject_id"), _MEMORY
)
CONVERSATIONS = Coverage("conversations", "started_at", _OWNER, _IN_CONVERSATION)
MESSAGES = Coverage("conversation_messages", "occurred_at", _OWNER, _IN_CONVERSATION)
SUMMARIES = Coverage("conversation_summaries", "occurred_at", _OWNER, _IN_CONVERSATION)
CONTEXT = Coverage("conversation_context", "built_at", _OWNER, _IN_CONVERSATION)
# Rejections name the entity they refused (a memory or a conversation) and, where known, the
# subject; ``occurred_at`` is the refused event's.
REJECTIONS = Coverage(
    "rejections",
    "occurred_at",
    ("subject_type", "subject_id"),
    (("memory", "entity_id"), ("conversation", "entity_id")),
)

BY_TABLE = {
    c.table: c
    for c in (MEMORIES, MEMORY_VERSIONS, CONVERSATIONS, MESSAGES, SUMMARIES, CONTEXT, REJECTIONS)
}


def keys_of(
    tenant_id: str,
    subject: tuple[str, str],
    *,
    memory_id: str | None = None,
    conversation_id: str | None = None,
) -> Iterator[EntityKey]:
    """The erasure keys of one item: the Python side of ``Coverage.covered``, for stores
    that are not tables (the vector store, the cache)."""
    yield subject_key(tenant_id, *subject)
    if memory_id is not None:
        yield memory_key(tenant_id, memory_id)
    if conversation_id is not None:
        yield conversation_key(tenant_id, conversation_id)
        if memory_id is None:  # the conversation's own content, not a memory taken from it
            yield conversation_content_key(tenant_id, conversation_id)


def not_newer(occurred_at: datetime, cut_off: datetime) -> bool:
    """The time half of the rule: what occurred after the cut-off is new data."""
    return occurred_at <= cut_off
