"""Rebuilds and consumer-group offsets."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import click
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from streams.cli.common import echo_json, settings_of, talks_to_kafka
from streams.kafka import admin_config
from streams.lag import LagCollector
from streams.metrics import Metrics
from streams.replay import ReplayStopped, SwapMode, replay_projection
from streams.replay_embeddings import group_members, replay_embeddings
from streams.replay_reading import Progress as ReplayProgress
from streams.replay_reading import Start, positions, reader
from streams.runtime import tune_garbage_collection
from streams.settings import Settings
from streams.worker import WORKER_KINDS, conversation_projection, memory_projection


def parse_start(text: str) -> Start:
    if text == "earliest":
        return "earliest"
    if "=" in text:
        try:
            return {int(p): int(o) for p, o in (part.split("=") for part in text.split(","))}
        except ValueError as exc:
            raise click.BadParameter("offsets are PARTITION=OFFSET[,PARTITION=OFFSET...]") from exc
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise click.BadParameter("use earliest, an RFC 3339 time, or P=O,P=O offsets") from exc
    if moment.tzinfo is None:
        raise click.BadParameter("the time needs a zone, e.g. 2026-08-08T09:30:00Z")
    return moment


@click.command()
@click.argument("projection", type=click.Choice(["memory", "conversation", "embeddings"]))
@click.option(
    "--from", "start", default="earliest", show_default=True,
    help="earliest, a time (2026-08-08T09:30:00Z) or partition offsets (0=120,1=98)",
)  # fmt: skip
@click.option(
    "--swap/--no-swap", "swap", default=None,
    help="swap the rebuild in even if it differs / never; by default only if identical",
)  # fmt: skip
@click.option(
    "--readers", default=1, show_default=True, type=click.IntRange(1, 64),
    help="memory: processes reading disjoint partitions of the sealed log (one per core)",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@talks_to_kafka()
def replay(
    ctx: click.Context,
    projection: str,
    start: str,
    swap: bool | None,
    readers: int,
    as_json: bool,
) -> None:
    """Rebuild PROJECTION while the live workers keep serving, into a shadow (a schema for
    memory and conversation, from the sealed log; a table for embeddings, from memory.current
    and conversation.messages); compare per tenant; swap atomically when identical (or with
    --swap). The conversation projection includes its summaries and context views."""
    settings = settings_of(ctx)
    mode: SwapMode = "if-equal" if swap is None else "always" if swap else "never"
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("events · {task.fields[rate]:,.0f}/s · partitions {task.fields[parts]}"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, disable=as_json, transient=False) as bar:
        task = bar.add_task(f"rebuilding {projection}", total=None, rate=0.0, parts="-")

        def shown(progress: ReplayProgress) -> None:
            parts = f"{progress.partitions_done}/{progress.partitions}"
            bar.update(task, total=progress.total, completed=progress.done,
                       rate=progress.rate, parts=parts)  # fmt: skip

        if projection == "embeddings":
            if start != "earliest":
                raise click.BadParameter("the vector store is rebuilt from earliest only")
            rebuild = replay_embeddings(settings, mode, shown)
        else:
            target = (
                memory_projection(settings)
                if projection == "memory"
                else conversation_projection(settings, Metrics(CollectorRegistry()))
            )
            rebuild = replay_projection(
                settings, target, parse_start(start), mode, shown, readers=readers
            )
        tune_garbage_collection()
        try:
            report = asyncio.run(rebuild)
        except ReplayStopped as stopped:
            raise click.ClickException(f"replay stopped: {stopped}") from stopped
    if as_json:
        echo_json(report.to_json())
        return
    result = report.to_json()
    where = "table" if projection == "embeddings" else "schema"
    click.echo(
        f"replayed {result['events']} events in {result['seconds']}s "
        f"({result['events_per_second']}/s) into {where} {report.shadow}"
    )
    if report.differences:
        click.echo(f"differs from the live projection for {len(report.differences)} tenants:")
        for tenant, counts in list(report.differences.items())[:20]:
            click.echo(f"  {tenant}: live {counts['live']}, rebuilt {counts['rebuilt']}")
    else:
        click.echo("identical to the live projection (row counts and content checksums)")
    if report.model_change is not None:
        before, after = report.model_change
        click.echo(f"embedder changed: the live vectors are of {before}, the rebuild's of {after}")
    if report.schema_change is not None:
        before_schema, after_schema = report.schema_change
        click.echo(
            f"vector schema changed: the live table is of version {before_schema}, the"
            f" rebuild's of {after_schema} (with the memory kind and scope search filters by)"
        )
    if report.swapped and report.retired is None:
        click.echo("swapped in: the live vector table now holds the rebuild (old versions purged)")
    elif report.swapped:
        click.echo(
            f"swapped in; the previous tables are in schema {report.retired} "
            f"({report.caught_up} events caught up, {report.swept} erased rows swept)"
        )
    else:
        click.echo(f"not swapped; inspect or drop {where} {report.shadow} when done")


@click.group()
def offsets() -> None:
    """Inspect or reset a memproj consumer group's offsets."""


