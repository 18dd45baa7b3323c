"""How far a projection has got: its tracked offsets against the topics' end offsets.

Used by the demo, the benchmark and the tests to wait for "caught up" instead of sleeping.

The end is what a committed reader sees (contract 1.1): the last stable offset. Offsets a
committed reader never receives (transaction markers, aborted messages) can sit between a
projection's next offset and the end; a partition that looks behind is probed with a committed
reader (``streams.lag.first_visible``) and counts as caught up when nothing is left for it.
"""

from __future__ import annotations

import asyncio
import time

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from projections import bookkeeping, outbox
from projections.sql import Conn
from streams.kafka import KafkaTarget, admin_config, consumer_config, failed
from streams.lag import first_visible, watermarks
from topics.registry import SEALED_TOPICS, TopicNames, TopicSpec

SEALED = {spec.base_name.removesuffix(".sealed"): spec for spec in SEALED_TOPICS}


def end_offsets(bootstrap: KafkaTarget, topic: str, timeout: float = 10.0) -> dict[int, int]:
    """The last stable offset of every partition of ``topic``: where a committed reader's
    partition ends (the high watermark, unless a transaction is open)."""
    admin = AdminClient(admin_config(bootstrap))
    metadata = admin.list_topics(topic, timeout=timeout).topics[topic]
    if metadata.error is not None:
        raise failed(metadata.error, f"topic {topic}")
    marks = watermarks(admin, ((topic, partition) for partition in metadata.partitions), timeout)
    return {partition: end for (_, partition), (_, end) in marks.items()}


def committed_offsets(
    bootstrap: KafkaTarget, group: str, topic: str, timeout: float = 10.0
) -> dict[int, int]:
    """The offsets a consumer group has committed on ``topic`` (partitions without one: 0)."""
    ends = end_offsets(bootstrap, topic, timeout)
    consumer = Consumer(consumer_config(bootstrap, **{"group.id": group}))
    try:
        committed = consumer.committed(
            [TopicPartition(topic, partition) for partition in ends], timeout=timeout
        )
    finally:
        consumer.close()
    return {tp.partition: max(tp.offset, 0) for tp in committed}


class CommittedProgress:
    """Whether tracked offsets have reached fixed end offsets as a committed reader sees them.

    Offsets alone fall short of the end when the partition ends in transaction markers or
    aborted messages, so a partition behind by offsets is probed. What a probe learns is kept,
    and tracked offsets only grow: a partition found clear from offset ``o`` on is caught up
    at every tracked offset from ``o``; one with a committed message at ``h`` still to apply
    is not probed again until its tracked offset passes ``h``.
    """

    def __init__(self, bootstrap: KafkaTarget, topic: str, ends: dict[int, int]) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.ends = ends
        self._clear_from: dict[int, int] = {}
        self._next_visible: dict[int, int] = {}

    def behind(self, tracked: dict[tuple[str, int], int]) -> dict[int, int]:
        """Partition -> offsets left, for each partition not caught up (empty: all are)."""
        offsets = {p: tracked.get((self.topic, p), 0) for p in self.ends}
        unknown = {
            p: offset
            for p, offset in offsets.items()
            if offset < self.ends[p]
            and offset < self._clear_from.get(p, self.ends[p])
            and offset > self._next_visible.get(p, -1)
        }
        if unknown:
            heads = first_visible(
                self.bootstrap,
                ((self.topic, p, offset) for p, offset in unknown.items()),
                {(self.topic, p): end for p, end in self.ends.items()},
            )
            for p, offset in unknown.items():
                probe = (self.topic, p, offset)
                if probe not in heads:
                    continue  # unanswered: ask again next time
                head = heads[probe]
                if head is None:
                    self._clear_from[p] = min(offset, self._clear_from.get(p, offset))
                else:
                    self._next_visible[p] = head.offset
        return {
            p: self.ends[p] - offset
            for p, offset in offsets.items()
            if offset < self.ends[p] and offset < self._clear_from.get(p, self.ends[p])
        }


async def wait_caught_up(
    conn: Conn,
    bootstrap: KafkaTarget,
    projection: str,
    topic: str,
    deadline_seconds: float = 120.0,
    interval: float = 0.2,
) -> None:
    """Return once the projection has applied everything in ``topic`` as of this call and
    published what that produced."""
    ends = await asyncio.to_thread(end_offsets, bootstrap, topic)
    progress = CommittedProgress(bootstrap, topic, ends)
    deadline = time.monotonic() + deadline_seconds
    while True:
        tracked = await bookkeeping.load_offsets(conn, projection)
        unpublished = len(await outbox.pending_outbox(conn, projection, limit=1))
        await conn.rollback()  # end the read transaction so the next poll sees new commits
        behind = await asyncio.to_thread(progress.behind, tracked)
        if not behind and not unpublished:
            return
        if time.monotonic() > deadline:
            left = sum(behind.values())
            raise TimeoutError(
                f"{projection}: {left} offsets of {topic} still to apply"
                + (f" ({unpublished} outbox messages unpublished)" if unpublished else "")
            )
        await asyncio.sleep(interval)


async def wait_pipeline(
    conn: Conn,
    bootstrap: KafkaTarget,
    topics: TopicNames,
    raw: TopicSpec,
    projection: str,
    deadline_seconds: float = 120.0,
    interval: float = 0.2,
) -> None:
    """Wait until ``projection`` has applied everything in ``raw`` as of this call and
    published what that produced (the sealed log among it): the memory and conversation
    workers seal and project their raw topic in one stage."""
    await wait_caught_up(conn, bootstrap, projection, topics.name(raw), deadline_seconds, interval)
