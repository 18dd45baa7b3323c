"""memory.current's lifetime (streams.compaction, projections.bookkeeping): the roll decision
and the bound alone; then, against the real Kafka and PostgreSQL, topic configs brought up to
the registry, an erased value gone from the log after the real cleaner ran, an outbox
publication and an erasure in either order, and an erasure of a value still in the outbox."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import psycopg
import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from prometheus_client import CollectorRegistry

from projections.embeddings.vectors import VectorStoreMissing
from projections.outbox import (
    OutboxMessage,
    add_to_outbox,
    publish_outbox_batch,
    publish_pending_outbox,
    remove_pending_messages,
)
from streams.cli import cli
from streams.compaction import (
    MARKER_HEADERS,
    MARKER_KEY,
    KafkaSegmentRoller,
    LastRecord,
    SegmentRoller,
    compaction_bound_ms,
    needs_roll,
)
from streams.kafka import admin_config, config_changes, create_topics, delete_topics
from streams.kafka import producer_config as kafka_producer_config
from streams.metrics import Metrics
from streams.sample import EventFactory
from streams.services import open_vector_store
from streams.settings import Settings
from topics.registry import (
    COMPACTION_MAX_LAG_MS,
    COMPACTION_SEGMENT_MS,
    DELETION_REQUESTS,
    MEMORY_CURRENT,
    MEMORY_EVENTS,
    TopicNames,
    entity_headers,
    input_key,
    output_key,
)

# -- the decision and the bound ---------------------------------------------------------------


def test_a_quiet_partition_gets_one_marker_once_its_newest_record_is_older_than_segment_ms() -> (
    None
):
    value = LastRecord(b"acme:m1", 1_000)
    assert not needs_roll(None, 10_000, 1_000)  # empty: nothing to clean
    assert not needs_roll(value, 1_900, 1_000)  # a newer append will still roll it
    assert needs_roll(value, 2_001, 1_000)
    assert not needs_roll(LastRecord(MARKER_KEY, 1_000), 50_000, 1_000)  # rolled already


def test_a_marker_rolled_its_segment_only_if_it_came_segment_ms_after_the_record_before() -> None:
    # A null that rolled the segment itself, then a marker 50 ms later, decided on a read from
    # before the null: they share the active segment, so another marker follows in time.
    null, joined = LastRecord(b"acme:m1", 10_000), LastRecord(MARKER_KEY, 10_050)
    assert not needs_roll(joined, 11_000, 1_000, null)  # a newer append will still roll it
    assert needs_roll(joined, 11_051, 1_000, null)
    rolled = LastRecord(MARKER_KEY, 11_100)
    assert not needs_roll(rolled, 50_000, 1_000, joined)
    assert not needs_roll(joined, 50_000, 1_000, None)  # the record before it cleaned away


def test_the_registry_bounds_compaction_well_within_the_default_deletion_deadline() -> None:
    defaults = Settings()
    bound = compaction_bound_ms(
        COMPACTION_SEGMENT_MS,
        COMPACTION_MAX_LAG_MS,
        int(defaults.compaction_roll_check_seconds * 1000),
    )
    assert bound == 2 * 10 * 60_000 + 60_000 + 15_000  # 21 min 15 s
    # Half the SLO at most: the rest is for the erasure itself and the cleaning.
    assert bound <= defaults.deletion_deadline_seconds * 1000 / 2
    assert MEMORY_CURRENT.config()["max.compaction.lag.ms"] == str(COMPACTION_MAX_LAG_MS)


def test_only_configs_that_differ_are_altered() -> None:
    wanted = {"segment.ms": "600000", "retention.ms": "-1", "max.compaction.lag.ms": "600000"}
    current = {"segment.ms": "604800000", "retention.ms": "-1", "cleanup.policy": "compact"}
    assert config_changes(wanted, current) == {
        "segment.ms": "600000",
        "max.compaction.lag.ms": "600000",
    }


# -- against the real services ---------------------------------------------------------------


def topic_config(bootstrap: str, topic: str) -> dict[str, str]:
    admin = AdminClient(admin_config(bootstrap))
    (future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)]).values()
    return {name: entry.value for name, entry in future.result().items()}


def read_log(bootstrap: str, topic: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Every record physically in ``topic`` (read_uncommitted, from each partition's start)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"memproj-log-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {}
        for partition in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)
            if high > low:
                ends[partition] = high
        consumer.assign([TopicPartition(topic, p, -2) for p in ends])  # OFFSET_BEGINNING
        records = []
        while ends:
            message = consumer.poll(5)
            assert message is not None, f"{topic}: the log ended early, {ends} left"
            if message.error() is not None:
                continue
            partition, offset = message.partition(), message.offset()
            assert partition is not None and offset is not None
            records.append((partition, offset, message.key(), message.value()))
            if offset + 1 >= ends.get(partition, 0):
                ends.pop(partition, None)
        return sorted(records)
    finally:
        consumer.close()


@pytest.mark.integration
def test_topics_create_brings_existing_topics_configs_up_to_the_registry(env: Any) -> None:
    bootstrap, topic = env.settings.kafka_bootstrap, env.topic(MEMORY_CURRENT)
    # A topic created by the release before: no compaction bound.
    admin = AdminClient(admin_config(bootstrap))
    old = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("segment.ms", "604800000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry(
                "max.compaction.lag.ms", None, incremental_operation=AlterConfigOpType.DELETE
            ),
        ],
    )
    for future in admin.incremental_alter_configs([old]).values():
        future.result()
    # The controller has it; the broker that answers describe_configs applies it shortly.
    env.wait_until(
        lambda: topic_config(bootstrap, topic)["segment.ms"] == "604800000", "the old config"
    )

    results = {
        r.name: r
        for r in create_topics(
            bootstrap,
            env.settings.topics,
            [MEMORY_CURRENT, MEMORY_EVENTS],
            env.settings.topic_replication,
        )
    }

    assert results[topic].detail == "updated"
    assert results[topic].changes == (
        "max.compaction.lag.ms: 9223372036854775807 -> 600000",
        "segment.ms: 604800000 -> 600000",
    )
    assert results[env.topic(MEMORY_EVENTS)].detail == "exists"
    wanted = MEMORY_CURRENT.config()
    env.wait_until(
        lambda: all(topic_config(bootstrap, topic)[k] == v for k, v in wanted.items()),
        "the registry's configs on the broker",
    )
    again = create_topics(
        bootstrap, env.settings.topics, [MEMORY_CURRENT], env.settings.topic_replication
    )
    assert [(r.detail, r.changes) for r in again] == [("exists", ())]


def create_test_sized_topic(env: Any, prefix: str) -> str:
    """A ``memory.current`` of the test's own, compacted within seconds (``segment.ms`` 1 s)."""
    names = TopicNames(env.settings.topic_prefix + prefix)
    test_sized = replace(
        MEMORY_CURRENT,
        lifetime=(
            ("segment.ms", "1000"),
            ("max.compaction.lag.ms", "1000"),
            ("min.compaction.lag.ms", "0"),
        ),
    )
    create_topics(env.settings.kafka_bootstrap, names, [test_sized], env.settings.topic_replication)
    return names.name(test_sized)


