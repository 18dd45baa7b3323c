"""Erasure under load: deletion requested -> every store acknowledged, while the pipeline
ingests at half its maximum rate.

Subject erasures go to ``deletion.requests`` the way ``memproj delete subject`` sends them
(``streams/cli/deletion.py``), with ``occurred_at`` now, so that every sample event about the
subject (the sample stream's clock is months earlier) is covered. The deletion worker records
each in the ledger and publishes its tombstone; the store workers (embeddings, summaries,
cache, context) erase and acknowledge; the ledger marks the request completed once every
required store has. The latencies are read from the ledger afterwards: the last store's
``acked_at`` and the request's ``completed_at``, against the moment the request was handed to
the producer (the same machine's clock). ``completed_at`` is the last store's ``acked_at``
(the store's clock once it has erased and verified), so the ledger's recording of the
acknowledgements is not part of it.

Where the time goes, hop by hop: the ledger's ``recorded_at`` (its transaction's start, so
requested -> recorded is the requests' gathering and their wait for the ledger's writer), the
tombstone's publication (its Kafka timestamp on ``deletion.tombstones``: recorded -> published
is the ledger's transaction, its wait for the exclusive tenant locks first, then the commit
and the outbox publish), each store's ``acked_at`` (tombstone -> acked: the store's gathering,
its wait for its writer, the erasure and its check) and its acknowledgement's publication
(the Kafka timestamp of its first ``done`` acknowledgement on ``deletion.acks``), all read
back after the load. When the ledger records an acknowledgement is not kept anywhere, and is
not part of the measured latency.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import orjson
import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from environment import Message, PacedProducer, percentile, rounded_ms  # ops/bench/environment.py

from streams.kafka import consumer_config, producer_config
from streams.sample import iso, to_message
from streams.settings import Settings
from topics.registry import DELETION_ACKS, DELETION_REQUESTS, DELETION_TOMBSTONES

TARGET_P99_MS = 2000.0  # the hot path's target for an erasure under load
STORE_WORKERS = ("deletion", "embeddings", "summaries", "cache", "context")


@dataclass(frozen=True)
class ErasureLatency:
    deletion_id: str
    requested: datetime
    recorded_ms: float | None  # the ledger has the request
    acknowledged_ms: float | None  # the last required store has acknowledged
    completed_ms: float | None  # the ledger marked it completed
    stores_ms: dict[str, float | None]  # each required store's acknowledgement
    tombstone_ms: float | None = None  # the ledger published its tombstone
    store_acks_published_ms: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ErasureUnderLoad:
    rate: float
    erasures: list[ErasureLatency]
    deadline_seconds: float  # how long after the last request the benchmark waited

    def _done(self, field: str) -> list[float]:
        values = (getattr(e, field) for e in self.erasures)
        return [value for value in values if value is not None]

    def _by_store(self) -> dict[str, list[float]]:
        """Each required store's acknowledgement latencies; a store that acknowledged none
        is there with an empty list."""
        stores: dict[str, list[float]] = {}
        for erasure in self.erasures:
            for store, acked in erasure.stores_ms.items():
                stores.setdefault(store, [])
                if acked is not None:
                    stores[store].append(acked)
        return stores

    def _hops(self) -> dict[str, list[float]]:
        """Each hop's latencies, ms: requested -> recorded (the ledger's transaction began),
        recorded -> tombstone published, tombstone published -> each store acknowledged,
        each store's acknowledgement -> published."""
        hops: dict[str, list[float]] = {}

        def add(hop: str, start: float | None, end: float | None) -> None:
            if start is not None and end is not None:
                hops.setdefault(hop, []).append(end - start)

        for e in self.erasures:
            add("requested -> recorded", 0.0, e.recorded_ms)
            add("recorded -> tombstone published", e.recorded_ms, e.tombstone_ms)
            for store, acked in sorted(e.stores_ms.items()):
                add(f"tombstone -> {store} acked", e.tombstone_ms, acked)
                add(f"{store} acked -> ack published", acked, e.store_acks_published_ms.get(store))
        return hops

    def as_json(self) -> dict[str, object]:
        acknowledged = self._done("acknowledged_ms")
        completed = self._done("completed_ms")
        return {
            "ingest_rate_events_per_s": round(self.rate),
            "requested": len(self.erasures),
            "completed": len(completed),
            "waited_s": self.deadline_seconds,
            "acknowledged_p50_ms": rounded_ms(percentile(acknowledged, 0.50)),
            "acknowledged_p99_ms": rounded_ms(percentile(acknowledged, 0.99)),
            "completed_p50_ms": rounded_ms(percentile(completed, 0.50)),
            "completed_p99_ms": rounded_ms(percentile(completed, 0.99)),
            "recorded_p50_ms": rounded_ms(percentile(self._done("recorded_ms"), 0.50)),
            # which store the wait is for
            "store_acknowledged_p50_ms": {
                store: rounded_ms(percentile(acked, 0.50))
                for store, acked in sorted(self._by_store().items())
            },
            "store_acknowledged_p99_ms": {
                store: rounded_ms(percentile(acked, 0.99))
                for store, acked in sorted(self._by_store().items())
            },
            "store_acknowledged": {
                store: len(acked) for store, acked in sorted(self._by_store().items())
            },
            "hops_p50_p99_ms": {
                hop: [rounded_ms(percentile(ms, 0.50)), rounded_ms(percentile(ms, 0.99))]
                for hop, ms in self._hops().items()
            },
            "target_p99_ms": TARGET_P99_MS,
        }


