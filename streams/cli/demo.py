"""The demo: produce a realistic sample stream, then show what became of it."""

from __future__ import annotations

import re
import shlex
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import urlencode

import click
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from projections.access import keys, purposes
from projections.access.proposals import DELETE, PROPOSE
from projections.admission import store as admission_store
from projections.admission.policy import parse_document
from projections.conversation import store as conversation_store
from projections.deadletters.reading import open_letters
from projections.deadletters.sealing import LetterSealer
from projections.memory import store as memory_store
from projections.rejections import rejection_counts
from projections.shadow import drop_schema
from projections.sql import Conn
from streams.cli.common import (
    echo_json,
    settings_of,
    talks_to_kafka,
    with_connection,
    with_migrated,
)
from streams.cli.review import print_diff
from streams.kafka import admin_config, consumer_config, delete_topics, producer_config
from streams.progress import end_offsets, wait_pipeline
from streams.reviews import build_review, pending_diff
from streams.sample import (
    EventFactory,
    sample_conversation_stream,
    sample_memory_stream,
    to_message,
)
from streams.settings import Settings
from topics.api.paths import encode_segment
from topics.envelope import ActorType
from topics.messages import InputMessage, header_pairs
from topics.outputs import DeadLetter, MemoryRecord
from topics.registry import (
    CONVERSATION_EVENTS,
    CONVERSATION_REJECTIONS,
    DLQ_SUFFIX,
    MEMORY_EVENTS,
    MEMORY_REJECTIONS,
    TopicSpec,
)

T = TypeVar("T")


@click.group()
def demo() -> None:
    """A sample stream and a report of what the projection made of it."""


@demo.command("produce")
@click.option("--memories", default=1500, show_default=True, help="distinct memories")
@click.option("--conversations", default=120, show_default=True)
@click.option("--tenants", default=4, show_default=True)
@click.option("--seed", default=7, show_default=True)
@click.pass_context
@talks_to_kafka()
def demo_produce(
    ctx: click.Context, memories: int, conversations: int, tenants: int, seed: int
) -> None:
    """Produce memory events (proposals, verifications, corrections, revocations, duplicates,
    conflicts, malformed messages) and conversations (turns, tool exchanges, summaries,
    credentials to mask, refusals)."""
    settings = settings_of(ctx)
    producer = Producer(producer_config(settings.kafka))
    streams = (
        (MEMORY_EVENTS, sample_memory_stream(memories, tenants, seed)),
        (CONVERSATION_EVENTS, sample_conversation_stream(conversations, tenants, seed)),
    )
    for spec, messages in streams:
        topic = settings.topics.name(spec)
        expectations: Counter[str] = Counter()
        for message in messages:
            producer.produce(topic, message.value, message.key)
            producer.poll(0)
            expectations[message.expectation] += 1
        click.echo(f"produced {sum(expectations.values())} messages to {topic}:")
        for expectation, count in sorted(expectations.items()):
            click.echo(f"  {count:6}  {expectation}")
    producer.flush(30)


# ops/demo names every run "demo<unix time>": its topic prefix, schema and consumer groups.
DEMO_RUN = re.compile(r"demo([0-9]+)")


def _run_time(run: str) -> int:
    found = DEMO_RUN.fullmatch(run)
    if found is None:
        raise click.BadParameter(f"{run!r} is not a demo run name (demo<unix time>)")
    return int(found.group(1))