def _group(settings: Settings, kind: str) -> str:
    return settings.group_id(kind)


def _group_of_kind(settings: Settings, params: dict[str, Any]) -> str:
    """The group of the command's KIND: the startup check covers its ACLs too."""
    return _group(settings, params["kind"])


@offsets.command("show")
@click.argument("kind", type=click.Choice(sorted(WORKER_KINDS)))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@talks_to_kafka(_group_of_kind)
def offsets_show(ctx: click.Context, kind: str, as_json: bool) -> None:
    """Committed offset, end offset and lag per partition, and the group's active members."""
    settings = settings_of(ctx)
    group = _group(settings, kind)
    lags = LagCollector(settings.kafka, settings.group_prefix).collect([group])
    members = active_members(settings, group)
    rows = [
        {"topic": lag.topic, "partition": lag.partition, "committed": lag.committed,
         "end": lag.end, "lag_messages": lag.messages, "lag_seconds": round(lag.seconds, 1)}
        for lag in lags
    ]  # fmt: skip
    if as_json:
        echo_json({"group": group, "active_members": members, "partitions": rows})
        return
    click.echo(f"group {group}: {len(members)} active members {members or ''}")
    for row in rows:
        click.echo(
            f"  {row['topic']}[{row['partition']}] committed={row['committed']} end={row['end']}"
            f" lag={row['lag_messages']} ({row['lag_seconds']}s)"
        )


def active_members(settings: Settings, group: str) -> list[str]:
    return group_members(settings, group)


@offsets.command("reset")
@click.argument("kind", type=click.Choice(sorted(WORKER_KINDS)))
@click.option(
    "--to", "to", required=True,
    help="earliest, latest, a time (2026-08-08T09:30:00Z) or partition offsets (0=120,1=98)",
)  # fmt: skip
@click.option("--topic", help="only this topic of the group (default: all it has committed)")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@talks_to_kafka(_group_of_kind)
def offsets_reset(ctx: click.Context, kind: str, to: str, topic: str | None, as_json: bool) -> None:
    """Move where a stopped worker's group resumes. The projections' tracking offsets in
    PostgreSQL still make redelivered messages no-ops: to rebuild, use memproj replay."""
    settings = settings_of(ctx)
    group = _group(settings, kind)
    members = active_members(settings, group)
    if members:
        raise click.ClickException(
            f"group {group} has {len(members)} active members ({', '.join(members)}): stop "
            f"every `memproj worker {kind}` process first (offsets can only be reset while "
            "the group is empty), then run this again"
        )
    lags = LagCollector(settings.kafka, settings.group_prefix).collect([group])
    targets = sorted({lag.topic for lag in lags if topic is None or lag.topic == topic})
    if not targets:
        raise click.ClickException(f"group {group} has no committed offsets to reset")
    new = _resolve(settings, targets, to)
    admin = AdminClient(admin_config(settings.kafka))
    result = admin.alter_consumer_group_offsets(
        [
            ConsumerGroupTopicPartitions(
                group, [TopicPartition(t, p, o) for (t, p), o in new.items()]
            )
        ]
    )[group].result()
    rows = [{"topic": tp.topic, "partition": tp.partition, "offset": tp.offset}
            for tp in result.topic_partitions]  # fmt: skip
    if as_json:
        echo_json({"group": group, "reset": rows})
        return
    for row in rows:
        click.echo(f"{group} {row['topic']}[{row['partition']}] -> {row['offset']}")


def _resolve(settings: Settings, topics: list[str], to: str) -> dict[tuple[str, int], int]:
    consumer = reader(settings)
    try:
        if to == "latest":
            _, ends = positions(consumer, topics, "earliest")
            return ends
        starts, _ = positions(consumer, topics, parse_start(to))
        return starts
    finally:
        consumer.close()
