"""``memproj dlq``: count, open and replay dead letters while their keys live."""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import click

from projections.deadletters.reading import LetterView, open_letters
from projections.deadletters.sealing import LetterSealer
from projections.outbox import OutboxMessage
from projections.sql import Conn
from streams.cli.common import echo_json, settings_of, talks_to_kafka, with_connection
from streams.cli.demo import read_topic
from streams.kafka import KafkaPublisher
from streams.settings import Settings
from topics.outputs import DeadLetter
from topics.registry import ALL_TOPICS, DLQ_SUFFIX, TopicRole


@dataclass(frozen=True, slots=True)
class Stored:
    """A letter with where it is stored: its DLQ topic, partition and offset."""

    dlq_topic: str
    partition: int
    offset: int
    view: LetterView


def dead_letter_topics(settings: Settings) -> list[str]:
    return [settings.topics.name(s) for s in ALL_TOPICS if s.role is TopicRole.DEAD_LETTER]


def read_letters(settings: Settings, topics: Iterable[str]) -> list[Stored]:
    """Every letter on ``topics``, opened while its key lives. A message that is no dead
    letter (written by something else) is left out."""
    found: list[tuple[str, int, int, DeadLetter]] = []
    for topic in topics:
        for message in read_topic(settings, topic):
            try:
                letter = DeadLetter.model_validate_json(message.value or b"")
            except ValueError:
                continue
            found.append((topic, message.partition, message.offset, letter))
    sealer = LetterSealer(settings.worker_master_keys())

    async def work(conn: Conn) -> list[LetterView]:
        return await open_letters(conn, sealer, [f[3] for f in found], datetime.now(UTC))

    views = with_connection(settings, work) if found else []
    return [Stored(t, p, o, view) for (t, p, o, _), view in zip(found, views, strict=True)]


def _topics_for(settings: Settings, topic: str | None) -> list[str]:
    """The DLQ topics to read: one named by its own name or its source's, or all of them."""
    if topic is None:
        return dead_letter_topics(settings)
    return [topic if topic.endswith(DLQ_SUFFIX) else topic + DLQ_SUFFIX]


def summary(letters: Sequence[Stored]) -> list[dict[str, Any]]:
    """Per DLQ topic and error code: how many, the oldest and newest, and how many open."""
    groups: dict[tuple[str, str], list[Stored]] = {}
    for stored in letters:
        key = (stored.dlq_topic, stored.view.letter.error_code.value)
        groups.setdefault(key, []).append(stored)
    rows = []
    for (topic, code), members in sorted(groups.items()):
        times = [m.view.letter.failed_at for m in members]
        rows.append(
            {
                "topic": topic,
                "error_code": code,
                "count": len(members),
                "oldest": min(times).isoformat(),
                "newest": max(times).isoformat(),
                "states": dict(sorted(Counter(m.view.state for m in members).items())),
            }
        )
    return rows


def describe(stored: Stored) -> dict[str, Any]:
    letter, view = stored.view.letter, stored.view
    described: dict[str, Any] = {
        "dlq": {"topic": stored.dlq_topic, "partition": stored.partition, "offset": stored.offset},
        "source": {"topic": letter.topic, "partition": letter.partition, "offset": letter.offset},
        "error_code": letter.error_code.value,
        "error": letter.error,
        "key": letter.key,
        "failed_at": letter.failed_at.isoformat(),
        "original_size": letter.original_size,
        "original_truncated": letter.original_truncated,
        "state": view.state,
    }
    if view.erased_by is not None:
        described["erased_by"] = view.erased_by
    if view.opened is not None:
        described["detail"] = view.opened.detail
        described["original_key"] = _readable(view.opened.key)
        described["original"] = _readable(view.opened.value)
    return described


def _readable(raw: bytes | None) -> dict[str, str] | None:
    if raw is None:
        return None
    try:
        return {"text": raw.decode()}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(raw).decode()}


@click.group()
def dlq() -> None:
    """Dead letters: count them, open one, replay them after a fix (while their keys live)."""


@dlq.command("list")
@click.option("--topic", help="one DLQ topic (or its source topic); default: every DLQ")
@click.option("--letters", "each", is_flag=True, help="one line per letter, not per error code")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@talks_to_kafka()
def dlq_list(ctx: click.Context, topic: str | None, each: bool, as_json: bool) -> None:
    """Dead letters per topic and error code: counts, oldest and newest, open or not."""
    settings = settings_of(ctx)
    letters = read_letters(settings, _topics_for(settings, topic))
    if each:
        described = [describe(s) for s in letters]
        for row in described:  # a listing opens nothing
            for opened in ("original", "original_key", "detail"):
                row.pop(opened, None)
        if as_json:
            echo_json(described)
            return
        for row in described:
            dlq_at, source = row["dlq"], row["source"]
            click.echo(
                f"{dlq_at['topic']}[{dlq_at['partition']}]@{dlq_at['offset']}"
                f"  {source['topic']}[{source['partition']}]@{source['offset']}"
                f"  {row['error_code']}  {row['state']}  {row['failed_at']}"
            )
        return
    rows = summary(letters)
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo("no dead letters")
    for row in rows:
        states = ", ".join(f"{state} {n}" for state, n in row["states"].items())
        click.echo(
            f"{row['topic']:40} {row['error_code']:24} {row['count']:6}"
            f"  {row['oldest']} .. {row['newest']}  ({states})"
        )


