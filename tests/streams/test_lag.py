"""Consumer lag in messages and seconds, against the real broker."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import Future
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from streams.kafka import admin_config, consumer_config, producer_config
from streams.lag import LagCollector, watermarks
from topics.registry import MEMORY_EVENTS

pytestmark = pytest.mark.integration


def commit(env: Any, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = Consumer(consumer_config(env.settings.kafka_bootstrap, **{"group.id": group}))
    consumer.commit(
        offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False
    )
    consumer.close()


def test_lag_seconds_is_the_age_of_the_oldest_unconsumed_message(env: Any) -> None:
    topic = env.topic(MEMORY_EVENTS)
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    producer = Producer(producer_config(env.settings.kafka_bootstrap))
    # Ten messages on partition 0, a minute apart, starting an hour ago.
    for i in range(10):
        stamp = hour_ago + timedelta(minutes=i)
        producer.produce(topic, b"x", b"k", partition=0, timestamp=int(stamp.timestamp() * 1000))
    assert producer.flush(10) == 0
    prefix = env.settings.group_prefix
    replaying, caught_up = f"{prefix}-replaying", f"{prefix}-caught-up"
    commit(env, replaying, topic, {0: 3})  # consumed 0..2: the oldest unconsumed is #3
    commit(env, caught_up, topic, {0: 10})

    lags = {
        (lag.group, lag.partition): lag
        for lag in LagCollector(env.settings.kafka_bootstrap, prefix).collect()
    }
    behind = lags[(replaying, 0)]
    assert behind.messages == 7
    expected = (datetime.now(UTC) - (hour_ago + timedelta(minutes=3))).total_seconds()
    assert abs(behind.seconds - expected) < 2, (behind.seconds, expected)
    idle = lags[(caught_up, 0)]
    assert (idle.messages, idle.seconds) == (0, 0.0)

    # An idle, caught-up group stays at 0 however much later it is measured: no growing age.
    later = datetime.now(UTC) + timedelta(hours=6)
    again = LagCollector(env.settings.kafka_bootstrap, prefix, clock=lambda: later)
    assert [(lag.messages, lag.seconds) for lag in again.collect([caught_up])] == [(0, 0.0)]
    assert again.collect([replaying])[0].seconds > 6 * 3600


def stable_offset(env: Any, topic: str, partition: int = 0) -> tuple[int, int]:
    """(last stable offset, high watermark)"""
    admin = AdminClient(admin_config(env.settings.kafka_bootstrap))
    tp = TopicPartition(topic, partition)
    offsets = {}
    for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
        futures = admin.list_offsets(
            {tp: OffsetSpec.latest()},  # type: ignore[no-untyped-call]
            isolation_level=level,
            request_timeout=10,
        )
        offsets[level] = next(iter(futures.values())).result().offset
    return int(offsets[IsolationLevel.READ_COMMITTED]), int(
        offsets[IsolationLevel.READ_UNCOMMITTED]
    )


def wait_stable(env: Any, topic: str, end: int) -> None:
    """Ending a transaction returns before its marker is on the partition: wait for it."""
    deadline = time.monotonic() + 30
    while stable_offset(env, topic) != (end, end):
        assert time.monotonic() < deadline, stable_offset(env, topic)
        time.sleep(0.1)


def test_lag_counts_only_what_a_committed_reader_can_still_receive(env: Any) -> None:
    """Transaction markers and aborted messages occupy offsets that no committed reader ever
    receives: a group whose only unconsumed offsets are those has no lag, and an open
    transaction's messages are not lag until it commits."""
    topic = env.topic(MEMORY_EVENTS)
    bootstrap = env.settings.kafka_bootstrap
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    millis = int(hour_ago.timestamp() * 1000)
    plain = Producer(producer_config(bootstrap))
    tx = Producer(producer_config(bootstrap, **{"transactional.id": f"lag-{uuid.uuid4().hex}"}))
    tx.init_transactions(30)

    def transaction(count: int, commit: bool) -> None:
        tx.begin_transaction()
        for _ in range(count):
            tx.produce(topic, b"tx", b"k", partition=0)
        assert tx.flush(10) == 0
        if commit:
            tx.commit_transaction(30)
        else:
            tx.abort_transaction(30)

    # Partition 0: 0-2 plain | 3-4 aborted, 5 marker | 6 plain, an hour old |
    # 7-8 committed, 9 marker | 10-11 aborted, 12 marker
    for _ in range(3):
        plain.produce(topic, b"x", b"k", partition=0)
    assert plain.flush(10) == 0
    transaction(2, commit=False)
    wait_stable(env, topic, 6)
    plain.produce(topic, b"old", b"k", partition=0, timestamp=millis)
    assert plain.flush(10) == 0
    transaction(2, commit=True)
    transaction(2, commit=False)
    wait_stable(env, topic, 13)

    prefix = env.settings.group_prefix
    groups = {
        "after-aborted-tail": 13,  # consumed everything: at the end
        "before-aborted-tail": 10,  # only the aborted 10-11 and the marker 12 are left
        "at-commit-marker": 9,  # only the commit marker 9, then the aborted tail
        "before-aborted-head": 3,  # the aborted 3-4 and the marker, then 6: an hour old
    }
    for name, offset in groups.items():
        commit(env, f"{prefix}-{name}", topic, {0: offset})
    collector = LagCollector(bootstrap, prefix)

    def lags() -> dict[str, tuple[int, float, int]]:
        return {
            lag.group.removeprefix(prefix + "-"): (lag.messages, lag.seconds, lag.end)
            for lag in collector.collect([f"{prefix}-{name}" for name in groups])
            if lag.partition == 0
        }

    found = lags()
    for name in ("after-aborted-tail", "before-aborted-tail", "at-commit-marker"):
        assert found[name] == (0, 0.0, 13), name
    messages, seconds, end = found["before-aborted-head"]
    assert (messages, end) == (13 - 6, 13)  # from the first message it will receive
    assert abs(seconds - (datetime.now(UTC) - hour_ago).total_seconds()) < 5

    # An open transaction: its messages are beyond the last stable offset, not lag.
    tx.begin_transaction()
    tx.produce(topic, b"open", b"k", partition=0)  # offset 13
    assert tx.flush(10) == 0
    plain.produce(topic, b"after", b"k", partition=0)  # offset 14, held back with it
    assert plain.flush(10) == 0
    assert stable_offset(env, topic) == (13, 15)
    assert lags()["before-aborted-tail"] == (0, 0.0, 13)
    tx.commit_transaction(30)
    wait_stable(env, topic, 16)
    messages, seconds, end = lags()["before-aborted-tail"]
    assert end == 16 and messages == 16 - 13 and seconds < 60


