"""The tables a projection runner keeps beside its projection: tracking offsets
(``projection_offsets``) and processed event ids (``processed_events``), and the ``Tracking``
a runner uses them through, together with the outbox and the rejections.

All writes take a connection inside the caller's transaction: the projection rows, the
tracking offsets, the processed event ids and the outbox commit together or not at all.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from psycopg import errors

from projections.idempotency import EventKey, ProcessedEvent
from projections.outbox import (
    OutboxMessage,
    Publish,
    add_to_outbox,
    pending_outbox,
    publish_outbox_batch,
    publish_pending_outbox,
    remove_from_outbox,
    remove_outbox_batch,
)
from projections.rejections import RejectionRow, record_rejections
from projections.sql import Conn, KeyLookups, copy_rows


class ConcurrentClaim(RuntimeError):
    """Another worker recorded one of this batch's event ids first; the batch must be retried."""


Position = tuple[str, int]  # (topic, partition)


async def load_offsets(conn: Conn, projection: str) -> dict[Position, int]:
    cursor = await conn.execute(
        "SELECT topic, partition, next_offset FROM projection_offsets WHERE projection = %s",
        (projection,),
    )
    return {(str(row[0]), int(row[1])): int(row[2]) for row in await cursor.fetchall()}


async def lock_offsets(
    conn: Conn, projection: str, positions: Iterable[Position], inherit_from: str | None = None
) -> dict[Position, int]:
    """Lock the tracking rows of ``positions`` for this transaction and return them.

    Two workers briefly holding the same partition (during a rebalance) thus apply its
    messages one after the other, and the second one sees what the first applied.

    A position ``projection`` has never tracked starts at 0, or, with ``inherit_from``, at
    the offset that projection tracks for it (a handover: see ``HandoverTracking``).
    """
    topics, partitions = [], []
    for topic, partition in sorted(set(positions)):
        topics.append(topic)
        partitions.append(partition)
    # Two statements (the lock must see the rows the insert made), one round trip: on every
    # batch's path, where a round trip waits for a core (ops/decisions/freshness.md).
    async with conn.pipeline():
        await conn.execute(
            "INSERT INTO projection_offsets (projection, topic, partition, next_offset)"
            " SELECT %s, t, p, coalesce((SELECT h.next_offset FROM projection_offsets h"
            "  WHERE h.projection = %s AND h.topic = t AND h.partition = p), 0)"
            " FROM unnest(%s::text[], %s::integer[]) AS x(t, p)"
            " ON CONFLICT DO NOTHING",
            (projection, inherit_from, topics, partitions),
        )
        cursor = await conn.execute(
            "SELECT o.topic, o.partition, o.next_offset FROM projection_offsets o"
            " JOIN unnest(%s::text[], %s::integer[]) AS x(topic, partition)"
            " USING (topic, partition)"
            " WHERE o.projection = %s ORDER BY 1, 2 FOR UPDATE OF o",
            (topics, partitions, projection),
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


async def load_seen(
    conn: Conn, projection: str, keys: Iterable[EventKey], lookups: KeyLookups
) -> dict[EventKey, bytes]:
    rows = await lookups.fetch(
        conn,
        "SELECT p.tenant_id, p.event_id, p.body_hash FROM processed_events p"
        " JOIN {keys} USING (tenant_id, event_id)"
        " WHERE p.tenant_id = {tenant} AND p.projection = %(projection)s",
        ("tenant_id", "event_id"),
        keys,
        {"projection": projection},
    )
    return {(row[0], row[1]): bytes(row[2]) for row in rows}


async def claim_processed(conn: Conn, projection: str, processed: Sequence[ProcessedEvent]) -> None:
    """Record the batch's new event ids. Straight into the table, not through a staging table:
    an id already there can only be another worker's claim (a batch never claims one it has
    seen), and the failed COPY aborts the transaction, so the batch is retried and then sees
    it. This saved PostgreSQL 4 to 9 us an event."""
    if not processed:
        return
    try:
        await copy_rows(
            conn,
            "processed_events",
            ("projection", "tenant_id", "event_id", "body_hash"),
            ((projection, p.tenant_id, p.event_id, p.body_hash) for p in processed),
        )
    except errors.UniqueViolation as exc:
        raise ConcurrentClaim(f"an event id was claimed by another worker: {exc}") from exc


class Tracking(Protocol):
    """The bookkeeping a runner keeps in each batch's transaction (``PostgresTracking``)."""

    async def lock_offsets(
        self, conn: Conn, projection: str, positions: Iterable[Position]
    ) -> dict[Position, int]: ...

    async def save_offsets(
        self, conn: Conn, projection: str, next_offsets: Mapping[Position, int]
    ) -> None: ...

    async def load_seen(
        self, conn: Conn, projection: str, keys: Iterable[EventKey]
    ) -> dict[EventKey, bytes]: ...

    async def claim_processed(
        self, conn: Conn, projection: str, processed: Sequence[ProcessedEvent]
    ) -> None: ...

    async def record_rejections(
        self, conn: Conn, projection: str, rows: Sequence[RejectionRow]
    ) -> None: ...

    async def add_to_outbox(
        self, conn: Conn, producer: str, messages: Sequence[OutboxMessage]
    ) -> uuid.UUID | None: ...

    async def pending_outbox(
        self, conn: Conn, producer: str, limit: int = ..., max_bytes: int = ...
    ) -> list[tuple[int, OutboxMessage]]: ...

    async def remove_outbox_batch(self, conn: Conn, batch_id: uuid.UUID | None) -> None: ...

    async def remove_from_outbox(self, conn: Conn, ids: Sequence[int]) -> None: ...

    async def publish_outbox_batch(
        self,
        conn: Conn,
        batch_id: uuid.UUID | None,
        messages: Sequence[OutboxMessage],
        publish: Publish,
    ) -> None: ...

    async def publish_pending_outbox(
        self, conn: Conn, producer: str, publish: Publish, max_bytes: int = ...
    ) -> int: ...


class PostgresTracking:
    """The bookkeeping tables as a projection runner uses them, in the caller's transaction
    (one object, so that the runner's own tests can give it an in-memory fake)."""

    def __init__(self, lookups: KeyLookups) -> None:
        self.lookups = lookups

    lock_offsets = staticmethod(lock_offsets)
    save_offsets = staticmethod(save_offsets)

    async def load_seen(
        self, conn: Conn, projection: str, keys: Iterable[EventKey]
    ) -> dict[EventKey, bytes]:
        return await load_seen(conn, projection, keys, self.lookups)

    claim_processed = staticmethod(claim_processed)
    record_rejections = staticmethod(record_rejections)
    add_to_outbox = staticmethod(add_to_outbox)
    pending_outbox = staticmethod(pending_outbox)
    remove_outbox_batch = staticmethod(remove_outbox_batch)
    remove_from_outbox = staticmethod(remove_from_outbox)
    publish_outbox_batch = staticmethod(publish_outbox_batch)
    publish_pending_outbox = staticmethod(publish_pending_outbox)


class HandoverTracking(PostgresTracking):
    """``PostgresTracking`` whose projection takes over its input from ``predecessor``: a
    partition it has never tracked starts where the predecessor's tracking of the same topic
    and partition stands, so that what the predecessor applied is not applied again.

    The upgrade to the one-hop stages: the memory and conversation workers read the
    raw topics the sealer read. Everything below the sealer's tracked raw offsets is in the
    sealed log already, and projected once the old workers caught up on it; the fused worker
    starts right after. Read in the batch's transaction, the first time a partition is seen:
    once the fused worker tracks it, the predecessor's row is never read again."""

    def __init__(self, predecessor: str, lookups: KeyLookups) -> None:
        super().__init__(lookups)
        self.predecessor = predecessor

    async def lock_offsets(  # type: ignore[override]
        self, conn: Conn, projection: str, positions: Iterable[Position]
    ) -> dict[Position, int]:
        return await lock_offsets(conn, projection, positions, inherit_from=self.predecessor)