@pytest.mark.integration
def test_an_erased_value_is_gone_from_the_log_after_the_cleaner_ran(env: Any) -> None:
    bootstrap = env.settings.kafka_bootstrap
    topic = create_test_sized_topic(env, "compact.")
    try:
        producer = Producer(kafka_producer_config(bootstrap))
        secret, stale = b'{"text": "SECRET-erased"}', b'{"text": "STALE-superseded"}'

        def produce(memory_id: str, value: bytes | None) -> None:
            headers: list[tuple[str, str | bytes | None]] = [
                (n, v.encode()) for n, v in entity_headers("acme", memory_id)
            ]
            producer.produce(topic, value, output_key("acme", memory_id).encode(), headers=headers)

        produce("m_erased", secret)
        produce("m_kept", stale)
        produce("m_kept", b'{"text": "current"}')
        produce("m_erased", None)  # the ledger's null
        assert producer.flush(10) == 0
        nulled = time.monotonic()

        metrics = Metrics(CollectorRegistry())
        roller = SegmentRoller(KafkaSegmentRoller(bootstrap), [topic], metrics, 1.0)

        def cleaned() -> list[Any] | None:
            roller.roll_quiet_partitions(topic)  # what the deletion worker does every check
            log = read_log(bootstrap, topic)
            values = [value for _, _, _, value in log]
            return log if secret not in values and stale not in values else None

        log = env.wait_until(cleaned, "the cleaner removed the erased and superseded values", 180)
        print(f"compaction window (null appended -> value gone): {time.monotonic() - nulled:.1f}s")
        by_key: dict[bytes | None, list[bytes | None]] = {}
        for _, _, key, value in log:
            by_key.setdefault(key, []).append(value)
        assert by_key[b"acme:m_erased"][-1] is None
        assert by_key[b"acme:m_kept"] == [b'{"text": "current"}']
        rolls = metrics.registry.get_sample_value(
            "memproj_compaction_rolls_total", {"topic": topic}
        )
        assert rolls is not None and rolls >= 1
    finally:
        delete_topics(bootstrap, [topic])


