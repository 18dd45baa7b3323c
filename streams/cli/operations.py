"""Operating memproj: topics, schema migrations and workers."""

from __future__ import annotations

import click
from psycopg import sql

from projections.migrate import migrate
from projections.sql import Conn
from streams.cli.common import echo_json, settings_of, talks_to_kafka, with_connection
from streams.kafka import create_topics
from streams.runtime import limit_malloc_arenas, tune_garbage_collection, use_system_arrow_pool
from streams.worker import WORKER_KINDS, build_worker
from topics.registry import ALL_TOPICS


@click.group()
def topics() -> None:
    """The contract's topics."""


@topics.command("create")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
@click.pass_context
@talks_to_kafka()
def topics_create(ctx: click.Context, as_json: bool) -> None:
    """Create every topic of the registry that does not exist yet, and bring the configs of
    existing ones (retention, compaction bounds) up to the registry (idempotent)."""
    settings = settings_of(ctx)
    results = create_topics(settings.kafka, settings.topics, ALL_TOPICS, settings.topic_replication)
    if as_json:
        echo_json(
            [{"topic": r.name, "created": r.created, "updated": list(r.changes)} for r in results]
        )
        return
    for result in results:
        click.echo(f"{result.detail:8} {result.name}")
        for change in result.changes:
            click.echo(f"         {change}")


@topics.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def topics_list(ctx: click.Context, as_json: bool) -> None:
    """Show the registry: name, key, partitions, cleanup policy and retention."""
    names = settings_of(ctx).topics
    rows = [
        {
            "topic": names.name(spec),
            "key": spec.key,
            "role": spec.role.value,
            "partitions": spec.partitions,
            "cleanup.policy": spec.cleanup_policy.value,
            "retention.ms": spec.retention_ms,
            "lifetime": dict(spec.lifetime),
        }
        for spec in ALL_TOPICS
    ]
    if as_json:
        echo_json(rows)
        return
    for spec, row in zip(ALL_TOPICS, rows, strict=True):
        click.echo(
            f"{row['topic']:28} {row['key']:28} p={row['partitions']} "
            f"{row['cleanup.policy']:8} retention={row['retention.ms']}"
            + "".join(f" {name}={value}" for name, value in spec.lifetime)
        )


@click.group()
def db() -> None:
    """The PostgreSQL schema."""


@db.command("migrate")
@click.option("--schema", help="create this PostgreSQL schema if needed and migrate it")
@click.pass_context
def db_migrate(ctx: click.Context, schema: str | None) -> None:
    """Apply pending migrations (workers also do this when they start)."""

    async def run(conn: Conn) -> list[str]:
        if schema:
            await conn.execute(
                sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema))
            )
            await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            await conn.commit()
        return await migrate(conn)

    applied = with_connection(settings_of(ctx), run)
    click.echo("applied: " + (", ".join(applied) if applied else "nothing, schema is current"))


@click.command()
@click.argument("kind", type=click.Choice(sorted(WORKER_KINDS)))
@click.pass_context
def worker(ctx: click.Context, kind: str) -> None:
    """Run a streaming worker (one consumer group per KIND) until stopped."""
    limit_malloc_arenas()  # before librdkafka's, LanceDB's and the agents' threads start
    use_system_arrow_pool()  # before LanceDB imports pyarrow
    built = build_worker(settings_of(ctx), kind)
    tune_garbage_collection()
    built.execute_from_commandline()
