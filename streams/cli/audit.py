"""``memproj audit plaintext``: where a marker string is still readable."""

from __future__ import annotations

import asyncio
import sys

import click

from streams.audit.plaintext import InvalidMarker, Matcher
from streams.audit.run import Source, audit_plaintext
from streams.cli.common import check_kafka, echo_json, settings_of
from streams.failures import loggable


@click.command("plaintext")
@click.argument("marker")
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--schema",
    "schemas",
    multiple=True,
    help="search only this PostgreSQL schema (repeatable); default: every memproj schema",
)
@click.option(
    "--source",
    "sources",
    multiple=True,
    type=click.Choice([source.value for source in Source]),
    help="search only this source (repeatable); default: all",
)
@click.pass_context
def plaintext(
    ctx: click.Context,
    marker: str,
    as_json: bool,
    schemas: tuple[str, ...],
    sources: tuple[str, ...],
) -> None:
    """Search every table of every memproj schema, every memproj topic (keys, values,
    headers, dead letters' originals, sealed fields whose key still exists), Redis and the
    data directory for MARKER, and report where it is readable (ids and offsets, never the
    content). MARKER '-' reads it from standard input (so that it stays out of the process
    list). Exit status: 0 readable nowhere (or only inside a raw input topic's window),
    1 readable somewhere else, 2 the audit could not look everywhere."""
    settings = settings_of(ctx)
    if marker == "-":
        marker = sys.stdin.read().rstrip("\n")
    try:
        matcher = Matcher.of(marker)
    except InvalidMarker as error:
        raise click.UsageError(str(error)) from None
    chosen = [Source(s) for s in sources] or list(Source)
    try:
        if Source.KAFKA in chosen:
            check_kafka(settings)  # Kafka refusing or away: one line within seconds, exit 2
        report = asyncio.run(audit_plaintext(settings, marker, schemas=schemas, sources=chosen))
    except Exception as error:  # every failure: exit 2, quoting nothing (the marker least)
        click.echo(f"audit failed: {matcher.redact(loggable(error))}", err=True)
        raise SystemExit(2) from None
    if as_json:
        echo_json(report.to_json())
    else:
        for line in report.lines():
            click.echo(line)
    raise SystemExit(report.exit_status())