@pytest.mark.integration
def test_a_marker_that_joined_the_segment_a_null_rolled_is_followed_by_one_that_rolls(
    env: Any,
) -> None:
    """A null appended between a roll check's read and its marker rolls the segment itself;
    the marker joins the null there. The roll check appends another marker, which rolls the
    segment, and the cleaner removes the erased value."""
    bootstrap = env.settings.kafka_bootstrap
    topic = create_test_sized_topic(env, "race.")
    try:
        producer = Producer(kafka_producer_config(bootstrap))
        secret = b'{"text": "SECRET-erased"}'
        # Timestamps in the past, set by hand, decide Kafka's rolls here whatever the
        # machine's speed: the null comes 5 s (segment.ms 1 s) after the value and rolls the
        # segment; the marker, 100 ms after the null, does not.
        now_ms = int(time.time() * 1000)
        appended = [
            (output_key("acme", "m1").encode(), secret, entity_headers("acme", "m1"), 10_000),
            (output_key("acme", "m1").encode(), None, entity_headers("acme", "m1"), 5_000),
            (MARKER_KEY, None, MARKER_HEADERS, 4_900),
        ]
        for key, value, headers, age_ms in appended:
            producer.produce(
                topic,
                value,
                key,
                partition=0,
                timestamp=now_ms - age_ms,
                headers=[(n, v.encode()) for n, v in headers],
            )
            assert producer.flush(10) == 0  # one batch each: the rolls are decided per batch

        metrics = Metrics(CollectorRegistry())
        roller = SegmentRoller(KafkaSegmentRoller(bootstrap), [topic], metrics, 1.0)

        def cleaned() -> list[Any] | None:
            roller.roll_quiet_partitions(topic)
            log = read_log(bootstrap, topic)
            return log if secret not in [value for *_, value in log] else None

        env.wait_until(cleaned, "the cleaner removed the erased value", 120)
        rolls = metrics.registry.get_sample_value(
            "memproj_compaction_rolls_total", {"topic": topic}
        )
        assert rolls == 1  # the marker that rolled is enough
    finally:
        delete_topics(bootstrap, [topic])


def current_value(memory_id: str) -> OutboxMessage:
    return OutboxMessage(
        "x.memory.current",
        output_key("acme", memory_id).encode(),
        b'{"text": "about to be erased"}',
        entity_headers("acme", memory_id),
    )


