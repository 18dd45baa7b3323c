"""Watching memproj: the ghost audit on demand, and a live terminal view."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import click
import psycopg
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from projections.deletion import audit as ghost_audit
from projections.deletion import lifecycle as ledger
from projections.deletion import queries as blocked
from projections.sql import Conn
from projections.stores import STORES
from streams.cli.audit import plaintext
from streams.cli.common import echo_json, settings_of, talks_to_kafka
from streams.lag import LagCollector, PartitionLag
from streams.services import StoreSupplies, make_pool
from streams.settings import Settings


@click.group()
def audit() -> None:
    """Reconciliation audits."""


audit.add_command(plaintext)


@audit.command("ghosts")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def audit_ghosts(ctx: click.Context, as_json: bool) -> None:
    """Scan every derived store for items the ledger says are deleted (ghost memory)."""
    settings = settings_of(ctx)

    async def run() -> dict[str, Any]:
        # Stores read through the connection below: the pool is never opened.
        supplies = StoreSupplies(settings, make_pool(settings.postgres_conninfo, 1))
        try:
            stores = STORES.open_all(supplies)
            async with await psycopg.AsyncConnection.connect(settings.postgres_conninfo) as conn:
                results = await ghost_audit.audit_ghosts(conn, stores, datetime.now(UTC))
                await conn.commit()
        finally:
            await supplies.aclose()
        return {store: result.to_json() for store, result in results.items()}

    found = asyncio.run(run())
    if as_json:
        echo_json(found)
    else:
        for store, result in found.items():
            examples = f"  e.g. {result['examples'][:3]}" if result["examples"] else ""
            click.echo(f"{store:10} {result['ghost_items']:6} ghost items{examples}")
    if any(result["ghost_items"] for result in found.values()):
        raise SystemExit(1)


@dataclass(slots=True)
class Snapshot:
    taken: float
    lags: list[PartitionLag]
    pending: dict[str, ledger.PendingDeletions]
    ghosts: dict[str, tuple[int, datetime]]
    blocked: dict[str, int]
    rates: dict[str, float] = field(default_factory=dict)


async def _ledger_view(settings: Settings) -> tuple[Any, Any, Any]:
    async with await psycopg.AsyncConnection.connect(settings.postgres_conninfo) as conn:
        return await _read(conn)


async def _read(conn: Conn) -> tuple[Any, Any, Any]:
    pending = await ledger.pending_by_store(conn, datetime.now(UTC))
    return pending, await ghost_audit.latest(conn), await blocked.blocked_reads(conn)


def take(settings: Settings, lag: LagCollector, previous: Snapshot | None) -> Snapshot:
    lags = lag.collect()
    pending, ghosts, blocked = asyncio.run(_ledger_view(settings))
    snapshot = Snapshot(time.monotonic(), lags, pending, ghosts, blocked)
    if previous is not None:
        elapsed = snapshot.taken - previous.taken
        before = _consumed(previous.lags)
        for group, consumed in _consumed(lags).items():
            if group in before and elapsed > 0:
                snapshot.rates[group] = max(0.0, (consumed - before[group]) / elapsed)
    return snapshot


def _consumed(lags: list[PartitionLag]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for lag in lags:
        totals[lag.group] += lag.committed or 0
    return totals


def render(snapshot: Snapshot, settings: Settings) -> Group:
    groups = Table(title="consumer groups", expand=True)
    for column in ("group", "topic", "lag (messages)", "lag (seconds)", "apply rate /s"):
        groups.add_column(column, justify="left" if column in ("group", "topic") else "right")
    by_group: dict[tuple[str, str], list[PartitionLag]] = defaultdict(list)
    for lag in snapshot.lags:
        by_group[(lag.group, lag.topic)].append(lag)
    for (group, topic), lags in sorted(by_group.items()):
        seconds = max(lag.seconds for lag in lags)
        rate = snapshot.rates.get(group)
        groups.add_row(
            group,
            topic,
            str(sum(lag.messages for lag in lags)),
            f"{seconds:.1f}",
            "-" if rate is None else f"{rate:,.0f}",
            style="red" if seconds > 300 else None,
        )
    stores = Table(title="derived stores", expand=True)
    for column in ("store", "pending", "oldest (s)", "overdue", "ghost items", "blocked reads"):
        stores.add_column(column, justify="left" if column == "store" else "right")
    for store in STORES.names:
        pending = snapshot.pending.get(store, ledger.PendingDeletions(0, 0.0, 0))
        ghosts, audited = snapshot.ghosts.get(store, (0, None))
        stores.add_row(
            store,
            str(pending.count),
            f"{pending.oldest_seconds:.1f}",
            str(pending.overdue),
            f"{ghosts}" + (f" ({audited:%H:%M:%S})" if audited else " (no audit yet)"),
            str(snapshot.blocked.get(store, 0)),
            style="red" if ghosts or pending.overdue else None,
        )
    now = datetime.now(UTC)
    title = f"memproj top — {now:%Y-%m-%d %H:%M:%S} UTC — groups {settings.group_prefix}-*"
    return Group(title, groups, stores)


@click.command()
@click.option("--interval", default=2.0, show_default=True, help="seconds between refreshes")
@click.option("--once", is_flag=True, help="print one snapshot (two, to measure rates) and exit")
@click.pass_context
@talks_to_kafka()
def top(ctx: click.Context, interval: float, once: bool) -> None:
    """A live view per consumer group and derived store: lag in messages and seconds, apply
    rate, pending deletions and their age, ghost items, blocked ghost reads."""
    settings = settings_of(ctx)
    lag = LagCollector(settings.kafka, settings.group_prefix)
    snapshot = take(settings, lag, None)
    if once:
        time.sleep(interval)
        Console(width=140).print(render(take(settings, lag, snapshot), settings))
        return
    with Live(render(snapshot, settings), refresh_per_second=4, screen=False) as live:
        try:
            while True:
                time.sleep(interval)
                snapshot = take(settings, lag, snapshot)
                live.update(render(snapshot, settings))
        except KeyboardInterrupt:
            pass
