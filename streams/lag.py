"""Consumer lag of every memproj consumer group, in messages and in seconds.

Seconds are the age of the oldest unconsumed message itself: the broker timestamp of the
message at the group's committed offset. That stays true while a group replays from the start
(old messages are old) or a topic is idle (nothing unconsumed: 0), where interpolating offsets
over wall-clock time would not.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient


@dataclass(frozen=True, slots=True)
class PartitionLag:
    group: str
    topic: str
    partition: int
    committed: int | None  # None: the group has not committed on this partition
    end: int
    messages: int
    seconds: float


class LagCollector:
    def __init__(
        self,
        bootstrap: str,
        group_prefix: str,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        timeout: float = 10.0,
    ) -> None:
        self._bootstrap = bootstrap
        self._prefix = group_prefix + "-"
        self._clock = clock
        self._timeout = timeout
        self._admin = AdminClient({"bootstrap.servers": bootstrap})

    def groups(self) -> list[str]:
        listed = self._admin.list_consumer_groups(request_timeout=self._timeout).result()
        return sorted(g.group_id for g in listed.valid if g.group_id.startswith(self._prefix))

    def collect(self, groups: Iterable[str] | None = None) -> list[PartitionLag]:
        wanted = list(self.groups() if groups is None else groups)
        committed: dict[tuple[str, str, int], int | None] = {}
        # One request per group (the admin API takes one at a time), all in flight together.
        requests = {
            group: self._admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group)], request_timeout=self._timeout
            )[group]
            for group in wanted
        }
        for group, request in requests.items():
            for tp in request.result().topic_partitions:
                offset = None if tp.offset == OFFSET_INVALID or tp.offset < 0 else tp.offset
                committed[(group, tp.topic, tp.partition)] = offset
        if not committed:
            return []
        consumer = self._probe()
        try:
            watermarks = {
                (topic, partition): consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=self._timeout
                )
                for _, topic, partition in committed
            }
            # Where each lagging group stands: the first unconsumed message's offset.
            heads = {
                key: max(offset if offset is not None else 0, watermarks[key[1:]][0])
                for key, offset in committed.items()
                if (offset if offset is not None else 0) < watermarks[key[1:]][1]
            }
            stamps = self._timestamps(consumer, heads)
        finally:
            consumer.close()
        now = self._clock()
        lags = []
        for (group, topic, partition), offset in sorted(committed.items()):
            low, end = watermarks[(topic, partition)]
            start = max(offset if offset is not None else 0, low)
            head = heads.get((group, topic, partition))
            stamp = stamps.get((topic, partition, head)) if head is not None else None
            lags.append(
                PartitionLag(
                    group=group,
                    topic=topic,
                    partition=partition,
                    committed=offset,
                    end=end,
                    messages=max(0, end - start),
                    seconds=max(0.0, (now - stamp).total_seconds()) if stamp else 0.0,
                )
            )
        return lags

    def _probe(self) -> Consumer:
        return Consumer(
            {
                "bootstrap.servers": self._bootstrap,
                "group.id": f"memproj-lag-probe-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.partition.eof": False,
            }
        )

    def _timestamps(
        self, consumer: Consumer, heads: dict[tuple[str, str, int], int]
    ) -> dict[tuple[str, int, int], datetime]:
        """The timestamp of the message at each head offset (one fetch per partition)."""
        wanted = {(topic, partition, offset) for (_, topic, partition), offset in heads.items()}
        found: dict[tuple[str, int, int], datetime] = {}
        for topic, partition, offset in sorted(wanted):
            consumer.assign([TopicPartition(topic, partition, offset)])
            message = consumer.poll(self._timeout)
            if message is None or message.error() is not None:
                error = message.error() if message is not None else None
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(f"lag probe of {topic}[{partition}]: {error}")
                continue
            _kind, millis = message.timestamp()
            found[(topic, partition, offset)] = datetime.fromtimestamp(millis / 1000, UTC)
        return found
