"""Tables every projection shares: idempotency, tracking offsets, rejections, the outbox.

All writes take a connection inside the caller's transaction: the projection rows, the
tracking offsets, the processed event ids and the outbox commit together or not at all.
Batches are written column-wise through ``unnest`` so a batch costs one round trip per table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection

from projections.idempotency import EventKey, ProcessedEvent
from topics.outputs import Rejection


class ConcurrentClaim(RuntimeError):
    """Another worker recorded one of this batch's event ids first; the batch must be retried."""


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    topic: str
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True, slots=True)
class RejectionRow:
    rejection: Rejection
    subject: tuple[str, str] | None
    topic: str
    partition: int
    offset: int


Conn = AsyncConnection[tuple[Any, ...]]


Position = tuple[str, int]  # (topic, partition)


async def load_offsets(conn: Conn, projection: str) -> dict[Position, int]:
    cursor = await conn.execute(
        "SELECT topic, partition, next_offset FROM projection_offsets WHERE projection = %s",
        (projection,),
    )
    return {(str(row[0]), int(row[1])): int(row[2]) for row in await cursor.fetchall()}


async def save_offsets(conn: Conn, projection: str, next_offsets: Mapping[Position, int]) -> None:
    if not next_offsets:
        return
    await conn.execute(
        "INSERT INTO projection_offsets (projection, topic, partition, next_offset)"
        " SELECT %s, t, p, o FROM unnest(%s::text[], %s::integer[], %s::bigint[]) AS x(t, p, o)"
        " ON CONFLICT (projection, topic, partition) DO UPDATE"
        " SET next_offset = GREATEST(projection_offsets.next_offset, EXCLUDED.next_offset),"
        " updated_at = now()",
        (
            projection,
            [topic for topic, _ in next_offsets],
            [partition for _, partition in next_offsets],
            list(next_offsets.values()),
        ),
    )


async def load_seen(conn: Conn, projection: str, keys: Iterable[EventKey]) -> dict[EventKey, bytes]:
    tenants, event_ids = _columns(keys)
    if not tenants:
        return {}
    cursor = await conn.execute(
        "SELECT p.tenant_id, p.event_id, p.body_hash FROM processed_events p"
        " JOIN unnest(%s::text[], %s::text[]) AS k(tenant_id, event_id)"
        " USING (tenant_id, event_id) WHERE p.projection = %s",
        (tenants, event_ids, projection),
    )
    return {(row[0], row[1]): bytes(row[2]) for row in await cursor.fetchall()}


async def claim_processed(conn: Conn, projection: str, processed: Sequence[ProcessedEvent]) -> None:
    if not processed:
        return
    cursor = await conn.execute(
        "INSERT INTO processed_events (projection, tenant_id, event_id, body_hash)"
        " SELECT %s, t, e, h FROM unnest(%s::text[], %s::text[], %s::bytea[]) AS x(t, e, h)"
        " ON CONFLICT DO NOTHING",
        (
            projection,
            [p.tenant_id for p in processed],
            [p.event_id for p in processed],
            [p.body_hash for p in processed],
        ),
    )
    if cursor.rowcount != len(processed):
        raise ConcurrentClaim(
            f"{len(processed) - cursor.rowcount} event ids were claimed by another worker"
        )


async def record_rejections(conn: Conn, projection: str, rows: Sequence[RejectionRow]) -> None:
    if not rows:
        return
    async with conn.cursor() as cursor:
        await cursor.executemany(
            "INSERT INTO rejections (projection, tenant_id, entity_id, subject_type, subject_id,"
            ' event_id, event_type, reason, details, occurred_at, topic, partition, "offset")'
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            [
                (
                    projection,
                    row.rejection.tenant_id,
                    row.rejection.entity_id,
                    row.subject[0] if row.subject else None,
                    row.subject[1] if row.subject else None,
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
            ],
        )


async def add_to_outbox(conn: Conn, producer: str, messages: Sequence[OutboxMessage]) -> list[int]:
    if not messages:
        return []
    cursor = await conn.execute(
        "INSERT INTO outbox (producer, topic, key, value)"
        " SELECT %s, t, k, v FROM unnest(%s::text[], %s::bytea[], %s::bytea[]) AS x(t, k, v)"
        " RETURNING id",
        (
            producer,
            [m.topic for m in messages],
            [m.key for m in messages],
            [m.value for m in messages],
        ),
    )
    return [int(row[0]) for row in await cursor.fetchall()]


async def pending_outbox(
    conn: Conn, producer: str, limit: int = 10_000
) -> list[tuple[int, OutboxMessage]]:
    cursor = await conn.execute(
        "SELECT id, topic, key, value FROM outbox WHERE producer = %s ORDER BY id LIMIT %s",
        (producer, limit),
    )
    return [
        (int(row[0]), OutboxMessage(str(row[1]), _bytes(row[2]), _bytes(row[3])))
        for row in await cursor.fetchall()
    ]


async def remove_from_outbox(conn: Conn, ids: Sequence[int]) -> None:
    if ids:
        await conn.execute("DELETE FROM outbox WHERE id = ANY(%s)", (list(ids),))


def _bytes(value: object) -> bytes | None:
    return None if value is None else bytes(value)  # type: ignore[call-overload]


def _columns(keys: Iterable[EventKey]) -> tuple[list[str], list[str]]:
    tenants: list[str] = []
    ids: list[str] = []
    for tenant_id, entity_id in keys:
        tenants.append(tenant_id)
        ids.append(entity_id)
    return tenants, ids