@demo.command("clean")
@click.option("--before", "current", required=True, help="the current run, e.g. demo1795973724")
@click.pass_context
@talks_to_kafka()
def demo_clean(ctx: click.Context, current: str) -> None:
    """Remove the demo runs older than CURRENT: their topics, consumer groups and PostgreSQL
    schemas. ``ops/demo`` runs it first, so the stack keeps the latest run only."""
    settings = settings_of(ctx)
    cut_off = _run_time(current)
    admin = AdminClient(admin_config(settings.kafka))

    def older(name: str, form: str) -> bool:
        found = re.fullmatch(form.format(run=DEMO_RUN.pattern), name)
        return found is not None and int(found.group(1)) < cut_off

    topics = [t for t in admin.list_topics(timeout=30).topics if older(t, r"{run}\..+")]
    delete_topics(settings.kafka, topics)
    groups = [
        listing.group_id
        for listing in admin.list_consumer_groups().result(timeout=30).valid
        if older(listing.group_id, r"memproj-{run}-.+")
    ]
    for deletion in (admin.delete_consumer_groups(groups) if groups else {}).values():
        deletion.result(timeout=60)

    async def drop_schemas(conn: Conn) -> list[str]:
        cursor = await conn.execute("SELECT nspname FROM pg_namespace")
        schemas = [name for (name,) in await cursor.fetchall() if older(name, "{run}")]
        for schema in schemas:
            await drop_schema(conn, schema)
        await conn.commit()
        return schemas

    schemas = with_connection(settings, drop_schemas)
    click.echo(
        f"removed {len(topics)} topics, {len(groups)} consumer groups and {len(schemas)}"
        " schemas of earlier demo runs"
    )


# A topic read stops once nothing has arrived for READ_IDLE_SECONDS (a partition whose end
# it never reaches), asking for what has arrived every READ_POLL_SECONDS.
READ_IDLE_SECONDS = 5.0
READ_POLL_SECONDS = 0.05


def read_topic(settings: Settings, topic: str) -> list[InputMessage]:
    """Everything committed in a topic, read with a throwaway assignment (no group offsets).

    A committed reader (contract 1.1): aborted transactions' messages are not read. Each
    partition is read up to its end as of the call, or until the reader reports reaching
    the end of it (the rest being offsets it never receives: transaction markers)."""
    ends = end_offsets(settings.kafka, topic)
    consumer = Consumer(
        consumer_config(
            settings.kafka,
            **{
                "group.id": f"memproj-reader-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                # Offset 0 of a trimmed or expired partition is gone: start at its first.
                "auto.offset.reset": "earliest",
            },
        )
    )
    pending = {p: end for p, end in ends.items() if end > 0}
    consumer.assign([TopicPartition(topic, p, 0) for p in pending])
    records: list[InputMessage] = []
    last_received = time.monotonic()
    try:
        while pending:
            # consume() returns once it has its whole batch or its timeout has passed: a
            # short timeout hands over what has arrived, so that a read ends as soon as every
            # partition is read, not a timeout later (a topic of fewer messages than a batch).
            batch = consumer.consume(1000, timeout=READ_POLL_SECONDS)
            if not batch:
                if time.monotonic() - last_received > READ_IDLE_SECONDS:
                    break
                continue
            last_received = time.monotonic()
            for m in batch:
                partition, offset, error = m.partition() or 0, m.offset() or 0, m.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF and offset >= ends[partition]:
                        pending.pop(partition, None)
                    continue
                if partition not in pending or offset >= ends[partition]:
                    continue
                records.append(
                    InputMessage(
                        topic, partition, offset, m.key(), m.value(), header_pairs(m.headers())
                    )
                )
                if offset + 1 >= ends[partition]:
                    del pending[partition]
    finally:
        consumer.close()
    return records


async def _memory_report(conn: Conn) -> dict[str, Any]:
    stats = await memory_store.statistics(conn)
    report: dict[str, Any] = {
        "by_status": [{"tenant": t, "status": st, "count": c} for t, st, c in stats.by_status],
        "versions": stats.versions,
        "expired_now": stats.expired_now,
        "rejections": await rejection_counts(conn, "memory"),
        "try": [],
    }
    if stats.with_history is not None:
        tenant, subject, memory_id = stats.with_history
        report["try"] = [
            f"memproj recall --tenant {tenant} --subject {subject}",
            f"memproj memory show --tenant {tenant} --memory-id {memory_id} --history",
        ]
    return report