def subject_erasure(tenant: str, subject_id: str) -> tuple[str, Message]:
    deletion_id = f"del-{uuid.uuid4().hex}"
    event = {
        "event_id": str(uuid.uuid4()),
        "event_type": "deletion.requested",
        "schema_version": 1,
        "tenant_id": tenant,
        "occurred_at": iso(datetime.now(UTC)),
        "actor": {"type": "operator", "id": "memproj-bench"},
        "payload": {
            "deletion_id": deletion_id,
            "target": {"type": "subject", "subject_type": "user", "id": subject_id},
            "reason": "benchmark: erasure under load",
        },
    }
    return deletion_id, to_message(event)


def measure_erasure_under_load(
    settings: Settings,
    messages: Sequence[Message],
    subjects: Sequence[tuple[str, str]],
    rate: float,
    seconds: float,
    deadline_seconds: float = 120.0,
) -> ErasureUnderLoad:
    """Ingest ``messages`` at ``rate`` for ``seconds``, erase one of ``subjects`` (tenant,
    subject id) at even intervals meanwhile, then wait for every erasure to complete."""
    requests = Producer(producer_config(settings.kafka))
    topic = settings.topics.name(DELETION_REQUESTS)
    requested: dict[str, datetime] = {}
    interval = seconds / (len(subjects) + 1)
    producer = PacedProducer(settings, messages, rate).start()
    started = time.monotonic()
    for number, (tenant, subject_id) in enumerate(subjects, start=1):
        time.sleep(max(0.0, started + number * interval - time.monotonic()))
        deletion_id, (key, value) = subject_erasure(tenant, subject_id)
        requested[deletion_id] = datetime.now(UTC)
        requests.produce(topic, value, key)
        requests.poll(0)
    requests.flush(30)
    time.sleep(max(0.0, started + seconds - time.monotonic()))
    producer.stop()
    ingest_rate = producer.sent / (time.monotonic() - started)
    ledger = wait_completed(settings, list(requested), deadline_seconds)
    tombstones = _published(settings, settings.topics.name(DELETION_TOMBSTONES), set(requested))
    acks = _published(settings, settings.topics.name(DELETION_ACKS), set(requested))
    latencies = []
    for deletion_id, moment in requested.items():
        entry = ledger.get(deletion_id)
        if entry is None:  # never reached the ledger
            latencies.append(ErasureLatency(deletion_id, moment, None, None, None, {}))
            continue
        acked = entry.acked.values()
        stores_published = {
            store: _ms_after(moment, at)
            for (deletion, store), at in acks.items()
            if deletion == deletion_id
        }
        latencies.append(
            ErasureLatency(
                deletion_id,
                moment,
                _ms_after(moment, entry.recorded),
                None
                if not acked or None in acked
                else _ms_after(moment, max(a for a in acked if a)),
                _ms_after(moment, entry.completed),
                {store: _ms_after(moment, at) for store, at in entry.acked.items()},
                _ms_after(moment, tombstones.get((deletion_id, ""))),
                {store: ms for store, ms in stores_published.items() if ms is not None},
            )
        )
    return ErasureUnderLoad(ingest_rate, latencies, deadline_seconds)


