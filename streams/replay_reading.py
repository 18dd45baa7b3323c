"""Reading a fixed range of a topic's partitions for a replay, with a committed reader: from
a start position (the earliest offsets, a time, or offsets per partition) up to the end
offsets as of the start, in batches, counting the progress. No group, no commits: a replay
reads the log without moving anyone's position.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from confluent_kafka import Consumer, KafkaError, TopicPartition

from streams.kafka import consumer_config, failed, gather, input_message
from streams.settings import Settings
from topics.messages import InputMessage

Start = Literal["earliest"] | datetime | dict[int, int]
Position = tuple[str, int]


@dataclass(slots=True)
class Progress:
    total: int
    done: int = 0
    partitions: int = 0
    partitions_done: int = 0
    started: float = field(default_factory=time.monotonic)

    @classmethod
    def of(cls, starts: dict[Position, int], ends: dict[Position, int]) -> Progress:
        """Nothing done yet of the messages from ``starts`` to ``ends``."""
        return cls(total=sum(max(0, ends[p] - starts[p]) for p in ends))

    @property
    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.done / elapsed if elapsed > 0 else 0.0


def reader(settings: Settings) -> Consumer:
    """A committed reader (contract 1.1): its watermark queries end at the last stable
    offset, and it reports reaching the end of a partition, so that a read whose end lies
    behind transaction markers or aborted messages (offsets it never receives) still ends."""
    return Consumer(
        consumer_config(
            settings.kafka,
            **{
                "group.id": f"memproj-replay-{uuid.uuid4().hex}",  # never commits: no group
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            },
        )
    )


def partitions_of(consumer: Consumer, topics: Sequence[str]) -> list[Position]:
    positions: list[Position] = []
    for topic in topics:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        positions += [(topic, partition) for partition in sorted(metadata.partitions)]
    return positions


def positions(
    consumer: Consumer, topics: Sequence[str], start: Start
) -> tuple[dict[Position, int], dict[Position, int]]:
    """Start and end offsets per partition; the end is fixed when the replay begins."""
    starts: dict[Position, int] = {}
    ends: dict[Position, int] = {}
    for topic, partition in partitions_of(consumer, topics):
        # ``reader`` is a committed reader: ``high`` is the last stable offset.
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        ends[(topic, partition)] = high
        if start == "earliest":
            starts[(topic, partition)] = low
        elif isinstance(start, dict):
            starts[(topic, partition)] = max(low, start.get(partition, low))
        else:
            millis = int(start.timestamp() * 1000)
            (found,) = consumer.offsets_for_times(
                [TopicPartition(topic, partition, millis)], timeout=10
            )
            starts[(topic, partition)] = high if found.offset < 0 else found.offset
    return starts, ends


def read(
    consumer: Consumer,
    starts: dict[Position, int],
    ends: dict[Position, int],
    batch_size: int,
    progress: Progress | None = None,
) -> Iterator[list[InputMessage]]:
    """The messages between ``starts`` and ``ends``, in batches, in partition order."""
    wanted = {pos: end for pos, end in ends.items() if starts.get(pos, end) < end}
    if progress is not None:
        progress.partitions = len(ends)
        progress.partitions_done = len(ends) - len(wanted)
    if not wanted:
        return
    consumer.assign([TopicPartition(t, p, starts[(t, p)]) for t, p in wanted])
    while wanted:
        batch: list[InputMessage] = []
        for message in gather(consumer, batch_size, 1.0, done=lambda: not wanted):
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            error = message.error()
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                raise failed(error, "replay read")
            assert topic is not None and partition is not None and offset is not None
            position = (topic, partition)
            end = wanted.get(position)
            if end is not None and error is not None and offset >= end:
                # Nothing more for a committed reader up to the end: what is left are
                # offsets it never receives (transaction markers, aborted messages).
                del wanted[position]
                if progress is not None:
                    progress.partitions_done += 1
                continue
            if end is None or error is not None or offset >= end:
                continue
            batch.append(input_message(message))
            if offset + 1 >= end:
                del wanted[position]
                if progress is not None:
                    progress.partitions_done += 1
        if batch:
            yield batch
    consumer.unassign()


async def apply_range(
    consumer: Consumer,
    starts: dict[Position, int],
    ends: dict[Position, int],
    batch_size: int,
    apply: Callable[[list[InputMessage]], Awaitable[object]],
    on_progress: Callable[[Progress], None] | None,
) -> Progress:
    """Apply the messages between ``starts`` and ``ends`` batch by batch (``read``), telling
    ``on_progress`` after each batch."""
    progress = Progress.of(starts, ends)
    for batch in read(consumer, starts, ends, batch_size, progress):
        await apply(batch)
        progress.done += len(batch)
        if on_progress is not None:
            on_progress(progress)
    return progress
