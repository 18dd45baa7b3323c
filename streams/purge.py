"""The purge checks of the places outside PostgreSQL and the derived stores (Kafka), and the
list of every registered check (``purge_checks``); the deletion worker's purge duty
(``streams.maintenance``) runs them (``PurgeRound``). The milestone and the decisions are in
``projections.deletion.purge``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime

from confluent_kafka import Consumer, TopicPartition
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from projections import coordination, rebuilds
from projections.deletion import lifecycle
from projections.deletion.ledger import RequestKey
from projections.deletion.purge import (
    MEMORY_CURRENT_PLACE,
    PROJECTION_TABLES_PLACE,
    RAW_INPUT_PLACE,
    REBUILD_COPIES_PLACE,
    DuePurge,
    Mark,
    PurgeCheck,
    TablesVacuumed,
    compaction_leftovers,
    erasures,
    live_tables,
    schema_tables,
    trimmed_past,
)
from projections.sql import Conn
from projections.stores import DerivedStore
from streams.failures import loggable
from streams.kafka import KafkaTarget, consumer_config, failed
from streams.settings import Settings
from topics.registry import CONVERSATION_EVENTS, MEMORY_CURRENT, MEMORY_EVENTS, keys_of

log = logging.getLogger(__name__)

# The tables an erasure deletes rows from (``projections.deletion.store.erase``), and those
# whose dead tuples hold what it erased from before: the outbox's published rows (the
# memory.current values), the data keys it shreds (a dead tuple still holds the wrapped key,
# which would open the sealed log), the dead-letter keys it blanks, the probes; and the
# vectors and texts the embeddings store deletes (``projections.embeddings.postgres``: its
# removals leave no version, only dead tuples).
PROJECTION_TABLES = (
    "memories",
    "memory_versions",
    "conversations",
    "conversation_messages",
    "rejections",
    "outbox",
    "entity_keys",
    "dead_letter_keys",
    "deletion_probes",
    "vector_entries",
)


# The raw input a sealing worker trims (streams.trim): plaintext until then. Requests carry
# ids and reasons only and are not trimmed.
RAW_INPUT = (MEMORY_EVENTS, CONVERSATION_EVENTS)


class KafkaLog:
    """Reads a topic's watermarks and records, read_uncommitted: what is physically there."""

    def __init__(self, bootstrap: KafkaTarget, timeout: float = 10.0) -> None:
        self._bootstrap = bootstrap
        self._timeout = timeout

    def _consumer(self) -> Consumer:
        return Consumer(
            consumer_config(
                self._bootstrap,
                **{
                    "group.id": f"memproj-purge-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    "isolation.level": "read_uncommitted",
                    "auto.offset.reset": "earliest",
                },
            )
        )

    def watermarks(self, topics: Sequence[str]) -> dict[str, dict[str, tuple[int, int]]]:
        """Per topic, per partition (as text, a JSON key): (low, high)."""
        consumer = self._consumer()
        try:
            found: dict[str, dict[str, tuple[int, int]]] = {}
            for topic in topics:
                metadata = consumer.list_topics(topic, timeout=self._timeout).topics[topic]
                if metadata.error is not None:
                    raise failed(metadata.error, f"topic {topic}")
                found[topic] = {
                    str(partition): consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=self._timeout
                    )
                    for partition in sorted(metadata.partitions)
                }
            return found
        finally:
            consumer.close()

    def records(self, topic: str) -> Iterator[tuple[bytes | None, bool]]:
        """Every record of ``topic`` up to its end now, partition by partition, in order:
        (key, whether the value is null)."""
        ends = {int(p): (low, high) for p, (low, high) in self.watermarks([topic])[topic].items()}
        consumer = self._consumer()
        try:
            for partition, (low, high) in sorted(ends.items()):
                if high <= low:
                    continue
                consumer.assign([TopicPartition(topic, partition, low)])
                position, deadline = low, time.monotonic() + self._timeout
                while position < high:
                    message = consumer.poll(0.5)
                    if message is None or message.error() is not None:
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"{topic}[{partition}]: stuck at {position}")
                        continue
                    offset = message.offset()
                    assert offset is not None
                    position, deadline = offset + 1, time.monotonic() + self._timeout
                    yield message.key(), message.value() is None
                consumer.unassign()
        finally:
            consumer.close()


class MemoryCurrentCompacted:
    """``memory.current`` rewritten past the erasure's nulls: no value of an erased key left
    before its null. Read from the low watermark each round that has due deletions (a
    compacted topic: about one record per live memory)."""

    place = MEMORY_CURRENT_PLACE

    def __init__(self, kafka: KafkaLog, topic: str) -> None:
        self._kafka = kafka
        self._topic = topic

    def applies(self, deletion: DuePurge) -> bool:
        return erasures(deletion) and bool(deletion.memories)

    async def mark(self) -> Mark:
        return {}

    async def purged(self, due: Sequence[DuePurge]) -> set[RequestKey]:
        keys = {d.key: {k for m in d.memories for k in _current_keys(d, m)} for d in due}
        wanted: set[bytes] = set().union(*keys.values())
        left = await asyncio.to_thread(
            lambda: compaction_leftovers(self._kafka.records(self._topic), wanted)
        )
        return {key for key, erased in keys.items() if not erased & left}