class RefusingOnce:
    """An admin client whose first ``list_offsets`` answer for each partition is the
    retriable refusal a broker gives while a new topic's leader is being elected."""

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.asked: dict[tuple[str, int], int] = {}

    def list_offsets(self, requests: dict[TopicPartition, Any], **_: Any) -> dict[Any, Any]:
        answers: dict[Any, Any] = {}
        for tp in requests:
            key = (tp.topic, tp.partition)
            self.asked[key] = self.asked.get(key, 0) + 1
            future: Future[Any] = Future()
            if self.asked[key] == 1:
                future.set_exception(
                    KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
                )
            else:
                future.set_result(type("Answer", (), {"offset": self.offset})())
            answers[tp] = future
        return answers


def test_watermarks_ask_again_while_a_leader_is_elected() -> None:
    admin = RefusingOnce(offset=7)
    marks = watermarks(admin, [("t", 0), ("t", 1)], timeout=5)  # type: ignore[arg-type]
    assert marks == {("t", 0): (7, 7), ("t", 1): (7, 7)}


def test_watermarks_raise_a_refusal_that_is_not_retriable() -> None:
    class Refusing:
        def list_offsets(self, requests: dict[TopicPartition, Any], **_: Any) -> dict[Any, Any]:
            answers: dict[Any, Any] = {}
            for tp in requests:
                future: Future[Any] = Future()
                future.set_exception(
                    KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
                )
                answers[tp] = future
            return answers

    with pytest.raises(KafkaException):
        watermarks(Refusing(), [("t", 0)], timeout=5)  # type: ignore[arg-type]
