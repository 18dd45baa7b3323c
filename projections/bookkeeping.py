"""Tables every projection shares: idempotency, tracking offsets, rejections, the outbox.

All writes take a connection inside the caller's transaction: the projection rows, the
tracking offsets, the processed event ids and the outbox commit together or not at all.
Batches go through binary ``COPY`` (under 1 us a row, against 14 us for parameter arrays): straight
into append-only tables, or into a per-transaction staging table when rows must be merged.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import psycopg
from psycopg import AsyncConnection, AsyncCursor, errors, postgres
from psycopg.abc import AdaptContext
from psycopg.adapt import Dumper
from psycopg.pq import Format
from psycopg.rows import AsyncRowFactory

from projections.deletion.erasure import ErasureScope
from projections.idempotency import EventKey, ProcessedEvent
from topics.outputs import Rejection
from topics.registry import Headers, keys_of


class ConcurrentClaim(RuntimeError):
    """Another worker recorded one of this batch's event ids first; the batch must be retried."""


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers = ()


@dataclass(frozen=True, slots=True)
class RejectionRow:
    rejection: Rejection
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


# The tenant column of every key a lookup takes: its first.
TENANT_COLUMN = "tenant_id"


@dataclass(frozen=True, slots=True)
class KeyLookups:
    """How a batch's keys are looked up: one statement for all its tenants (plain PostgreSQL:
    one round trip), or one statement per tenant, pipelined (``per_tenant``: each statement
    says ``tenant_id = <its tenant>``, so that Citus runs it on that tenant's shard alone;
    ops/decisions/citus.md, "Batches").

    A lookup's statement is written once, for both: ``{keys}`` stands for the relation ``k``
    of the keys, with the given columns (``tenant_id`` first), and ``{tenant}`` for the
    tenant of ``k``'s rows, to compare a table's ``tenant_id`` with; its own parameters are
    named (``%(name)s``; ``keys`` and ``tenant`` are taken). Keys of one tenant make one
    statement of that tenant in either mode.
    """

    per_tenant: bool = False

    async def fetch(
        self,
        conn: Conn,
        statement: str,
        columns: Sequence[str],
        keys: Iterable[Sequence[str]],
        params: Mapping[str, Any] | None = None,
        row_factory: AsyncRowFactory[Any] | None = None,
    ) -> list[Any]:
        """The rows of ``statement`` for ``keys``: those of every tenant's statement (one that
        changes rows says ``RETURNING``)."""
        rows: list[Any] = []
        for cursor in await self._run(conn, statement, columns, keys, params, row_factory):
            rows.extend(await cursor.fetchall())
            await cursor.close()
        return rows

    async def _run(
        self,
        conn: Conn,
        statement: str,
        columns: Sequence[str],
        keys: Iterable[Sequence[str]],
        params: Mapping[str, Any] | None,
        row_factory: AsyncRowFactory[Any] | None,
    ) -> list[AsyncCursor[Any]]:
        if columns[0] != TENANT_COLUMN:
            raise ValueError(f"a lookup's keys start with {TENANT_COLUMN}, not {columns[0]}")
        by_tenant: dict[str, list[Sequence[str]]] = {}
        for key in sorted(set(map(tuple, keys))):
            by_tenant.setdefault(key[0], []).append(key[1:])
        if not by_tenant:
            return []
        own = dict(params or {})
        if len(by_tenant) > 1 and not self.per_tenant:
            batch = _render(statement, _batch_keys(columns), f"k.{TENANT_COLUMN}")
            every = [(tenant, *rest) for tenant, group in by_tenant.items() for rest in group]
            return [await _cursor(conn, batch, {**own, "keys": _json(every)}, row_factory)]
        one = _render(statement, _tenant_keys(columns), "%(tenant)s")
        bound = [
            {**own, "keys": _json(group), "tenant": tenant} for tenant, group in by_tenant.items()
        ]
        if len(bound) == 1:
            return [await _cursor(conn, one, bound[0], row_factory)]
        # One round trip for all the tenants' statements: their results are read after it.
        async with conn.pipeline():
            return [await _cursor(conn, one, each, row_factory) for each in bound]


# For keys that are all one tenant's (a read, an erasure): both modes make the same statement.
ONE_TENANT = KeyLookups()