async def _conversation_report(conn: Conn) -> dict[str, Any]:
    stats = await conversation_store.statistics(conn)
    report: dict[str, Any] = {
        "conversations": stats.conversations,
        "messages": stats.messages,
        "summaries": stats.summaries,
        "redactions": stats.redactions,
        "context_tool_results_omitted": stats.context_tool_results_omitted,
        "context_units_dropped": stats.context_units_dropped,
        "rejections": await rejection_counts(conn, "conversation"),
        "try": [],
    }
    example = await conversation_store.busiest_with_memories(conn)
    if example is not None:
        tenant, conversation_id = example
        report["try"] = [
            f"memproj conversation show --tenant {tenant} --conversation {conversation_id}",
            f"memproj conversation show --tenant {tenant} --conversation {conversation_id}"
            " --context",
            f"memproj conversation memories --tenant {tenant} --conversation {conversation_id}",
        ]
    return report


async def _projection_report(conn: Conn, settings: Settings, wait: bool) -> dict[str, Any]:
    if wait:
        for spec, projection in ((MEMORY_EVENTS, "memory"), (CONVERSATION_EVENTS, "conversation")):
            await wait_pipeline(conn, settings.kafka, settings.topics, spec, projection)
    return {"memory": await _memory_report(conn), "conversation": await _conversation_report(conn)}


def _dead_letters(settings: Settings, spec: TopicSpec) -> dict[str, Any]:
    dead = [
        DeadLetter.model_validate_json(message.value)
        for message in read_topic(settings, settings.topics.name(spec) + DLQ_SUFFIX)
        if message.value
    ]
    example = None
    if dead:
        first = dead[0]
        example = first.model_dump(
            mode="json", include={"topic", "partition", "offset", "error_code", "error"}
        )
        sealer = LetterSealer(settings.worker_master_keys())
        [view] = with_connection(
            settings, lambda conn: open_letters(conn, sealer, [first], datetime.now(UTC))
        )
        # The original opens while its key lives (see ``memproj dlq``).
        example["original"] = (
            view.opened.value[:80].decode(errors="replace") if view.opened else f"({view.state})"
        )
    return {"by_error": dict(Counter(d.error_code.value for d in dead)), "example": example}


@demo.command("report")
@click.option("--wait/--no-wait", default=True, help="wait until the workers have caught up")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@talks_to_kafka()
def demo_report(ctx: click.Context, wait: bool, as_json: bool) -> None:
    """What the projections hold, what was rejected and what went to the DLQs."""
    settings = settings_of(ctx)
    report = with_connection(settings, lambda conn: _projection_report(conn, settings, wait))
    for section, spec, rejections in (
        ("memory", MEMORY_EVENTS, MEMORY_REJECTIONS),
        ("conversation", CONVERSATION_EVENTS, CONVERSATION_REJECTIONS),
    ):
        report[section]["dead_letters"] = _dead_letters(settings, spec)
        published = read_topic(settings, settings.topics.name(rejections))
        report[section]["rejections_published"] = len(published)
    if as_json:
        echo_json(report)
        return
    _print_report(report)


