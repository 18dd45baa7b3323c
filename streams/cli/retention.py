"""Retention and legal holds: ``memproj retention set|clear|list|report`` and
``memproj hold add|release|list``."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import click

from projections.retention import classes, holds
from projections.retention import store as schedule_store
from projections.retention.schedule import TENANT_DEFAULT, ClassReceipt
from projections.sql import Conn
from streams.cli.common import echo_json, settings_of, with_connection
from streams.cli.memory import parse_duration, subject_of, subject_options
from streams.sample import iso


@click.group()
def retention() -> None:
    """Retention classes per tenant (class -> period after the last message, or keep), and
    the receipt of what retention erased."""


@retention.command("set")
@click.option("--tenant", required=True)
@click.option(
    "--class", "retention_class", required=True, help=f"the class; '{TENANT_DEFAULT}': default"
)
@click.option("--period", help="e.g. 90d, 12h, 30s (after the conversation's last message)")
@click.option("--keep", is_flag=True, help="never erased by retention")
@click.option("--actor", default="memproj-cli", show_default=True, help="who sets it")
@click.pass_context
def set_class(
    ctx: click.Context,
    tenant: str,
    retention_class: str,
    period: str | None,
    keep: bool,
    actor: str,
) -> None:
    """Set a class's period (or --keep) for a tenant."""
    if keep == (period is not None):
        raise click.BadParameter("give --period or --keep, not both")
    duration = None if keep else parse_duration(period or "")

    async def work(conn: Conn) -> None:
        await classes.set_class(conn, tenant, retention_class, duration, datetime.now(UTC), actor)
        await conn.commit()

    with_connection(settings_of(ctx), work)
    click.echo(
        f"{tenant} {retention_class}: "
        + period_text(None if duration is None else duration.total_seconds())
    )


@retention.command("clear")
@click.option("--tenant", required=True)
@click.option("--class", "retention_class", required=True)
@click.pass_context
def clear_class(ctx: click.Context, tenant: str, retention_class: str) -> None:
    """Forget a class's setting: its conversations get the tenant's default."""

    async def work(conn: Conn) -> bool:
        cleared = await classes.clear_class(conn, tenant, retention_class)
        await conn.commit()
        return cleared

    if not with_connection(settings_of(ctx), work):
        raise click.ClickException(f"{tenant} has no class {retention_class!r}")
    click.echo(f"cleared {tenant} {retention_class}")


def period_text(seconds: float | None) -> str:
    """A period as set (``90d``, ``12h``, ``30s``): the largest unit that divides it."""
    if seconds is None:
        return "keep"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:g}s"


@retention.command("list")
@click.option("--tenant")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def list_classes(ctx: click.Context, tenant: str | None, as_json: bool) -> None:
    """The classes configured, and the deployment's default for the others."""
    settings = settings_of(ctx)
    rows = with_connection(settings, lambda conn: classes.list_classes(conn, tenant))
    default = settings.retention_default
    listed: list[dict[str, Any]] = [
        {
            "tenant_id": row.tenant_id,
            "retention_class": row.retention_class,
            "period_seconds": None if row.period is None else row.period.total_seconds(),
            "updated_at": iso(row.updated_at),
            "updated_by": row.updated_by,
        }
        for row in rows
    ]
    if as_json:
        echo_json(
            {
                "classes": listed,
                "default_seconds": None if default is None else default.total_seconds(),
            }
        )
        return
    for row in listed:
        click.echo(
            f"{row['tenant_id']}\t{row['retention_class']}\t{period_text(row['period_seconds'])}"
            f"\t{row['updated_at']} by {row['updated_by']}"
        )
    click.echo(
        "default for classes not configured (MEMPROJ_RETENTION_DEFAULT_SECONDS): "
        + period_text(None if default is None else default.total_seconds())
    )


def receipt_json(lines: list[ClassReceipt], now: datetime) -> dict[str, Any]:
    return {"at": iso(now), "classes": [asdict(line) for line in lines]}


