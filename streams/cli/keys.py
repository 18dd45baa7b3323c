"""``memproj keys``: the keys memproj holds. ``rotate`` and ``status`` are about the master keys
(the data keys they wrap); other kinds of keys get their own subgroup here (``memproj keys api
...`` for issue 18's API keys), so that ``rotate`` keeps its one meaning."""

from __future__ import annotations

import asyncio
from typing import Any

import click
import psycopg

from projections.deadletters.sealing import LetterSealer
from projections.migrate import migrate
from projections.sealing.keys import KeyStore
from projections.sealing.probes import ProbeSealer
from projections.sealing.rotation import (
    DEFAULT_BATCH,
    RotationReport,
    Sealers,
    remaining,
    rotate,
)
from streams.cli.common import echo_json, settings_of
from streams.settings import Settings


def sealers_of(settings: Settings) -> Sealers:
    master_keys = settings.worker_master_keys()
    return Sealers(KeyStore(master_keys), LetterSealer(master_keys), ProbeSealer(master_keys))


def run_rotation(settings: Settings, batch: int, *, dry_run: bool = False) -> RotationReport:
    sealers = sealers_of(settings)

    async def work() -> RotationReport:
        conninfo = settings.postgres_conninfo
        async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
            if not dry_run:
                await migrate(conn)  # the key ids come with migration 011, as for a worker
                await conn.set_autocommit(True)  # migrate leaves it off: each batch commits
                return await rotate(conn, sealers, batch)
            report = RotationReport(sealers.entity_keys.key_id)
            await remaining(conn, sealers, report)
            return report

    try:
        return asyncio.run(work())
    except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn):
        raise click.ClickException(
            "the schema has no master key ids yet: run memproj db migrate (or start a worker)"
        ) from None


def _describe(report: RotationReport, *, moved: bool = True) -> str:
    data: dict[str, Any] = report.as_json()
    done, left = data["rewrapped"], data["remaining"]
    lines = [f"newest master key: {report.newest}"]
    if moved:
        lines.append(
            f"re-wrapped: {done['entity_keys']} data keys, {done['dead_letter_keys']} dead-letter"
            f" keys, {done['probes']} probes ({report.passes} pass(es))"
        )
    if report.complete:
        lines.append("nothing is left under an older master key: the older keys can be removed")
    else:
        lines.append(
            f"left under older keys: data keys {left['entity_keys']}, dead-letter keys"
            f" {left['dead_letter_keys']}, probes {left['probes']}"
            + (
                ": run it again (a worker with an older key list writes them: give every"
                " worker the new key first)"
                if moved
                else ": run memproj keys rotate"
            )
        )
    if report.unreadable_probes:
        lines.append(f"{report.unreadable_probes} probes open with no configured key")
    return "\n".join(lines)


@click.group()
def keys() -> None:
    """The keys memproj holds: re-wrap every data key under the newest master key."""


@keys.command("rotate")
@click.option(
    "--batch",
    type=click.IntRange(1, 100_000),
    default=DEFAULT_BATCH,
    show_default=True,
    help="keys re-wrapped per transaction",
)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def keys_rotate(ctx: click.Context, batch: int, as_json: bool) -> None:
    """Re-wrap every data key, dead-letter key and deletion probe under the newest master key
    (the first of MEMPROJ_MASTER_KEYS), online, while the workers run. Idempotent and
    resumable; shredded keys stay shredded. Exits 1 while anything is left under an older key.

    A rotation: add the new key first in MEMPROJ_MASTER_KEYS (new:...,old:...) on every worker,
    run this, then remove the old key."""
    report = run_rotation(settings_of(ctx), batch)
    if as_json:
        echo_json(report.as_json())
    else:
        click.echo(_describe(report))
    if not report.complete:
        ctx.exit(1)


@keys.command("status")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def keys_status(ctx: click.Context, as_json: bool) -> None:
    """What is left under a master key other than the newest (changes nothing)."""
    report = run_rotation(settings_of(ctx), DEFAULT_BATCH, dry_run=True)
    if as_json:
        data = report.as_json()
        echo_json(
            {
                "newest_master_key": report.newest,
                "remaining": data["remaining"],
                "unreadable_probes": report.unreadable_probes,
                "complete": report.complete,
            }
        )
    else:
        click.echo(_describe(report, moved=False))
