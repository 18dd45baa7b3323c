"""Contract 1.1: producers may write with Kafka transactions; memproj reads committed data only.

Against the real broker: a transactional producer writes to the memory input topic, and the
memory worker (which seals, then projects) applies what was committed, never what was aborted,
and the progress and lag helpers call it caught up although transaction markers and aborted
messages (offsets no committed reader receives) sit at the end of the partitions.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any

import pytest
from confluent_kafka import IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from streams.kafka import admin_config, producer_config
from streams.lag import LagCollector
from streams.sample import EventFactory, RawEvent, to_message
from topics.registry import MEMORY_EVENTS, MEMORY_REJECTIONS, MEMORY_SEALED


def transactional_producer(env: Any) -> Producer:
    producer = Producer(
        producer_config(
            env.settings.kafka_bootstrap,
            **{"transactional.id": f"{env.settings.group_prefix}-tx-{uuid.uuid4().hex}"},
        )
    )
    producer.init_transactions(30)
    return producer


def produce_in_transaction(
    producer: Producer, topic: str, events: Iterable[RawEvent], partition: int | None = None
) -> None:
    producer.begin_transaction()
    for event in events:
        key, value = to_message(event)
        if partition is None:
            producer.produce(topic, value, key)
        else:
            producer.produce(topic, value, key, partition=partition)
    assert producer.flush(30) == 0


def wait_markers_written(bootstrap: str, topic: str, seconds: float = 30) -> None:
    """Ending a transaction returns once the coordinator has decided; the markers reach the
    partitions after that. Wait until no partition has anything beyond its stable offset."""
    admin = AdminClient(admin_config(bootstrap))
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
    specs = {TopicPartition(topic, p): OffsetSpec.latest() for p in partitions}  # type: ignore[no-untyped-call]
    deadline = time.monotonic() + seconds

    def ends(level: Any) -> dict[int, int]:
        futures = admin.list_offsets(specs, isolation_level=level, request_timeout=10)
        return {tp.partition: future.result().offset for tp, future in futures.items()}

    while ends(IsolationLevel.READ_COMMITTED) != ends(IsolationLevel.READ_UNCOMMITTED):
        assert time.monotonic() < deadline, f"transaction markers of {topic} not written"
        time.sleep(0.1)


def stored_memories(env: Any) -> dict[str, str]:
    with env.connect() as conn:
        rows = conn.execute("SELECT memory_id, status FROM memories").fetchall()
    return {row[0]: row[1] for row in rows}


# -- the pipeline ---------------------------------------------------------------------------


@pytest.mark.integration
def test_aborted_transactions_are_never_applied_and_committed_ones_are(env: Any) -> None:
    topic = env.topic(MEMORY_EVENTS)
    bootstrap = env.settings.kafka_bootstrap
    partitions = MEMORY_EVENTS.partitions
    f = EventFactory(id_prefix=f"tx{uuid.uuid4().hex[:6]}")
    producer = transactional_producer(env)

    plain_1 = [f.proposed("acme", f"m_plain1_{i}") for i in range(4)]
    aborted = [f.proposed("acme", f"m_aborted_{i}") for i in range(6)]
    aborted.append(f.verified("acme", "m_plain1_0", 1))  # would verify a real memory
    plain_2 = [f.proposed("acme", f"m_plain2_{i}") for i in range(4)]
    committed = [f.proposed("acme", f"m_committed_{i}") for i in range(6)]
    committed.append(f.verified("acme", "m_plain2_0", 1))
    opened = [f.proposed("acme", f"m_open_{i}") for i in range(4)]
    plain_3 = [f.proposed("acme", f"m_plain3_{i}") for i in range(4)]
    tail = [f.proposed("acme", f"m_tail_{p}") for p in range(partitions)]

    env.produce_events(plain_1)
    produce_in_transaction(producer, topic, aborted)
    producer.abort_transaction(30)
    env.produce_events(plain_2)
    produce_in_transaction(producer, topic, committed)
    producer.commit_transaction(30)
    produce_in_transaction(producer, topic, opened)  # left open for now
    env.produce_events(plain_3)

    env.worker("memory")  # it seals, then projects
    ahead = {e["payload"]["memory_id"] for e in plain_1 + plain_2 + committed}
    env.wait_until(lambda: ahead <= set(stored_memories(env)), "the committed events")
    # The open transaction holds back what follows it on its partitions (the last stable
    # offset), never longer than it stays open; its own events wait for its commit.
    time.sleep(2)
    never_yet = {e["payload"]["memory_id"] for e in opened + aborted[:-1]}
    assert not never_yet & set(stored_memories(env))
    producer.commit_transaction(30)

    # The partitions end in an aborted transaction and its marker: offsets that a committed
    # reader never receives, after everything the workers apply.
    other = transactional_producer(env)
    other.begin_transaction()
    for p, event in enumerate(tail):
        key, value = to_message(event)
        other.produce(topic, value, key, partition=p)
    assert other.flush(30) == 0
    other.abort_transaction(30)
    wait_markers_written(bootstrap, topic)

    env.wait_caught_up()

    memories = stored_memories(env)
    applied = plain_1 + plain_2 + committed + opened + plain_3
    expected = {e["payload"]["memory_id"] for e in applied if e["event_type"] == "memory.proposed"}
    assert set(memories) == expected
    assert memories["m_plain1_0"] == "proposed"  # the aborted verification is not applied
    assert memories["m_plain2_0"] == "verified"  # the committed one is

    never = {e["event_id"] for e in aborted + tail}
    sealed = {value["event_id"] for _, value in env.read(MEMORY_SEALED) if value}
    assert sealed == {e["event_id"] for e in applied}
    assert not never & sealed
    with env.connect() as conn:
        processed = {row[0] for row in conn.execute("SELECT event_id FROM processed_events")}
        rejected = conn.execute("SELECT count(*) FROM rejections").fetchone()[0]
    assert not never & processed
    assert rejected == 0
    assert env.read(MEMORY_REJECTIONS) == []
    assert env.read(MEMORY_EVENTS, ".dlq") == []
    assert env.read(MEMORY_SEALED, ".dlq") == []

    # The workers' groups commit up to the aborted tail; a committed reader has nothing left.
    groups = [env.settings.group_id("memory")]
    collector = LagCollector(bootstrap, env.settings.group_prefix)

    last: list[Any] = []

    def lag_gone() -> bool:
        last[:] = collector.collect(groups)
        return {lag.group for lag in last} == set(groups) and all(
            (lag.messages, lag.seconds) == (0, 0.0) for lag in last
        )

    try:
        env.wait_until(lag_gone, "no consumer lag", seconds=30)
    except AssertionError:
        raise AssertionError(
            f"consumer lag left: {[lag for lag in last if lag.messages]}"
        ) from None
    # Offsets alone would call that lag: the memory group stands short of the end, at the
    # aborted tail (on every partition it has committed on).
    raw = [lag for lag in collector.collect([groups[0]]) if lag.topic == topic]
    assert raw
    assert all(lag.committed is not None and lag.committed < lag.end for lag in raw)