def _ms_after(start: datetime, end: datetime | None) -> float | None:
    return None if end is None else 1000 * (end - start).total_seconds()


@dataclass(frozen=True)
class LedgerEntry:
    recorded: datetime | None
    completed: datetime | None
    acked: dict[str, datetime | None]  # per required store


def wait_completed(
    settings: Settings, deletion_ids: list[str], deadline_seconds: float
) -> dict[str, LedgerEntry]:
    """What the ledger says of each request, once every one is completed or at the
    deadline."""
    deadline = time.monotonic() + deadline_seconds
    with psycopg.connect(settings.postgres_conninfo, autocommit=True) as conn:
        while True:
            requests = conn.execute(
                "SELECT deletion_id, recorded_at, completed_at FROM deletion_requests"
                " WHERE deletion_id = ANY(%s)",
                (deletion_ids,),
            ).fetchall()
            acks = conn.execute(
                "SELECT deletion_id, store, acked_at FROM deletion_store_acks"
                " WHERE deletion_id = ANY(%s)",
                (deletion_ids,),
            ).fetchall()
            ledger = {
                str(deletion_id): LedgerEntry(_moment(recorded), _moment(completed), {})
                for deletion_id, recorded, completed in requests
            }
            for deletion_id, store, acked in acks:
                # recorded (with its acknowledgements) between the two reads: the next poll
                # sees the request
                entry = ledger.get(str(deletion_id))
                if entry is not None:
                    entry.acked[str(store)] = _moment(acked)
            done = sum(1 for entry in ledger.values() if entry.completed is not None)
            if done == len(deletion_ids) or time.monotonic() > deadline:
                return ledger
            time.sleep(0.2)


def _published(
    settings: Settings, topic: str, deletion_ids: set[str]
) -> dict[tuple[str, str], datetime]:
    """When each of ``deletion_ids``' messages on ``topic`` was first published (its Kafka
    timestamp), by (deletion id, store): the store is "" for a tombstone, the acknowledging
    store for a ``done`` acknowledgement (a ``failed`` one is not the store's answer)."""
    consumer = Consumer(
        consumer_config(settings.kafka, **{"group.id": f"bench-{uuid.uuid4().hex}"})
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p))[1] for p in partitions}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        left = {p for p, end in ends.items() if end > 0}
        published: dict[tuple[str, str], datetime] = {}
        deadline = time.monotonic() + 60
        while left and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=10_000, timeout=1.0):
                if message.error() is not None:
                    continue
                partition, offset = message.partition(), message.offset()
                assert partition is not None and offset is not None
                if offset + 1 >= ends[partition]:
                    left.discard(partition)
                value = message.value() or b""
                if b'"del-' not in value:  # the benchmark's own ids only
                    continue
                record = orjson.loads(value)
                if record.get("deletion_id") not in deletion_ids:
                    continue
                if record.get("status", "done") != "done":
                    continue
                at = datetime.fromtimestamp(message.timestamp()[1] / 1000, UTC)
                published.setdefault((record["deletion_id"], record.get("store", "")), at)
        return published
    finally:
        consumer.close()


def _moment(value: object) -> datetime | None:
    return value if isinstance(value, datetime) else None