async def wait_for_lock(dsn: str, pid: int) -> None:
    """Until backend ``pid`` waits on a row lock (a readiness check on PostgreSQL)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as observer:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            cursor = await observer.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
            )
            row = await cursor.fetchone()
            if row is not None and row[0] == "Lock":
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"backend {pid} never waited on a lock")


@pytest.mark.integration
def test_an_erasure_during_a_publication_waits_and_its_null_comes_after(env: Any) -> None:
    dsn = env.settings.postgres_dsn
    published: list[bytes | None] = []

    async def scenario() -> int:
        async with (
            await psycopg.AsyncConnection.connect(dsn) as publisher,
            await psycopg.AsyncConnection.connect(dsn) as ledger,
        ):
            async with publisher.transaction():
                batch = await add_to_outbox(publisher, "memory", [current_value("m1")])
            started, gate = asyncio.Event(), asyncio.Event()

            async def publish(messages: Any) -> None:
                started.set()
                await gate.wait()  # the broker is slow: the erasure commits meanwhile
                published.extend(m.value for m in messages)

            publishing = asyncio.create_task(
                publish_outbox_batch(publisher, batch, [current_value("m1")], publish)
            )
            await started.wait()

            async def erase() -> int:
                async with ledger.transaction():
                    removed = await remove_pending_messages(
                        ledger, "memory.current", "acme", ["m1"]
                    )
                published.append(None)  # the ledger's null, published once it committed
                return removed

            erasing = asyncio.create_task(erase())
            await wait_for_lock(dsn, ledger.info.backend_pid)
            gate.set()
            await publishing
            return await erasing

    assert asyncio.run(scenario()) == 0  # published and deleted before the erasure's delete
    assert published == [b'{"text": "about to be erased"}', None]


@pytest.mark.integration
def test_rows_an_erasure_removed_first_are_never_published(env: Any) -> None:
    dsn = env.settings.postgres_dsn
    published: list[bytes | None] = []

    async def publish(messages: Any) -> None:
        published.extend(m.value for m in messages)

    async def scenario() -> tuple[int, int]:
        async with (
            await psycopg.AsyncConnection.connect(dsn) as publisher,
            await psycopg.AsyncConnection.connect(dsn) as ledger,
        ):
            async with publisher.transaction():
                batch = await add_to_outbox(
                    publisher, "memory", [current_value("m1"), current_value("m2")]
                )
                await add_to_outbox(publisher, "memory", [current_value("m1")])
            # Tenant acme:x's memory m1 has the key of tenant acme's memory x:m1: the headers
            # tell them apart, and erasing the one leaves the other's row.
            other = OutboxMessage(
                "x.memory.current", b"acme:x:m1", b"{}", entity_headers("acme:x", "m1")
            )
            async with publisher.transaction():
                await add_to_outbox(publisher, "memory", [other])
            async with ledger.transaction():
                removed = await remove_pending_messages(ledger, "memory.current", "acme", ["m1"])
                removed += await remove_pending_messages(ledger, "memory.current", "acme", ["x:m1"])
                batch_publication = asyncio.create_task(
                    publish_outbox_batch(
                        publisher, batch, [current_value("m1"), current_value("m2")], publish
                    )
                )
                await wait_for_lock(dsn, publisher.info.backend_pid)
            await batch_publication
            drained = await publish_pending_outbox(publisher, "memory", publish)
            return removed, drained

    removed, drained = asyncio.run(scenario())
    assert removed == 2  # m1 in both batches; m2 and the other tenant's row stay
    assert published == [b'{"text": "about to be erased"}', b"{}"]  # m2, then the drain
    assert drained == 1


@pytest.mark.integration
def test_an_erasure_removes_a_value_still_in_the_outbox_and_its_null_is_the_last_record(
    env: Any,
) -> None:
    f = EventFactory(id_prefix="e")
    crashing = env.worker("memory", failpoint="memory:after_commit")
    env.produce_events([f.proposed("acme", "m_secret", value={"text": "SECRET-in-outbox"})])
    env.wait_until(lambda: not crashing.alive(), "the memory worker killed after its commit")
    with env.connect() as conn:
        (pending,) = conn.execute(
            "SELECT count(*) FROM outbox WHERE producer = 'memory' AND topic = %s",
            (env.topic(MEMORY_CURRENT),),
        ).fetchone()
    assert pending == 1  # committed, never published

    env.worker("deletion")
    env.produce_events(
        [f.deletion("acme", "d1", {"type": "memory", "id": "m_secret"})], DELETION_REQUESTS
    )
    key = output_key("acme", "m_secret").encode()

    def nulled() -> list[Any] | None:
        log = read_log(env.settings.kafka_bootstrap, env.topic(MEMORY_CURRENT))
        return [r for r in log if r[2] == key] or None

    env.wait_until(nulled, "the ledger's null on memory.current")
    env.worker("memory")  # drains its outbox at start: the erased value is no longer in it
    env.wait_caught_up()
    with env.connect() as conn:
        (left,) = conn.execute("SELECT count(*) FROM outbox").fetchone()
    assert left == 0
    records = nulled()
    assert records is not None and [value for *_, value in records] == [None]
    everything = read_log(env.settings.kafka_bootstrap, env.topic(MEMORY_CURRENT))
    assert not any(value and b"SECRET-in-outbox" in value for *_, value in everything)


def compact_within_seconds(env: Any) -> None:
    """memory.current compacted within seconds rather than minutes (with a deletion worker
    whose roll check runs every 0.5 s)."""
    bootstrap, topic = env.settings.kafka_bootstrap, env.topic(MEMORY_CURRENT)
    quick = {"segment.ms": "1000", "max.compaction.lag.ms": "1000"}
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
            for name, value in quick.items()
        ],
    )
    admin = AdminClient(admin_config(bootstrap))
    for future in admin.incremental_alter_configs([resource]).values():
        future.result()
    env.wait_until(
        lambda: all(topic_config(bootstrap, topic)[k] == v for k, v in quick.items()),
        "the test-sized compaction configs",
    )


def vectors(env: Any) -> dict[str, list[str]]:
    """The memories in the vector store, per tenant."""
    try:
        store = open_vector_store(env.settings, create=False)
    except VectorStoreMissing:
        return {}  # until the embeddings worker has created it
    return {t: sorted(e.memory_id or "" for e in store.entries(t)) for t in store.tenants()}


def current_log(env: Any) -> list[tuple[int, int, bytes | None, bytes | None]]:
    return read_log(env.settings.kafka_bootstrap, env.topic(MEMORY_CURRENT))


def values(log: list[Any], marker: bytes) -> list[bytes]:
    return [value for *_, value in log if value and marker in value]


def replay_vectors(env: Any) -> dict[str, list[str]]:
    """``memproj replay embeddings --swap`` (the embeddings worker stopped), then the store."""
    env.workers[[w.kind for w in env.workers].index("embeddings")].stop()
    rebuilt = CliRunner().invoke(
        cli, ["replay", "embeddings", "--swap", "--json"], env=env.settings.as_environment()
    )
    assert rebuilt.exit_code == 0 and orjson.loads(rebuilt.output)["swapped"], rebuilt.output
    return vectors(env)


# Tenant "a" with memory "b:m" and tenant "a:b" with memory "m": one input key, "a:b:m".
MEMORY_A, MEMORY_AB = ("a", "b:m"), ("a:b", "m")


def two_tenants_indexed(env: Any) -> EventFactory:
    f = EventFactory(id_prefix="k", clock=datetime.now(UTC) - timedelta(minutes=5))
    env.produce_events(
        [
            f.proposed(*MEMORY_A, ("user", "u1"), {"text": "ALPHA value"}),
            f.proposed(*MEMORY_AB, ("user", "u1"), {"text": "BRAVO value"}),
        ]
    )
    env.start("memory", "embeddings")
    env.worker("deletion", compaction_roll_check_seconds=0.5)
    env.wait_caught_up()
    env.wait_until(lambda: vectors(env) == {"a": ["b:m"], "a:b": ["m"]}, "both indexed")
    return f


@pytest.mark.integration
def test_tenants_whose_input_keys_are_equal_keep_their_records_and_vectors_apart(
    env: Any,
) -> None:
    """On memory.current their keys differ (contract 1.2): erasing one compacts away its own
    record only, and the vector store, rebuilt from memory.current, keeps the other's."""
    f = two_tenants_indexed(env)
    compact_within_seconds(env)
    env.produce_events([f.deletion("a", "d1", {"type": "memory", "id": "b:m"})], DELETION_REQUESTS)
    env.wait_until(lambda: vectors(env) == {"a:b": ["m"]}, "tenant a's vector erased")

    erased_key = output_key(*MEMORY_A).encode()

    def compacted() -> list[Any] | None:
        log = current_log(env)
        return log if [v for *_, k, v in log if k == erased_key] == [None] else None

    log = env.wait_until(compacted, "the cleaner to leave tenant a's key only its null", 180)
    assert values(log, b"ALPHA") == []
    # Tenant a:b's memory m keeps its record, under a key of its own.
    assert values(log, b"BRAVO") != []
    assert {key for _, _, key, value in log if value} == {output_key(*MEMORY_AB).encode()}
    assert vectors(env) == {"a:b": ["m"]}
    assert replay_vectors(env) == {"a:b": ["m"]}