@retention.command("report")
@click.option("--tenant")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def report(ctx: click.Context, tenant: str | None, as_json: bool) -> None:
    """The receipt: per tenant and class, conversations inside their period, held, due,
    erased on time and late, and the oldest overdue."""
    settings = settings_of(ctx)
    now = datetime.now(UTC)
    lines = with_connection(
        settings,
        lambda conn: schedule_store.receipt(conn, now, settings.retention_default, tenant),
    )
    if as_json:
        echo_json(receipt_json(lines, now))
        return
    click.echo("tenant\tclass\tperiod\tinside\theld\tdue\ton_time\tlate\toldest_overdue_s")
    for line in lines:
        period = (
            "expiry+grace"
            if line.retention_class == schedule_store.EXPIRED_MEMORIES
            else period_text(line.period_seconds)
        )
        click.echo(
            f"{line.tenant_id}\t{line.retention_class}\t{period}"
            f"\t{line.inside_period}\t{line.held}\t{line.due}\t{line.erased_on_time}"
            f"\t{line.erased_late}\t{line.oldest_overdue_seconds:.0f}"
        )


@click.group()
def hold() -> None:
    """Legal holds: a held subject or conversation is skipped by retention and expiry, and an
    erasure of it is refused (and recorded) until the hold is released."""


@hold.command("add")
@click.option("--tenant", required=True)
@click.option("--conversation", "conversation_id", help="hold a conversation")
@subject_options
@click.option("--reason", required=True, help="why (kept with the hold, audited)")
@click.option("--actor", default="memproj-cli", show_default=True, help="who holds")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def add_hold(
    ctx: click.Context,
    tenant: str,
    conversation_id: str | None,
    subject: str | None,
    subject_type: str | None,
    subject_id: str | None,
    reason: str,
    actor: str,
    as_json: bool,
) -> None:
    """Hold a subject (--subject TYPE:ID) or a conversation (--conversation ID)."""
    if conversation_id is not None:
        if subject or subject_type or subject_id:
            raise click.BadParameter("hold a subject or a conversation, not both")
        target: tuple[holds.HoldTarget, str, str] = ("conversation", conversation_id, "")
    else:
        kind, identifier = subject_of(subject, subject_type, subject_id)
        target = ("subject", identifier, kind)

    async def work(conn: Conn) -> holds.Hold:
        added = await holds.add(
            conn, tenant, target[0], target[1], target[2], reason, actor, datetime.now(UTC)
        )
        await conn.commit()
        return added

    added = with_connection(settings_of(ctx), work)
    if as_json:
        echo_json(_hold_json(added))
    else:
        click.echo(f"held: {added.names()}")


@hold.command("release")
@click.option("--tenant", required=True)
@click.option("--hold", "hold_id", required=True)
@click.option("--actor", default="memproj-cli", show_default=True, help="who releases")
@click.pass_context
def release_hold(ctx: click.Context, tenant: str, hold_id: str, actor: str) -> None:
    """Release a hold: retention and expiry catch up at their next round."""

    async def work(conn: Conn) -> holds.Hold | None:
        released = await holds.release(conn, tenant, hold_id, actor, datetime.now(UTC))
        await conn.commit()
        return released

    released = with_connection(settings_of(ctx), work)
    if released is None:
        raise click.ClickException(f"{tenant} has no hold {hold_id} in force")
    click.echo(f"released: {released.names()}")


def _hold_json(found: holds.Hold) -> dict[str, Any]:
    data = asdict(found)
    data["held_at"] = iso(found.held_at)
    data["released_at"] = None if found.released_at is None else iso(found.released_at)
    return data


@hold.command("list")
@click.option("--tenant")
@click.option("--all", "include_released", is_flag=True, help="released holds too")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def list_holds(
    ctx: click.Context, tenant: str | None, include_released: bool, as_json: bool
) -> None:
    """The holds in force (--all: released ones too, with who released them and when)."""
    found = with_connection(
        settings_of(ctx),
        lambda conn: holds.list_holds(conn, tenant, include_released=include_released),
    )
    if as_json:
        echo_json({"holds": [_hold_json(h) for h in found]})
        return
    for item in found:
        released = (
            ""
            if item.released_at is None
            else f"\treleased {iso(item.released_at)} by {item.released_by}"
        )
        click.echo(f"{item.tenant_id}\t{item.names()}\theld {iso(item.held_at)}{released}")