def _print_report(report: dict[str, Any]) -> None:
    memory, conversation = report["memory"], report["conversation"]
    click.echo("memory projection (PostgreSQL):")
    for row in memory["by_status"]:
        click.echo(f"  {row['tenant']:10} {row['status']:9} {row['count']:6}")
    click.echo(f"  versions in history: {memory['versions']}, expired now: {memory['expired_now']}")
    click.echo("conversation projection (PostgreSQL):")
    click.echo(
        f"  {conversation['conversations']} conversations, {conversation['messages']} messages,"
        f" {conversation['summaries']} summaries"
    )
    click.echo(f"  credentials masked before storage: {conversation['redactions']}")
    click.echo(
        f"  context views: {conversation['context_tool_results_omitted']} oversized tool results"
        f" replaced by a notice, {conversation['context_units_dropped']} units over budget"
    )
    for name, section in (("memory", memory), ("conversation", conversation)):
        click.echo(f"{name} rejections ({section['rejections_published']} on {name}.rejections):")
        for reason, count in section["rejections"].items():
            click.echo(f"  {reason:24} {count:6}")
        dead = section["dead_letters"]
        total = sum(dead["by_error"].values())
        click.echo(f"{name} dead letters ({total} on {name}.events.dlq):")
        for code, count in sorted(dead["by_error"].items()):
            click.echo(f"  {code:24} {count:6}")
        if dead["example"]:
            click.echo(f"  e.g. {dead['example']}")
    for command in memory["try"] + conversation["try"]:
        click.echo(f"try: {command}")


# -- the HTTP API -----------------------------------------------------------------------------

DEMO_PURPOSE = "demo"
DEMO_ACTOR = "agent:demo"
DEMO_SEARCH_TEXT = "what does this user prefer?"


def curl_lines(
    url: str, token: str, subject: tuple[str, str], purpose: str, text: str
) -> list[str]:
    """A ``curl`` of recall and one of semantic search about ``subject``, as a shell runs them."""
    base = url.rstrip("/")
    subject_path = "/".join(encode_segment(part) for part in subject)
    recall = f"{base}/v1/subjects/{subject_path}/memories?{urlencode({'purpose': purpose})}"
    search = (
        f"{base}/v1/subjects/{subject_path}/search?{urlencode({'purpose': purpose, 'text': text})}"
    )
    header = shlex.quote(f"Authorization: Bearer {token}")
    return [f"curl -s -H {header} {shlex.quote(target)}" for target in (recall, search)]


async def _demo_key(conn: Conn) -> tuple[str, tuple[str, str], str] | None:
    """The subject with the most eligible memories, and a new key of its tenant whose
    purpose reads everything (and may propose and delete)."""
    found = await memory_store.most_remembered_subject(conn)
    if found is None:
        return None
    tenant, subject_type, subject_id = found
    now = datetime.now(UTC)
    await purposes.set_policy(conn, tenant, DEMO_PURPOSE, ["*"], ["*"], True, now)
    created = await keys.create_key(conn, tenant, DEMO_ACTOR, [DEMO_PURPOSE, PROPOSE, DELETE], now)
    await conn.commit()
    return tenant, (subject_type, subject_id), created.token


@demo.command("api")
@click.option(
    "--url", help="where memproj serve answers (default http://MEMPROJ_API_HOST:MEMPROJ_API_PORT)"
)
@click.pass_context
def demo_api(ctx: click.Context, url: str | None) -> None:
    """Create a key for the demo's busiest subject's tenant (purpose "demo": every kind and
    scope, conversations; and propose, delete) and print a curl of recall and of search."""
    settings = settings_of(ctx)
    found = with_connection(settings, _demo_key)
    if found is None:
        raise click.ClickException("no eligible memory to show: run memproj demo produce first")
    tenant, subject, token = found
    url = url or f"http://{settings.api_host}:{settings.api_port}"
    click.echo(
        f"the demo's API key for tenant {tenant} (actor {DEMO_ACTOR}, purposes {DEMO_PURPOSE},"
        f" {PROPOSE}, {DELETE}); recall and search about {subject[0]}:{subject[1]}:"
    )
    for line in curl_lines(url, token, subject, DEMO_PURPOSE, DEMO_SEARCH_TEXT):
        click.echo(line)


# -- governed writes: one memory held for review, the reviewer's diff, the approval -------------

REVIEW_TENANT = "tenant_governed"
REVIEW_SUBJECT = ("user", "user_review")
REVIEW_POLICY = {"rules": [{"kind": "risk", "decision": "review", "evidence_required": True}]}
REVIEWER: tuple[ActorType, str] = ("operator", "demo_reviewer")
# How long the demo waits for the workers to apply each step.
REVIEW_WAIT_SECONDS = 60.0