@pytest.mark.integration
def test_an_erasure_reaches_a_record_written_under_its_pre_1_2_key_and_spares_the_other(
    env: Any,
) -> None:
    """A record written before 1.2 keeps its input key: "a:b:m" for tenant a:b's memory m,
    which is tenant a's memory b:m's key too. Erasing tenant a:b's memory nulls that key as
    well, and publishes tenant a's record again after the null."""
    f = two_tenants_indexed(env)
    # What the release before 1.2 wrote of tenant a:b's memory: the record under its input key.
    (record,) = [v for *_, k, v in current_log(env) if k == output_key(*MEMORY_AB).encode()]
    assert record is not None
    producer = Producer(kafka_producer_config(env.settings.kafka_bootstrap))
    producer.produce(
        env.topic(MEMORY_CURRENT),
        record.replace(b"BRAVO value", b"BRAVO as written before 1.2"),
        input_key(*MEMORY_AB).encode(),
        headers=[(n, v.encode()) for n, v in entity_headers(*MEMORY_AB)],
    )
    assert producer.flush(10) == 0
    compact_within_seconds(env)
    env.produce_events([f.deletion("a:b", "d1", {"type": "memory", "id": "m"})], DELETION_REQUESTS)
    env.wait_until(lambda: vectors(env) == {"a": ["b:m"]}, "tenant a:b's vector erased")

    shared_key = input_key(*MEMORY_AB).encode()

    def compacted() -> list[Any] | None:
        log = current_log(env)
        return None if values(log, b"BRAVO") else log

    log = env.wait_until(compacted, "the cleaner to remove every record of tenant a:b", 180)
    # Tenant a's memory b:m: its record, published again after the null of the shared key.
    assert [v for *_, k, v in log if k == shared_key][-1] == values(log, b"ALPHA")[-1]
    assert replay_vectors(env) == {"a": ["b:m"]}