@dlq.command("show")
@click.argument("topic")
@click.argument("partition", type=int)
@click.argument("offset", type=int)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@talks_to_kafka()
def dlq_show(ctx: click.Context, topic: str, partition: int, offset: int, as_json: bool) -> None:
    """One letter, opened while its key lives ("erased" or "expired" otherwise).

    TOPIC PARTITION OFFSET is the letter's place on its DLQ topic (memory.events.dlq 0 12), or
    the failed message's place on its source topic (memory.events 3 1041)."""
    settings = settings_of(ctx)
    on_dlq = topic.endswith(DLQ_SUFFIX)
    found = [
        s
        for s in read_letters(settings, _topics_for(settings, topic))
        if (
            (s.partition, s.offset) == (partition, offset)
            if on_dlq
            else (s.view.letter.topic, s.view.letter.partition, s.view.letter.offset)
            == (topic, partition, offset)
        )
    ]
    if not found:
        raise click.ClickException(f"no dead letter at {topic} {partition} {offset}")
    described = [describe(s) for s in found]
    if as_json:
        echo_json(described[0] if on_dlq else described)
        return
    for row in described:
        for name, value in row.items():
            click.echo(f"{name:20} {value}")
        click.echo()


def select(
    letters: Sequence[Stored],
    error_codes: Sequence[str],
    offsets: Sequence[int],
    partition: int | None,
) -> list[Stored]:
    """The letters the options name: by error code and by the failed message's offset (and
    partition); each failed message once, however many workers dead-lettered it."""
    chosen: dict[tuple[str, int, int], Stored] = {}
    for stored in letters:
        letter = stored.view.letter
        if error_codes and letter.error_code.value not in error_codes:
            continue
        if offsets and letter.offset not in offsets:
            continue
        if partition is not None and letter.partition != partition:
            continue
        position = (letter.topic, letter.partition, letter.offset)
        known = chosen.get(position)
        if known is None or (known.view.opened is None and stored.view.opened is not None):
            chosen[position] = stored
    return list(chosen.values())


def replay_plan(letters: Sequence[Stored]) -> tuple[list[OutboxMessage], Counter[str]]:
    """The messages to produce again (the opened originals, to their source topic, with their
    original key) and why the others are skipped."""
    messages: list[OutboxMessage] = []
    skipped: Counter[str] = Counter()
    for stored in letters:
        view = stored.view
        if view.opened is None:
            skipped[view.state] += 1
        elif view.letter.original_truncated:
            skipped["truncated"] += 1  # only its first bytes were kept: not the message
        else:
            messages.append(OutboxMessage(view.letter.topic, view.opened.key, view.opened.value))
    return messages, skipped


@dlq.command("replay")
@click.option("--topic", required=True, help="the DLQ topic, or its source topic")
@click.option("--error-code", "error_codes", multiple=True, help="only letters of this code")
@click.option("--offset", "offsets", type=int, multiple=True, help="the failed message's offset")
@click.option("--partition", type=int, help="the failed message's partition")
@click.option("--dry-run", is_flag=True, help="say what would be produced, produce nothing")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@talks_to_kafka()
def dlq_replay(
    ctx: click.Context,
    topic: str,
    error_codes: tuple[str, ...],
    offsets: tuple[int, ...],
    partition: int | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Produce the selected letters' originals again to their source topic, with their
    original key, after a fix. The workers apply each event once (by event_id), so a replayed
    event that was applied meanwhile changes nothing. Erased, expired and truncated letters
    are skipped, with the reason."""
    settings = settings_of(ctx)
    letters = select(
        read_letters(settings, _topics_for(settings, topic)), error_codes, offsets, partition
    )
    messages, skipped = replay_plan(letters)
    if messages and not dry_run:
        publisher = KafkaPublisher(settings.kafka)
        try:
            publisher.publish_sync(messages)
        finally:
            publisher.close()
    report: dict[str, Any] = {
        "selected": len(letters),
        "replayed": 0 if dry_run else len(messages),
        "would_replay": len(messages) if dry_run else 0,
        "skipped": dict(sorted(skipped.items())),
        "to": sorted({m.topic for m in messages}),
    }
    if as_json:
        echo_json(report)
        return
    verb = "would replay" if dry_run else "replayed"
    skips = ", ".join(f"{reason} {n}" for reason, n in report["skipped"].items()) or "none"
    click.echo(
        f"{len(letters)} selected, {verb} {len(messages)} to {', '.join(report['to']) or '-'};"
        f" skipped: {skips}"
    )