def _current_keys(deletion: DuePurge, memory_id: str) -> set[bytes]:
    """The keys an erased memory's records may have (``keys_of``): its output key, and the
    one a record written before contract 1.2 has; the ledger nulls both."""
    return {key.encode() for key in keys_of(deletion.tombstone.tenant_id, memory_id)}


class RawInputTrimmed:
    """The raw input (plaintext) trimmed past the erasure: the mark is each partition's end
    when the deletion was completed (every event it covers was produced before); purged when
    every low watermark is past it (the sealing workers trim what they committed,
    ``streams.trim``; the topics' retention is the backstop)."""

    place = RAW_INPUT_PLACE

    def __init__(self, kafka: KafkaLog, topics: Sequence[str]) -> None:
        self._kafka = kafka
        self._topics = list(topics)

    def applies(self, deletion: DuePurge) -> bool:
        return erasures(deletion)

    async def mark(self) -> Mark:
        found = await asyncio.to_thread(self._kafka.watermarks, self._topics)
        return {
            topic: {p: high for p, (_, high) in parts.items()} for topic, parts in found.items()
        }

    async def purged(self, due: Sequence[DuePurge]) -> set[RequestKey]:
        found = await asyncio.to_thread(self._kafka.watermarks, self._topics)
        low = {topic: {p: lo for p, (lo, _) in parts.items()} for topic, parts in found.items()}
        return {d.key for d in due if trimmed_past(d.mark, low)}


def purge_checks(
    settings: Settings, pool: AsyncConnectionPool[Conn], stores: Sequence[DerivedStore]
) -> list[PurgeCheck]:
    """Every place a copy of erased data can remain after completion, one check each."""
    kafka = KafkaLog(settings.kafka)

    async def projection_tables(conn: Conn) -> list[sql.Composable]:
        return await live_tables(conn, PROJECTION_TABLES)

    async def rebuild_tables(conn: Conn) -> list[sql.Composable]:
        return await schema_tables(conn, [s.name for s in await rebuilds.registered(conn)])

    return [
        MemoryCurrentCompacted(kafka, settings.topics.name(MEMORY_CURRENT)),
        RawInputTrimmed(kafka, [settings.topics.name(spec) for spec in RAW_INPUT]),
        TablesVacuumed(PROJECTION_TABLES_PLACE, pool, projection_tables, erasures),
        TablesVacuumed(REBUILD_COPIES_PLACE, pool, rebuild_tables, erasures),
        *(store.purge_check() for store in stores),
    ]


# The purge round's lock: its checks vacuum and read whole topics; two at once would only do
# it twice.
PURGE_DUTY = "deletion-purge"


class PurgeRound:
    """One round of the purge duty: completed deletions become due at every place that
    applies, each check is asked about its due deletions, and the deletions purged at every
    place are purged. One deletion worker at a time (its session holds the duty's lock,
    ``projections.coordination``);
    idempotent, so a round cut short is finished by the next."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Conn],
        checks: Sequence[PurgeCheck],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._pool = pool
        self._checks = list(checks)
        self._clock = clock

    @property
    def places(self) -> list[str]:
        return [check.place for check in self._checks]

    async def run(self) -> list[RequestKey] | None:
        """The deletions purged in this round; None when another worker holds the round."""
        async with self._pool.connection() as conn:
            if not await coordination.try_hold(conn, PURGE_DUTY):
                await conn.rollback()
                return None
            try:
                await conn.commit()
                await self._schedule(conn)
                for check in self._checks:
                    await self._check(conn, check)
                now = self._clock()
                finished = await lifecycle.finish_purged(conn, now)
                await conn.commit()
                return finished
            finally:
                await conn.rollback()
                await coordination.release(conn, PURGE_DUTY)
                await conn.commit()

    async def _schedule(self, conn: Conn) -> None:
        completed = await lifecycle.completed_unscheduled(conn)
        await conn.commit()
        if not completed:
            return
        deletions = [DuePurge(tombstone, {}) for tombstone in completed]
        rows: list[tuple[str, str, str, Mapping[str, object]]] = []
        for check in self._checks:
            applying = [d for d in deletions if check.applies(d)]
            if applying:
                mark = await check.mark()
                rows += [(*d.key, check.place, mark) for d in applying]
        await lifecycle.schedule_purges(conn, rows, [d.key for d in deletions], self._clock())
        await conn.commit()

    async def _check(self, conn: Conn, check: PurgeCheck) -> None:
        due = [DuePurge(t, mark) for t, mark in await lifecycle.due_purges(conn, check.place)]
        await conn.commit()
        if not due:
            return
        try:
            purged = await check.purged(due)
        except Exception as exc:
            # One place failing (the broker away) holds back its deletions only.
            log.warning(
                "purge check of %s failed, retried next round: %s", check.place, loggable(exc)
            )
            return
        if purged:
            await lifecycle.mark_purged(conn, check.place, purged, self._clock())
            await conn.commit()