def _wait_for(settings: Settings, what: str, check: Callable[[Conn], Awaitable[T | None]]) -> T:
    deadline = time.monotonic() + REVIEW_WAIT_SECONDS
    while True:
        found = with_connection(settings, check)
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise click.ClickException(f"{what}: not within {REVIEW_WAIT_SECONDS:.0f} s")
        time.sleep(0.2)


def _produce(settings: Settings, spec: TopicSpec, messages: list[tuple[bytes, bytes]]) -> None:
    producer = Producer(producer_config(settings.kafka))
    for key, value in messages:
        producer.produce(settings.topics.name(spec), value, key)
    if producer.flush(30):
        raise click.ClickException("the demo's events were not delivered to Kafka")


@demo.command("review")
@click.option("--tenant", default=REVIEW_TENANT, show_default=True)
@click.pass_context
@talks_to_kafka()
def demo_review(ctx: click.Context, tenant: str) -> None:
    """Governed writes with the workers running: a policy that reviews the kind "risk" (with
    evidence), a customer's message, a risk memory citing it held for review, the reviewer's
    diff, an operator's approval, and the memory served."""
    settings = settings_of(ctx)
    document = parse_document(REVIEW_POLICY)
    stored = with_migrated(
        settings, lambda conn: admission_store.add_version(conn, tenant, document, "demo")
    )
    click.echo(f"policy v{stored.version} of {tenant}: {REVIEW_POLICY}")
    run = uuid.uuid4().hex[:8]
    f = EventFactory(id_prefix=f"review-{run}", clock=datetime.now(UTC))
    conversation, memory_id = f"conv_review_{run}", f"mem_risk_{run}"
    said = f.message(
        tenant, conversation, "msg_1", "user", "I am disputing the March charge with my bank"
    )
    _produce(
        settings,
        CONVERSATION_EVENTS,
        [to_message(f.started(tenant, conversation, REVIEW_SUBJECT)), to_message(said)],
    )
    # Evidence is looked up when the memory event is sealed: the message must be stored first.
    _wait_for(
        settings,
        "the customer's message stored",
        lambda conn: _found(
            conversation_store.messages_by_event_id(conn, tenant, [said["event_id"]])
        ),
    )
    proposal = f.proposed(
        tenant,
        memory_id,
        REVIEW_SUBJECT,
        {"text": "disputes the March charge with their bank"},
        kind="risk",
        source=("message", f"{conversation}/msg_1"),
        evidence=[said["event_id"]],
    )
    _produce(settings, MEMORY_EVENTS, [to_message(proposal)])
    diff = _wait_for(
        settings, "the risk memory held", lambda conn: pending_diff(conn, tenant, memory_id)
    )
    click.echo("held for review; the reviewer sees (memproj review show):")
    print_diff(diff)
    message = build_review(
        tenant, memory_id, diff.version, "approved", "checked the message", REVIEWER,
        datetime.now(UTC),
    )  # fmt: skip
    _produce(settings, MEMORY_EVENTS, [(message.key, message.value)])
    click.echo(f"approved v{diff.version} as {REVIEWER[0]}:{REVIEWER[1]} (memory.reviewed)")

    async def served(conn: Conn) -> MemoryRecord | None:
        record = await memory_store.load_memory(conn, tenant, memory_id)
        return record if record is not None and record.servable else None

    record = _wait_for(settings, "the approved memory served", served)
    click.echo(f"served: {memory_id} v{record.version} {record.status} {record.value}")
    click.echo(
        f"try: memproj recall --tenant {tenant} --subject {REVIEW_SUBJECT[0]}:{REVIEW_SUBJECT[1]}"
    )


async def _found(query: Awaitable[list[Any]]) -> list[Any] | None:
    return (await query) or None
