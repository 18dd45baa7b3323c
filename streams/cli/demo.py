"""The demo: produce a realistic sample stream, then show what became of it."""

from __future__ import annotations

import base64
import uuid
from collections import Counter
from typing import Any

import click
import orjson
from confluent_kafka import Consumer, Producer, TopicPartition

from projections.bookkeeping import Conn
from streams.cli.common import echo_json, settings_of, with_connection
from streams.kafka import producer_config
from streams.progress import end_offsets, wait_caught_up
from streams.sample import sample_memory_stream
from streams.settings import Settings
from topics.registry import DLQ_SUFFIX, MEMORY_EVENTS, MEMORY_REJECTIONS


@click.group()
def demo() -> None:
    """A sample stream and a report of what the projection made of it."""


@demo.command("produce")
@click.option("--memories", default=1500, show_default=True, help="distinct memories")
@click.option("--tenants", default=4, show_default=True)
@click.option("--seed", default=7, show_default=True)
@click.pass_context
def demo_produce(ctx: click.Context, memories: int, tenants: int, seed: int) -> None:
    """Produce proposals, verifications, corrections, revocations, duplicates, conflicts and
    malformed messages to memory.events."""
    settings = settings_of(ctx)
    topic = settings.topics.name(MEMORY_EVENTS)
    producer = Producer(producer_config(settings.kafka_bootstrap))
    expectations: Counter[str] = Counter()
    for message in sample_memory_stream(memories, tenants, seed):
        producer.produce(topic, message.value, message.key)
        producer.poll(0)
        expectations[message.expectation] += 1
    producer.flush(30)
    click.echo(f"produced {sum(expectations.values())} messages to {topic}:")
    for expectation, count in sorted(expectations.items()):
        click.echo(f"  {count:6}  {expectation}")


def read_topic(settings: Settings, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """Everything currently in a topic, read with a throwaway assignment (no group offsets)."""
    ends = end_offsets(settings.kafka_bootstrap, topic)
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"memproj-reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end > 0])
    wanted = sum(ends.values())
    records: list[tuple[bytes | None, bytes | None]] = []
    try:
        while len(records) < wanted:
            batch = consumer.consume(1000, timeout=5)
            if not batch:
                break
            records.extend((m.key(), m.value()) for m in batch if m.error() is None)
    finally:
        consumer.close()
    return records


async def _scalar(cursor: Any) -> Any:
    row = await cursor.fetchone()
    return row[0]


async def _projection_report(conn: Conn, settings: Settings, wait: bool) -> dict[str, Any]:
    if wait:
        await wait_caught_up(
            conn, settings.kafka_bootstrap, "memory", settings.topics.name(MEMORY_EVENTS)
        )
    report: dict[str, Any] = {}
    cursor = await conn.execute(
        "SELECT tenant_id, status, count(*) FROM memories GROUP BY 1, 2 ORDER BY 1, 2"
    )
    report["memories"] = [
        {"tenant": t, "status": s, "count": c} for t, s, c in await cursor.fetchall()
    ]
    cursor = await conn.execute(
        "SELECT count(*) FROM memories WHERE expires_at IS NOT NULL AND expires_at <= now()"
    )
    report["expired"] = await _scalar(cursor)
    cursor = await conn.execute("SELECT count(*) FROM memory_versions")
    report["versions"] = await _scalar(cursor)
    cursor = await conn.execute(
        "SELECT reason, count(*) FROM rejections WHERE projection = 'memory' GROUP BY 1 ORDER BY 1"
    )
    report["rejections"] = dict(await cursor.fetchall())
    cursor = await conn.execute(
        "SELECT m.tenant_id, m.subject_type || ':' || m.subject_id, m.memory_id"
        " FROM memories m WHERE m.version >= 3 AND m.status <> 'revoked'"
        " ORDER BY m.tenant_id, m.memory_id LIMIT 1"
    )
    example = await cursor.fetchone()
    if example is not None:
        report["try"] = [
            f"memproj recall --tenant {example[0]} --subject {example[1]} --json",
            f"memproj memory show --tenant {example[0]} --memory-id {example[2]} --history",
        ]
    return report


@demo.command("report")
@click.option("--wait/--no-wait", default=True, help="wait until the worker has caught up")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def demo_report(ctx: click.Context, wait: bool, as_json: bool) -> None:
    """What the projection holds, what was rejected and what went to the DLQ."""
    settings = settings_of(ctx)
    report = with_connection(settings, lambda conn: _projection_report(conn, settings, wait))
    dlq = read_topic(settings, settings.topics.name(MEMORY_EVENTS) + DLQ_SUFFIX)
    dead = [orjson.loads(value) for _, value in dlq if value]
    report["dead_letters"] = dict(Counter(d["error_code"] for d in dead))
    report["dead_letter_example"] = (
        {k: dead[0][k] for k in ("topic", "partition", "offset", "error_code", "error")}
        | {"original": base64.b64decode(dead[0]["original"])[:80].decode(errors="replace")}
        if dead
        else None
    )
    published = read_topic(settings, settings.topics.name(MEMORY_REJECTIONS))
    report["rejections_published"] = len(published)
    if as_json:
        echo_json(report)
        return
    click.echo("memory projection (PostgreSQL):")
    for row in report["memories"]:
        click.echo(f"  {row['tenant']:10} {row['status']:9} {row['count']:6}")
    click.echo(f"  versions in history: {report['versions']}, expired now: {report['expired']}")
    click.echo(f"rejections ({report['rejections_published']} on memory.rejections):")
    for reason, count in report["rejections"].items():
        click.echo(f"  {reason:20} {count:6}")
    click.echo(f"dead letters ({len(dead)} on memory.events.dlq):")
    for code, count in sorted(report["dead_letters"].items()):
        click.echo(f"  {code:24} {count:6}")
    if report["dead_letter_example"]:
        click.echo(f"  e.g. {report['dead_letter_example']}")
    for command in report.get("try", []):
        click.echo(f"try: {command}")
