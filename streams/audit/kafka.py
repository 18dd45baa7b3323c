"""The plaintext audit of Kafka: every record of every memproj topic, as an auditor reads it.

Each partition is read once, from its low to its high watermark, with ``read_uncommitted``:
an aborted transaction's records are still on disk and readable by anyone who asks, so they
count. Records stream through in batches (never a whole topic in memory); each batch is given
to the topic kind's openers first, so a sealed topic's data keys are read once per batch.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from streams.audit.openers import OpenerContext, openers_for
from streams.audit.plaintext import (
    Hit,
    Matcher,
    PlaceKind,
    Report,
    TopicKind,
    TopicRecord,
    record_parts,
    topic_kind,
    within_window,
)
from streams.failures import Explained
from streams.kafka import KafkaTarget, consumer_config, failed
from topics.messages import header_pairs
from topics.registry import TopicNames, TopicSpec

BATCH = 500
# A batch read returns when it is full or after this long: short, so a topic holding a few
# records costs milliseconds, not a whole wait per topic.
POLL_SECONDS = 0.05
# A partition that yields nothing for this long although it is not at its end is an error:
# the audit never reports "clean" for a log it did not read to the end.
STALL_SECONDS = 30.0


class StoppedShort(Explained, RuntimeError):
    """A topic's partitions stopped yielding records before their end offsets."""


@dataclass(frozen=True, slots=True)
class TopicToScan:
    name: str
    kind: TopicKind
    # How long a raw record may keep plaintext (ms); None for topics where none is allowed.
    window_ms: int | None


def topics_to_scan(
    names: TopicNames, specs: Sequence[TopicSpec], windows: Mapping[str, int | None]
) -> list[TopicToScan]:
    """``windows``: per raw input topic's base name, its plaintext window in ms."""
    return [
        TopicToScan(names.name(spec), topic_kind(spec), windows.get(spec.base_name))
        for spec in specs
    ]


def auditor(bootstrap: KafkaTarget) -> Consumer:
    return Consumer(
        consumer_config(
            bootstrap,
            **{
                # An auditor reads what is on disk, aborted transactions included.
                "isolation.level": "read_uncommitted",
                "group.id": f"memproj-audit-{uuid.uuid4().hex}",  # never commits: no group
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                # Bounds what the client prefetches: the scan streams, it never holds a topic.
                "queued.max.messages.kbytes": 16384,
                # The broker answers a fetch at once rather than wait for more data: an audit
                # reads what is there, and a partition's end must not cost half a second.
                "fetch.wait.max.ms": 10,
            },
        )
    )


def _record(message: Message) -> TopicRecord:
    kind, timestamp = message.timestamp()
    return TopicRecord(
        topic=message.topic() or "",
        partition=message.partition() or 0,
        offset=message.offset() or 0,
        timestamp_ms=timestamp if kind else None,  # TIMESTAMP_NOT_AVAILABLE is 0
        key=message.key(),
        value=message.value(),
        headers=tuple(header_pairs(message.headers())),
    )


async def scan_topic(
    consumer: Consumer,
    topic: TopicToScan,
    matcher: Matcher,
    report: Report,
    context: OpenerContext,
    now_ms: int,
) -> None:
    metadata = consumer.list_topics(topic.name, timeout=10).topics.get(topic.name)
    if metadata is None or metadata.error is not None:
        if metadata is not None and metadata.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return  # not created under this prefix: nothing to read
        report.error(f"topic {topic.name}", metadata.error if metadata else "no metadata")
        return
    scanned = report.source("kafka")
    scanned.places += 1
    ends: dict[int, int] = {}
    starts = []
    for partition in sorted(metadata.partitions):
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic.name, partition), timeout=10, cached=False
        )
        if high > low:
            ends[partition] = high
            starts.append(TopicPartition(topic.name, partition, low))
    if not starts:
        return
    openers = openers_for(topic.kind, context)
    consumer.assign(starts)
    try:
        last_progress = time.monotonic()
        while ends:
            batch = await asyncio.to_thread(consumer.consume, BATCH, POLL_SECONDS)
            records = []
            for message in batch:
                error, partition = message.error(), message.partition() or 0
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise failed(error, f"reading {topic.name}[{partition}]")
                    ends.pop(partition, None)  # the end: the rest are control records
                    continue
                if partition not in ends or (message.offset() or 0) >= ends[partition]:
                    continue
                records.append(_record(message))
                if (message.offset() or 0) + 1 >= ends[partition]:
                    del ends[partition]
            if batch:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > STALL_SECONDS:
                raise StoppedShort(f"{topic.name}: partitions {sorted(ends)} stopped short")
            for opener in openers:
                await opener.prepare(records)
            for record in records:
                scanned.items += 1
                scanned.bytes += len(record.key or b"") + len(record.value or b"")
                opened = [(opener.name, opener.open(record)) for opener in openers]
                parts = record_parts(matcher, record, opened)
                if parts:
                    window = within_window(topic.kind, record.timestamp_ms, now_ms, topic.window_ms)
                    example = f"{record.partition}@{record.offset}"
                    report.add(Hit(PlaceKind.TOPIC, topic.name, example, tuple(parts), window))
    finally:
        consumer.unassign()


async def scan_kafka(
    bootstrap: KafkaTarget,
    topics: Sequence[TopicToScan],
    matcher: Matcher,
    report: Report,
    context: OpenerContext,
) -> None:
    started = time.monotonic()
    now_ms = int(time.time() * 1000)
    consumer = auditor(bootstrap)
    try:
        for topic in topics:
            try:
                await scan_topic(consumer, topic, matcher, report, context, now_ms)
            except Exception as error:  # reported; the audit goes on
                report.error(f"topic {topic.name}", error)
    finally:
        consumer.close()
        report.source("kafka").seconds += time.monotonic() - started
