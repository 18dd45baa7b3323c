"""Raw input dropped as soon as it is sealed.

``memory.events`` and ``conversation.events`` carry personal data in plaintext. The worker that
seals a raw topic (the memory worker ``memory.events``, the conversation worker
``conversation.events``: one stage) is done with a record once it has committed
the record's sealed copy, in the transaction that also moves its tracked offsets
(``projection_offsets`` in PostgreSQL): from then on the sealed copy is durable (in the outbox,
then in the sealed log), and nothing in memproj reads the raw record again. So that worker
deletes the raw records below its committed offsets with Kafka's DeleteRecords, every
``MEMPROJ_RAW_INPUT_TRIM_SECONDS``; the topics' retention (one day) stays as the backstop.

The offsets come from PostgreSQL, never from the worker's position in memory: a record the
worker has read but not committed is never trimmed, whatever crashes. One replica of the
worker trims, every partition the table names: the one that holds the trim's lease
(``streams.coordination``). Two would still agree (the same offsets; one below the low
watermark changes nothing), but count the trimmed records twice.

What else is read once: nothing else is trimmed. ``memproj replay`` re-reads the sealed logs
(memory, conversation) and ``memory.current`` with ``conversation.messages`` (embeddings), and
``memproj dlq`` the dead-letter topics, so those must stay. ``deletion.requests``,
``deletion.acks`` and ``deletion.tombstones`` carry ids and reasons, no personal content, and
are read by several groups (or kept for audit), so trimming them would gain nothing.

A failed trim never stops the worker: it is logged, counted in ``memproj_raw_trim_errors``
(``kind`` transient, retried next round, or refused by the broker or an ACL, which needs an
operator) and tried again next round.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping
from typing import Any, Literal, Protocol

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from mode import Service
from psycopg_pool import AsyncConnectionPool

from projections.bookkeeping import Position, load_offsets
from projections.sql import Conn
from streams.coordination import Lease, in_postgres
from streams.failures import loggable
from streams.kafka import KafkaTarget, admin_config
from streams.metrics import Metrics
from streams.runner import Projection
from streams.settings import Settings

log = logging.getLogger(__name__)

ErrorKind = Literal["transient", "refused"]

# Errors librdkafka does not flag retriable but that pass by themselves (a broker restarting,
# a leader moving, a request lost).
_TRANSIENT = frozenset(
    {
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._MSG_TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.NOT_CONTROLLER,
    }
)


def plan_trim(
    committed: Mapping[Position, int], trimmed: Mapping[Position, int], topics: Collection[str]
) -> dict[Position, int]:
    """The positions of ``topics`` to trim, each to the sealer's committed offset: those whose
    committed offset is beyond what was last trimmed (all of them, on a first round)."""
    return {
        position: offset
        for position, offset in sorted(committed.items())
        if position[0] in topics and offset > trimmed.get(position, 0)
    }


def behind(
    committed: Mapping[Position, int], trimmed: Mapping[Position, int], topics: Collection[str]
) -> dict[str, int]:
    """Per topic, the records the sealer has committed that are not known to be trimmed."""
    counts = dict.fromkeys(sorted(topics), 0)
    for (topic, partition), offset in committed.items():
        if topic in counts:
            counts[topic] += max(0, offset - trimmed.get((topic, partition), 0))
    return counts


def classify(code: int, retriable: bool) -> ErrorKind:
    """Transient errors pass by themselves; anything else the broker refused (an ACL, a
    policy, an offset beyond the log's end after the topic was recreated)."""
    return "transient" if retriable or code in _TRANSIENT else "refused"


class RecordDeleter(Protocol):
    def delete(self, targets: Mapping[Position, int]) -> dict[Position, int | KafkaError]:
        """Delete the records below each offset; per position, the new low watermark or the
        error that prevented it."""
        ...


class KafkaRecordDeleter:
    """DeleteRecords through one AdminClient."""

    def __init__(self, bootstrap: KafkaTarget, timeout: float = 10.0) -> None:
        self._admin = AdminClient(admin_config(bootstrap))
        self._timeout = timeout

    def delete(self, targets: Mapping[Position, int]) -> dict[Position, int | KafkaError]:
        if not targets:
            return {}
        results: dict[Position, int | KafkaError] = {}
        try:
            futures = self._admin.delete_records(
                [TopicPartition(t, p, offset) for (t, p), offset in targets.items()],
                request_timeout=self._timeout,
                operation_timeout=self._timeout,
            )
        except KafkaException as exc:
            return dict.fromkeys(targets, exc.args[0])
        for partition, future in futures.items():
            position = (partition.topic, partition.partition)
            try:
                results[position] = int(future.result(timeout=self._timeout).low_watermark)
            except KafkaException as exc:
                results[position] = exc.args[0]
            except Exception as exc:  # a future that timed out locally
                results[position] = KafkaError(KafkaError._TIMED_OUT, str(exc))
        return results


class RawInputTrimmer(Service):
    """The sealing worker's trim loop (see the module docstring)."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Conn],
        deleter: RecordDeleter,
        projection: str,
        topics: Collection[str],
        metrics: Metrics,
        interval_seconds: float,
        lease: Lease | None = None,
        **kwargs: Any,
    ) -> None:
        """``lease``: the trim runs where it leads (None: here, always)."""
        self._pool = pool
        self._lease = lease
        self._deleter = deleter
        self._projection = projection
        self._topics = frozenset(topics)
        self._metrics = metrics
        self._interval = interval_seconds
        # Per position: the offset below which records are known to be deleted, and the
        # error of the last failed trim (logged once until it changes or clears).
        self.trimmed: dict[Position, int] = {}
        self._failing: dict[Position, str] = {}
        super().__init__(**kwargs)

    @Service.task
    async def _trimming(self) -> None:
        while not self.should_stop:
            await self.sleep(self._interval)
            try:
                if self._lease is not None and not await self._lease.leads():
                    continue
                await self.trim_once()
            except Exception as exc:
                # PostgreSQL away, say: the next round tries again; the worker goes on.
                log.warning("raw input trim: round failed, retried: %s", loggable(exc))
                self._metrics.raw_trim_errors.labels("", "transient", type(exc).__name__).inc()

    async def trim_once(self) -> dict[Position, int | KafkaError]:
        """One round: read the committed offsets, trim to them, report."""
        async with self._pool.connection() as conn:
            committed = await load_offsets(conn, self._projection)
        targets = plan_trim(committed, self.trimmed, self._topics)
        results = await asyncio.to_thread(self._deleter.delete, targets) if targets else {}
        for position, result in results.items():
            if isinstance(result, KafkaError):
                self._failed(position, result)
            else:
                self._trimmed(position, targets[position], result)
        for topic, count in behind(committed, self.trimmed, self._topics).items():
            self._metrics.raw_untrimmed_records.labels(topic).set(count)
        return results

    def _trimmed(self, position: Position, target: int, low_watermark: int) -> None:
        previous = self.trimmed.get(position)
        if previous is not None:  # a first trim after a start has no baseline to count from
            self._metrics.raw_trimmed_records.labels(position[0]).inc(
                max(0, low_watermark - previous)
            )
        self.trimmed[position] = max(target, low_watermark)
        if self._failing.pop(position, None) is not None:
            log.info("raw input trim of %s[%d] works again", *position)

    def _failed(self, position: Position, error: KafkaError) -> None:
        kind = classify(error.code(), error.retriable())
        self._metrics.raw_trim_errors.labels(position[0], kind, error.name()).inc()
        if self._failing.get(position) != error.name():
            self._failing[position] = error.name()
            level = logging.WARNING if kind == "transient" else logging.ERROR
            log.log(
                level,
                "raw input trim of %s[%d] %s: %s (raw plaintext stays until retention)",
                position[0],
                position[1],
                "failed, retried" if kind == "transient" else "refused by the broker",
                error.str(),
            )


def raw_input_trimmers(
    settings: Settings,
    metrics: Metrics,
    pool: AsyncConnectionPool[Conn],
    sealer: Projection[Any, Any, Any],
) -> list[Service]:
    """The trimmer of ``sealer``'s raw input topics (the one-hop stage that seals them), run by
    the replica that holds its lease; none if the setting is 0."""
    if settings.raw_input_trim_seconds <= 0:
        return []
    lease = Lease(in_postgres(settings.postgres_conninfo), f"raw-input-trim:{sealer.name}", metrics)
    return [
        lease,
        RawInputTrimmer(
            pool,
            KafkaRecordDeleter(settings.kafka),
            sealer.name,
            [settings.topics.name(spec) for spec in sealer.input_specs],
            metrics,
            settings.raw_input_trim_seconds,
            lease,
        ),
    ]
