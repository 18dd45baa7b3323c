"""The ``outbox`` table: the messages a batch stages for Kafka in its own transaction,
published after it commits and deleted once published (a transactional outbox)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from projections.sql import Conn, copy_rows
from topics.registry import Headers, keys_of


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers = ()


async def add_to_outbox(
    conn: Conn, producer: str, messages: Sequence[OutboxMessage]
) -> uuid.UUID | None:
    """Stage ``messages`` for publication; returns the batch id to remove them by."""
    if not messages:
        return None
    batch_id = uuid.uuid4()
    await copy_rows(
        conn,
        "outbox",
        ("producer", "batch_id", "topic", "key", "value", "headers"),
        ((producer, batch_id, m.topic, m.key, m.value, _headers_json(m.headers)) for m in messages),
    )
    return batch_id


async def pending_outbox(
    conn: Conn, producer: str, limit: int = 10_000, max_bytes: int = 32 * 1024 * 1024
) -> list[tuple[int, OutboxMessage]]:
    """The oldest staged messages of ``producer``: at most ``limit`` of them and, beyond the
    first, at most ``max_bytes`` of keys and values (a drain holds a bounded amount)."""
    cursor = await conn.execute(
        "SELECT id, topic, key, value, headers FROM ("
        " SELECT id, topic, key, value, headers, sum(coalesce(octet_length(value), 0)"
        " + coalesce(octet_length(key), 0)) OVER (ORDER BY id) AS running,"
        " row_number() OVER (ORDER BY id) AS n"
        " FROM outbox WHERE producer = %s ORDER BY id LIMIT %s) AS pending"
        " WHERE n = 1 OR running <= %s ORDER BY id",
        (producer, limit, max_bytes),
    )
    return [(int(row[0]), _outbox_message(row)) for row in await cursor.fetchall()]


def _outbox_message(row: Sequence[Any]) -> OutboxMessage:
    """An OutboxMessage from a row of (id, topic, key, value, headers)."""
    return OutboxMessage(
        str(row[1]),
        _bytes(row[2]),
        _bytes(row[3]),
        tuple((str(name), str(value)) for name, value in row[4] or ()),
    )


# -- publishing with the rows locked ------------------------------------------------------
# A publisher holds the rows it publishes locked (FOR UPDATE) from before the publication until
# their deletion commits. An erasure deletes its memories' pending rows in its own transaction
# (``remove_pending_messages``): it either waits for a publication in progress and then finds
# the rows gone, so the ledger's null, published after the erasure commits, lands after them;
# or it deletes them first, and a publisher that then locks its batch finds them gone and does
# not publish them. Either way the null is the last record of the key.

Publish = Callable[[Sequence[OutboxMessage]], Awaitable[None]]


async def publish_outbox_batch(
    conn: Conn, batch_id: uuid.UUID | None, messages: Sequence[OutboxMessage], publish: Publish
) -> None:
    """Publish a committed batch's outbox (``messages``, as staged) and delete it, its rows
    locked throughout. Rows an erasure removed meanwhile are not published."""
    if batch_id is None:
        return
    async with conn.transaction():
        cursor = await conn.execute(
            "SELECT id FROM outbox WHERE batch_id = %s ORDER BY id FOR UPDATE", (batch_id,)
        )
        ids = [int(row[0]) for row in await cursor.fetchall()]
        if len(ids) != len(messages):  # rows only ever leave a batch: an erasure took some
            messages = [message for _, message in await _locked_rows(conn, ids)]
        await publish(messages)
        await conn.execute("DELETE FROM outbox WHERE batch_id = %s", (batch_id,))


async def publish_pending_outbox(
    conn: Conn, producer: str, publish: Publish, max_bytes: int = 32 * 1024 * 1024
) -> int:
    """Publish and delete the oldest staged messages of ``producer`` (a bounded amount, as
    ``pending_outbox``), their rows locked throughout; returns how many."""
    async with conn.transaction():
        ids = [i for i, _ in await pending_outbox(conn, producer, max_bytes=max_bytes)]
        pending = await _locked_rows(conn, ids)
        if pending:
            await publish([message for _, message in pending])
            await remove_from_outbox(conn, [i for i, _ in pending])
        return len(pending)


async def _locked_rows(conn: Conn, ids: Sequence[int]) -> list[tuple[int, OutboxMessage]]:
    """The rows of ``ids`` still there, locked (a row deleted while this waited is left out)."""
    if not ids:
        return []
    cursor = await conn.execute(
        "SELECT id, topic, key, value, headers FROM outbox WHERE id = ANY(%s)"
        " ORDER BY id FOR UPDATE",
        (list(ids),),
    )
    return [(int(row[0]), _outbox_message(row)) for row in await cursor.fetchall()]


async def remove_pending_messages(
    conn: Conn, topic_base_name: str, tenant_id: str, entity_ids: Sequence[str]
) -> int:
    """Delete the staged messages on ``topic_base_name`` (under any prefix) whose entity
    headers (``topics.registry.entity_headers``) name one of ``entity_ids`` of ``tenant_id``;
    waits for any publication of them in progress. Matched on the headers too, not on the key
    alone: a row staged before 1.2 has the input key, which reads the same for tenant
    ``a:b``/memory ``m`` and tenant ``a``/``b:m``."""
    if not entity_ids:
        return 0
    cursor = await conn.execute(
        "DELETE FROM outbox WHERE right(topic, length(%(topic)s)) = %(topic)s"
        " AND key = ANY(%(keys)s)"
        " AND EXISTS (SELECT FROM jsonb_array_elements(headers) AS h"
        "  WHERE h->>0 = 'tenant_id' AND h->>1 = %(tenant)s)"
        " AND EXISTS (SELECT FROM jsonb_array_elements(headers) AS h"
        "  WHERE h->>0 = 'entity_id' AND h->>1 = ANY(%(entities)s))",
        {
            "topic": topic_base_name,
            "keys": [key.encode() for entity in entity_ids for key in keys_of(tenant_id, entity)],
            "tenant": tenant_id,
            "entities": list(entity_ids),
        },
    )
    return cursor.rowcount


async def remove_outbox_batch(conn: Conn, batch_id: uuid.UUID | None) -> None:
    if batch_id is not None:
        await conn.execute("DELETE FROM outbox WHERE batch_id = %s", (batch_id,))


async def remove_from_outbox(conn: Conn, ids: Sequence[int]) -> None:
    if ids:
        await conn.execute("DELETE FROM outbox WHERE id = ANY(%s)", (list(ids),))


def _headers_json(headers: Headers) -> str | None:
    return orjson.dumps(headers).decode() if headers else None


def _bytes(value: object) -> bytes | None:
    return None if value is None else bytes(value)  # type: ignore[call-overload]