def _render(statement: str, keys: str, tenant: str) -> bytes:
    return statement.replace("{keys}", keys).replace("{tenant}", tenant).encode()


def _batch_keys(columns: Sequence[str]) -> str:
    """The keys of several tenants: one JSON array of them (psycopg dumps list parameters at
    about 0.5 us an element, orjson at 0.01, and the server reads both as fast; batches look
    up one or more keys per event, so this is per-event cost)."""
    fields = ", ".join(f"r->>{index} AS {name}" for index, name in enumerate(columns))
    return f"(SELECT {fields} FROM jsonb_array_elements(%(keys)s::jsonb) AS r) AS k"


def _tenant_keys(columns: Sequence[str]) -> str:
    """The keys of one tenant: the tenant a parameter, the rest a JSON array."""
    fields = ", ".join(
        [f"%(tenant)s::text AS {TENANT_COLUMN}"]
        + [f"r->>{index} AS {name}" for index, name in enumerate(columns[1:])]
    )
    return f"(SELECT {fields} FROM jsonb_array_elements(%(keys)s::jsonb) AS r) AS k"


def _json(keys: Sequence[Sequence[str]]) -> str:
    return orjson.dumps(keys).decode()


async def _cursor(
    conn: Conn,
    statement: bytes,
    params: Mapping[str, Any],
    row_factory: AsyncRowFactory[Any] | None,
) -> AsyncCursor[Any]:
    cursor = conn.cursor(row_factory=row_factory) if row_factory else conn.cursor()
    await cursor.execute(statement, params)
    return cursor


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


async def copy_rows(
    conn: Conn, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]
) -> None:
    """COPY ``rows`` into ``table`` in PostgreSQL's binary format.

    Binary, with the column types read from the catalog: psycopg then dumps each value by its
    column's type, where the text format spent about 0.8 us on every timestamp and 2 us on
    every array (a memory version row: 5.4 us in text, 0.6 in binary). JSON columns take the
    JSON text the caller serialised. psycopg's binary ``integer`` does not check its range:
    integers from input are bounded by the contract (``topics.envelope.StoredInt``).

    The types are read in the caller's transaction, every time (one round trip a batch and
    table): a cache would outlive a migration that changes a column under a running worker.
    """
    types = await _column_types(conn, table, columns)
    async with conn.cursor() as cursor:
        cursor.adapters.register_dumper(None, _JsonbTextDumper)
        cursor.adapters.register_dumper(None, _TextArrayDumper)
        statement = f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)"
        async with cursor.copy(statement.encode()) as copy:
            copy.set_types(types)
            for row in rows:
                await copy.write_row(row)


async def _column_types(conn: Conn, table: str, columns: Sequence[str]) -> list[int]:
    cursor = await conn.execute(
        "SELECT attname, atttypid FROM pg_attribute"
        " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
        (table,),
    )
    by_name = {str(name): int(oid) for name, oid in await cursor.fetchall()}
    missing = [column for column in columns if column.strip('"') not in by_name]
    if missing:
        # What PostgreSQL itself would say of the COPY: the schema is not the one memproj's
        # migrations made (an environment fault, never one message's).
        raise psycopg.errors.UndefinedColumn(
            f"table {table} has no column {', '.join(missing)}: its schema is not memproj's"
        )
    return [by_name[column.strip('"')] for column in columns]


class _EncodingDumper(Dumper):
    def __init__(self, cls: type, context: AdaptContext | None = None) -> None:
        super().__init__(cls, context)
        # The server reads binary text in the client encoding, as psycopg's own dumpers write.
        self._encoding = self.connection.info.encoding if self.connection else "utf-8"


class _JsonbTextDumper(_EncodingDumper):
    """jsonb from JSON text already serialised (by orjson) rather than from an object."""

    format = Format.BINARY
    oid = postgres.types["jsonb"].oid

    def dump(self, obj: str) -> bytes:
        return b"\x01" + obj.encode(self._encoding)


