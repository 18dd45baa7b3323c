"""Consumer lag in messages and seconds, against the real broker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from streams.kafka import producer_config
from streams.lag import LagCollector
from topics.registry import MEMORY_EVENTS

pytestmark = pytest.mark.integration


def commit(env: Any, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = Consumer({"bootstrap.servers": env.settings.kafka_bootstrap, "group.id": group})
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
