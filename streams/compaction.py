"""``memory.current``'s compaction, bounded.

The topic's configs (``topics.registry.MEMORY_CURRENT``) make a rolled segment due for
cleaning within ``max.compaction.lag.ms``. That leaves the active segment, which the cleaner
never touches, and which Kafka rolls only when a record is appended once ``segment.ms`` has
passed since the segment's first record (verified on the local Kafka 4.1.1: a partition with
``segment.ms`` = 2 s kept an erased value for as long as nothing was appended, and a null
appended after 10 s rolled the segment and let the cleaner remove the value within seconds).
A quiet partition would keep its erased values forever.

So the deletion worker that leads its duties checks each partition every
``MEMPROJ_COMPACTION_ROLL_CHECK_SECONDS``: when the newest record is older than
``segment.ms`` and is not already a roll marker, it appends a marker, a null value for the key
``":"`` (the empty tenant and memory ids, which no contract id can be: ids are at least one
character) with the header ``memproj: segment-roll``. The append rolls the segment (its first
record is older than ``segment.ms``), the marker opens the new active segment alone, and
every real record is in a cleanable one.

A marker proves that roll only when it came more than ``segment.ms`` after the record before
it. Another producer can append between the check's read and its marker: a null appended
``segment.ms`` after the segment's first record rolls the segment itself and opens the next
one, and the marker, milliseconds later, joins it without rolling. Taken as "rolled already",
that marker would keep the null in the active segment, and the value it erases in the log,
for as long as the partition stays quiet. So the check reads the record before a marker too,
and appends another marker once the first one is ``segment.ms`` old: that one rolls. Kafka
rolls by record timestamps (the segment's first batch against the appended batch), so this
holds while the partition's timestamps follow append order, as they do with producers'
clocks in step.

Markers compact away like any other null. To a reader of ``memory.current`` a marker says
that a memory that never existed is gone: harmless, and memproj's own readers (the
embeddings index, the cache) remove nothing for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    ResourceType,
)
from mode import Service

from streams.coordination import Lease
from streams.failures import loggable
from streams.kafka import (
    KafkaTarget,
    admin_config,
    consumer_config,
    failed,
    producer_config,
)
from streams.metrics import Metrics
from streams.settings import Settings
from topics.registry import MEMORY_CURRENT, output_key

log = logging.getLogger(__name__)

MARKER_KEY = output_key("", "").encode()
MARKER_HEADERS = (("tenant_id", ""), ("entity_id", ""), ("memproj", "segment-roll"))
# The broker's default ``log.cleaner.backoff.ms``: how long an idle cleaner sleeps between
# looks for a log to clean.
DEFAULT_CLEANER_BACKOFF_MS = 15_000


@dataclass(frozen=True, slots=True)
class LastRecord:
    key: bytes | None
    timestamp_ms: int


def needs_roll(
    last: LastRecord | None,
    now_ms: int,
    segment_ms: int,
    previous: LastRecord | None = None,
) -> bool:
    """Whether a partition needs a marker so that its active segment rolls: it has records,
    the newest is older than ``segment.ms``, so an append rolls the segment for sure (the
    segment's first record is at least that old), and it is not a marker that rolled one.
    A marker rolled the segment when it came more than ``segment.ms`` after ``previous``, the
    record before it, or when none is left before it (the cleaner removed it, so it was in an
    older segment): then the marker is alone in the next segment and one is enough."""
    if last is None or now_ms - last.timestamp_ms <= segment_ms:
        return False
    if last.key != MARKER_KEY:
        return True
    return previous is not None and last.timestamp_ms - previous.timestamp_ms <= segment_ms


def compaction_bound_ms(
    segment_ms: int,
    max_compaction_lag_ms: int,
    roll_check_ms: int,
    cleaner_backoff_ms: int = DEFAULT_CLEANER_BACKOFF_MS,
) -> int:
    """The longest a value superseded (or erased by a null) at t stays before the cleaner
    starts on it, cleaning time aside. The null's active segment began at F <= t and rolls at
    R <= t + 2 * segment.ms + the roll check (a record appended at F + segment.ms - e would be
    the last before a quiet spell of segment.ms + one check); the rolled segment is due at
    max(R, F + max.compaction.lag.ms); the cleaner looks within its backoff."""
    rolled = 2 * segment_ms + roll_check_ms
    return max(rolled, max_compaction_lag_ms) + cleaner_backoff_ms


class KafkaSegmentRoller:
    """The Kafka side: a topic's ``segment.ms``, each partition's newest record, markers."""

    def __init__(self, bootstrap: KafkaTarget, timeout: float = 10.0) -> None:
        self._admin = AdminClient(admin_config(bootstrap))
        self._producer = Producer(producer_config(bootstrap))
        # read_uncommitted: the physical log is what rolls, whatever a transaction left.
        self._consumer = Consumer(
            consumer_config(
                bootstrap,
                **{
                    "group.id": f"memproj-segment-roll-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    "isolation.level": "read_uncommitted",
                },
            )
        )
        self._timeout = timeout

    def segment_ms(self, topic: str) -> int:
        resource = ConfigResource(ResourceType.TOPIC, topic)
        described = self._admin.describe_configs([resource], request_timeout=self._timeout)
        entries = next(iter(described.values())).result(timeout=self._timeout)
        return int(entries["segment.ms"].value)

    def partitions(self, topic: str) -> list[int]:
        metadata = self._admin.list_topics(topic, timeout=self._timeout).topics[topic]
        if metadata.error is not None:
            raise failed(metadata.error, f"topic {topic}")
        return sorted(metadata.partitions)

    def last_records(
        self, topic: str, partition: int
    ) -> tuple[LastRecord | None, LastRecord | None]:
        """The partition's newest record and the one at the offset before it (None: empty,
        or no record at that offset since the cleaner removed it)."""
        low, high = self._consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=self._timeout
        )
        if high <= low:
            return None, None
        self._consumer.assign([TopicPartition(topic, partition, max(low, high - 2))])
        try:
            previous = None
            deadline = time.monotonic() + self._timeout
            while time.monotonic() < deadline:
                message = self._consumer.poll(0.5)
                if message is None or message.error() is not None:
                    continue
                _, timestamp = message.timestamp()
                record = LastRecord(message.key(), int(timestamp))
                if message.offset() == high - 1:
                    return record, previous
                previous = record
            raise TimeoutError(f"{topic}[{partition}]: offset {high - 1} not read")
        finally:
            self._consumer.unassign()

    def append_marker(self, topic: str, partition: int) -> None:
        errors: list[KafkaError] = []
        self._producer.produce(
            topic,
            None,
            MARKER_KEY,
            partition=partition,
            headers=[(name, value.encode()) for name, value in MARKER_HEADERS],
            on_delivery=lambda error, _message: errors.append(error) if error else None,
        )
        if self._producer.flush(self._timeout) or errors:
            raise RuntimeError(f"{topic}[{partition}]: marker not delivered: {errors or 'timeout'}")

    def close(self) -> None:
        self._consumer.close()
        self._producer.flush(5)


class SegmentRoller(Service):
    """The deletion worker's roll check (see the module docstring)."""

    def __init__(
        self,
        kafka: KafkaSegmentRoller,
        topics: Sequence[str],
        metrics: Metrics,
        interval_seconds: float,
        lease: Lease | None = None,
        **kwargs: Any,
    ) -> None:
        """``lease``: the check runs where it leads (None: here, always)."""
        self._kafka = kafka
        self._lease = lease
        self._topics = list(topics)
        self._metrics = metrics
        self._interval = interval_seconds
        super().__init__(**kwargs)

    @Service.task
    async def _rolling(self) -> None:
        while not self.should_stop:
            await self.sleep(self._interval)
            if self._lease is not None and not await self._lease.leads():
                continue
            for topic in self._topics:
                try:
                    await asyncio.to_thread(self.roll_quiet_partitions, topic)
                except Exception as exc:
                    # The broker away, say: the next round tries again; the worker goes on.
                    log.warning(
                        "segment roll check of %s failed, retried: %s", topic, loggable(exc)
                    )
                    self._metrics.compaction_roll_errors.labels(topic, type(exc).__name__).inc()

    def roll_quiet_partitions(self, topic: str) -> list[int]:
        """Append a marker to each partition of ``topic`` that needs one; returns them."""
        segment_ms = self._kafka.segment_ms(topic)
        rolled = []
        for partition in self._kafka.partitions(topic):
            last, previous = self._kafka.last_records(topic, partition)
            if needs_roll(last, int(time.time() * 1000), segment_ms, previous):
                self._kafka.append_marker(topic, partition)
                self._metrics.compaction_rolls.labels(topic).inc()
                rolled.append(partition)
        if rolled:
            log.info("rolled the active segment of %s partitions %s", topic, rolled)
        return rolled

    async def on_stop(self) -> None:
        await asyncio.to_thread(self._kafka.close)


def segment_rollers(
    settings: Settings, metrics: Metrics, lease: Lease | None = None
) -> list[Service]:
    """The deletion worker's roll check of the compacted topics erasures write nulls to, run
    where ``lease`` leads."""
    return [
        SegmentRoller(
            KafkaSegmentRoller(settings.kafka),
            [settings.topics.name(MEMORY_CURRENT)],
            metrics,
            settings.compaction_roll_check_seconds,
            lease,
        )
    ]