class _TextArrayDumper(_EncodingDumper):
    """text[] from a sequence of str, in the array's binary layout: psycopg's own list dumper
    is Python code that costs about 1.3 us for a three-item list, this 0.3."""

    format = Format.BINARY
    oid = postgres.types["text"].array_oid
    _element_oid = postgres.types["text"].oid

    def dump(self, obj: Sequence[str | None]) -> bytes:
        if not obj:
            return _ARRAY_HEADER.pack(0, 0, self._element_oid)
        parts = [
            _ARRAY_HEADER.pack(1, None in obj, self._element_oid),
            _ARRAY_DIMENSION.pack(len(obj), 1),
        ]
        for item in obj:
            if item is None:
                parts.append(_LENGTH.pack(-1))
            else:
                data = item.encode(self._encoding)
                parts.append(_LENGTH.pack(len(data)))
                parts.append(data)
        return b"".join(parts)


_ARRAY_HEADER = struct.Struct("!iiI")  # dimensions, has nulls, element type
_ARRAY_DIMENSION = struct.Struct("!ii")  # size, lower bound
_LENGTH = struct.Struct("!i")


async def staging_table(conn: Conn, like: str) -> str:
    """A temporary copy of ``like``'s columns, empty: emptied at every commit, and here too,
    since one transaction may stage several parts of a batch (savepoints of the isolation,
    ``streams.runner``), whose rows must not be merged again with the next part's. One round
    trip: two statements without parameters."""
    name = f"staging_{like}"
    await conn.execute(
        f"CREATE TEMP TABLE IF NOT EXISTS {name} (LIKE {like} INCLUDING DEFAULTS)"
        f" ON COMMIT DELETE ROWS; DELETE FROM {name}".encode()
    )
    return name


async def copy_new_rows(
    conn: Conn, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]
) -> int:
    """COPY ``rows`` in, keeping the rows already there (a replay records nothing twice)."""
    staging = await staging_table(conn, table)
    await copy_rows(conn, staging, columns, rows)
    names = ", ".join(columns)
    cursor = await conn.execute(
        f"INSERT INTO {table} ({names}) SELECT {names} FROM {staging}"
        " ON CONFLICT DO NOTHING".encode()
    )
    return cursor.rowcount


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


async def record_rejections(conn: Conn, projection: str, rows: Sequence[RejectionRow]) -> None:
    if not rows:  # most batches: two round trips saved
        return
    columns = (
        "projection", "tenant_id", "entity_id", "subject_type", "subject_id", "event_id",
        "event_type", "reason", "details", "occurred_at", "topic", "partition", '"offset"',
    )  # fmt: skip
    await copy_rows(
        conn,
        "rejections",
        columns,
        (
            (
                projection,
                row.rejection.tenant_id,
                row.rejection.entity_id,
                row.rejection.subject.type if row.rejection.subject else None,
                row.rejection.subject.id if row.rejection.subject else None,
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
        ),
    )


async def rejection_counts(conn: Conn, projection: str) -> dict[str, int]:
    """How many of the projection's events were rejected, by reason."""
    cursor = await conn.execute(
        "SELECT reason, count(*) FROM rejections WHERE projection = %s GROUP BY 1 ORDER BY 1",
        (projection,),
    )
    return {str(reason): int(count) for reason, count in await cursor.fetchall()}


async def erase_rejections(conn: Conn, scope: ErasureScope) -> None:
    """The rejections of events about what an erasure covers: its memories, conversations
    and subject."""
    subject = scope.subject
    await conn.execute(
        "DELETE FROM rejections WHERE tenant_id = %s AND (entity_id = ANY(%s)"
        " OR (subject_type = %s AND subject_id = %s))",
        (
            scope.tenant_id,
            [*scope.memories, *scope.conversations],
            subject.type if subject else None,
            subject.id if subject else None,
        ),
    )


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


async def legal_hold_refusal(conn: Conn, tenant_id: str, deletion_id: str) -> str | None:
    """Why the ledger refused request ``deletion_id`` under a legal hold (None: it did not)."""
    cursor = await conn.execute(
        "SELECT details FROM rejections WHERE projection = 'deletion' AND tenant_id = %s"
        " AND entity_id = %s AND reason = 'legal_hold' ORDER BY id DESC LIMIT 1",
        (tenant_id, deletion_id),
    )
    row = await cursor.fetchone()
    return None if row is None else str(row[0])
