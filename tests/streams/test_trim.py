"""Raw input dropped once sealed (streams.trim): the decision alone, then the memory worker
(which seals its raw topic) and the trimmer against the real Kafka and PostgreSQL:
records below its committed raw offsets are deleted, records it has not committed are not,
failures never raise."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry
from psycopg_pool import AsyncConnectionPool

from projections.sql import Conn
from streams.kafka import admin_config
from streams.lag import watermarks
from streams.metrics import Metrics
from streams.progress import end_offsets
from streams.sample import EventFactory
from streams.services import make_pool
from streams.trim import (
    KafkaRecordDeleter,
    RawInputTrimmer,
    behind,
    classify,
    plan_trim,
)
from topics.registry import MEMORY_EVENTS, MEMORY_SEALED

RAW = {"p.memory.events", "p.conversation.events"}


def test_the_plan_trims_each_raw_partition_to_its_committed_offset_once() -> None:
    committed = {
        ("p.memory.events", 0): 12,
        ("p.memory.events", 1): 0,
        ("p.conversation.events", 3): 7,
        ("p.memory.events.sealed", 0): 40,  # not raw input: never trimmed
    }
    assert plan_trim(committed, {}, RAW) == {
        ("p.conversation.events", 3): 7,
        ("p.memory.events", 0): 12,
    }
    # Already trimmed that far: nothing to ask; further: the new offset.
    trimmed = {("p.memory.events", 0): 12, ("p.conversation.events", 3): 5}
    assert plan_trim(committed, trimmed, RAW) == {("p.conversation.events", 3): 7}
    assert behind(committed, trimmed, RAW) == {"p.conversation.events": 2, "p.memory.events": 0}


def test_errors_that_pass_by_themselves_are_transient_the_rest_refused() -> None:
    assert classify(KafkaError._TRANSPORT, False) == "transient"
    assert classify(KafkaError.NOT_LEADER_FOR_PARTITION, False) == "transient"
    assert classify(KafkaError.UNKNOWN, True) == "transient"
    assert classify(KafkaError.TOPIC_AUTHORIZATION_FAILED, False) == "refused"
    assert classify(KafkaError.POLICY_VIOLATION, False) == "refused"
    assert classify(KafkaError.OFFSET_OUT_OF_RANGE, False) == "refused"


# -- against the real services ---------------------------------------------------------------


def low_watermarks(env: Any, topic: str) -> dict[int, int]:
    admin = AdminClient(admin_config(env.settings.kafka_bootstrap))
    ends = end_offsets(env.settings.kafka_bootstrap, topic)
    marks = watermarks(admin, ((topic, p) for p in ends), 10)
    return {partition: low for (_, partition), (low, _) in marks.items()}


def sealer_offsets(env: Any, topic: str) -> dict[int, int]:
    """The raw offsets the memory worker (which seals the raw topic) committed."""
    with env.connect() as conn:
        rows = conn.execute(
            "SELECT partition, next_offset FROM projection_offsets"
            " WHERE projection = 'memory' AND topic = %s",
            (topic,),
        ).fetchall()
    return {int(p): int(o) for p, o in rows}


def trimmer(env: Any, deleter: Any, metrics: Metrics) -> tuple[RawInputTrimmer, Any]:
    pool: AsyncConnectionPool[Conn] = make_pool(env.settings.postgres_dsn, 1)
    raw = [env.topic(MEMORY_EVENTS)]
    return RawInputTrimmer(pool, deleter, "memory", raw, metrics, 1.0), pool


def trim_once(env: Any, deleter: Any, metrics: Metrics) -> dict[Any, Any]:
    service, pool = trimmer(env, deleter, metrics)

    async def run() -> dict[Any, Any]:
        await pool.open(wait=True)
        try:
            return await service.trim_once()
        finally:
            await pool.close()

    return asyncio.run(run())


def metric(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.integration
def test_the_sealer_deletes_raw_records_it_committed_and_keeps_the_rest(env: Any) -> None:
    topic = env.topic(MEMORY_EVENTS)
    f = EventFactory(id_prefix="trim")
    sealer = env.worker("memory", raw_input_trim_seconds=0.5)  # it seals the raw topic
    produced = time.monotonic()
    env.produce_events(f.proposed("acme", f"m{i}") for i in range(30))

    def trimmed_to_committed() -> dict[int, int] | None:
        committed = sealer_offsets(env, topic)
        ends = end_offsets(env.settings.kafka_bootstrap, topic)
        lows = low_watermarks(env, topic)
        done = committed and all(lows[p] == committed.get(p, 0) == ends[p] for p in ends)
        return lows if done else None

    lows = env.wait_until(trimmed_to_committed, "raw input trimmed to the sealer's offsets")
    print(f"raw plaintext window, worker starting: {time.monotonic() - produced:.2f}s")
    assert sum(lows.values()) == 30
    # Running: the window is the sealer's batch plus at most one trim interval.
    produced = time.monotonic()
    env.produce_events(f.proposed("acme", f"n{i}") for i in range(10))
    env.wait_until(
        lambda: (lows := trimmed_to_committed()) and sum(lows.values()) == 40, "40 trimmed"
    )
    print(f"raw plaintext window, worker running: {time.monotonic() - produced:.2f}s")
    lows = low_watermarks(env, topic)
    assert env.read(MEMORY_EVENTS) == []  # nothing raw is readable any more
    assert len(env.read_messages(MEMORY_SEALED)) == 40  # the sealed copies stay

    # Stopped, the sealer commits nothing: what arrives now is never trimmed, even by a
    # trimmer that runs (the offsets come from PostgreSQL, not from anyone's position).
    sealer.stop()
    env.produce_events(f.proposed("acme", f"late{i}") for i in range(5))
    results = trim_once(
        env, KafkaRecordDeleter(env.settings.kafka_bootstrap), Metrics(CollectorRegistry())
    )
    assert all(not isinstance(r, KafkaError) for r in results.values())
    assert low_watermarks(env, topic) == lows
    assert len(env.read(MEMORY_EVENTS)) == 5

    # Started again, it seals them and trims them.
    env.worker("memory", raw_input_trim_seconds=0.5)
    lows = env.wait_until(trimmed_to_committed, "the restarted sealer trimmed the late records")
    assert sum(lows.values()) == 45 and env.read(MEMORY_EVENTS) == []


@pytest.mark.integration
def test_a_refused_or_failed_trim_is_counted_and_never_raises(env: Any) -> None:
    topic = env.topic(MEMORY_EVENTS)
    env.produce_events(EventFactory(id_prefix="r").proposed("acme", f"m{i}") for i in range(3))
    # The broker refuses an offset beyond the log's end (a topic recreated under old offsets).
    with env.connect() as conn:
        conn.execute(
            "INSERT INTO projection_offsets (projection, topic, partition, next_offset)"
            " VALUES ('memory', %s, 0, 1000)",
            (topic,),
        )
    metrics = Metrics(CollectorRegistry())
    results = trim_once(env, KafkaRecordDeleter(env.settings.kafka_bootstrap), metrics)
    error = results[(topic, 0)]
    assert isinstance(error, KafkaError) and error.code() == KafkaError.OFFSET_OUT_OF_RANGE
    labels = {"topic": topic, "kind": "refused", "error": "OFFSET_OUT_OF_RANGE"}
    assert metric(metrics, "memproj_raw_trim_errors_total", **labels) == 1
    assert metric(metrics, "memproj_raw_trim_behind_records", topic=topic) == 1000

    # No broker at all: transient, counted, retried next round.
    metrics = Metrics(CollectorRegistry())
    results = trim_once(env, KafkaRecordDeleter("127.0.0.1:1", timeout=2), metrics)
    assert isinstance(results[(topic, 0)], KafkaError)
    samples = [
        s
        for family in metrics.registry.collect()
        if family.name == "memproj_raw_trim_errors"
        for s in family.samples
        if s.name.endswith("_total")
    ]
    assert [s.labels["kind"] for s in samples] == ["transient"]
