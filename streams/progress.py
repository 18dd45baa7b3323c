"""How far a projection has got: its tracked offsets against the topics' end offsets.

Used by the demo, the benchmark and the tests to wait for "caught up" instead of sleeping.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from confluent_kafka import Consumer, TopicPartition

from projections import bookkeeping
from projections.bookkeeping import Conn
from topics.registry import SEALED_TOPICS, TopicNames, TopicSpec

SEALED = {spec.base_name.removesuffix(".sealed"): spec for spec in SEALED_TOPICS}


def end_offsets(bootstrap: str, topic: str, timeout: float = 10.0) -> dict[int, int]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"memproj-probe-{uuid.uuid4().hex}"}
    )
    try:
        metadata = consumer.list_topics(topic, timeout=timeout).topics[topic]
        if metadata.error is not None:
            raise RuntimeError(f"topic {topic}: {metadata.error}")
        return {
            partition: consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout
            )[1]
            for partition in metadata.partitions
        }
    finally:
        consumer.close()


def committed_offsets(
    bootstrap: str, group: str, topic: str, timeout: float = 10.0
) -> dict[int, int]:
    """The offsets a consumer group has committed on ``topic`` (partitions without one: 0)."""
    ends = end_offsets(bootstrap, topic, timeout)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        committed = consumer.committed(
            [TopicPartition(topic, partition) for partition in ends], timeout=timeout
        )
    finally:
        consumer.close()
    return {tp.partition: max(tp.offset, 0) for tp in committed}


def remaining(ends: dict[int, int], tracked: dict[tuple[str, int], int], topic: str) -> int:
    return sum(max(0, end - tracked.get((topic, partition), 0)) for partition, end in ends.items())


async def wait_caught_up(
    conn: Conn,
    bootstrap: str,
    projection: str,
    topic: str,
    deadline_seconds: float = 120.0,
    interval: float = 0.2,
) -> None:
    """Return once the projection has applied everything in ``topic`` as of this call and
    published what that produced."""
    ends = await asyncio.to_thread(end_offsets, bootstrap, topic)
    deadline = time.monotonic() + deadline_seconds
    while True:
        tracked = await bookkeeping.load_offsets(conn, projection)
        unpublished = len(await bookkeeping.pending_outbox(conn, projection, limit=1))
        await conn.rollback()  # end the read transaction so the next poll sees new commits
        left = remaining(ends, tracked, topic)
        if left == 0 and not unpublished:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{projection}: {left} messages of {topic} still to apply")
        await asyncio.sleep(interval)


async def wait_pipeline(
    conn: Conn,
    bootstrap: str,
    topics: TopicNames,
    raw: TopicSpec,
    projection: str,
    deadline_seconds: float = 120.0,
    interval: float = 0.2,
) -> None:
    """Wait until ``projection`` has applied everything in ``raw`` as of this call: through the
    sealer first when the projection reads the sealed log, then the projection itself."""
    sealed = SEALED.get(raw.base_name)
    if sealed is None:
        await wait_caught_up(
            conn, bootstrap, projection, topics.name(raw), deadline_seconds, interval
        )
        return
    await wait_caught_up(conn, bootstrap, "sealer", topics.name(raw), deadline_seconds, interval)
    await wait_caught_up(
        conn, bootstrap, projection, topics.name(sealed), deadline_seconds, interval
    )
