"""``memproj subject``: pause a subject (the recovery runbook's first step), resume it, and
list the pauses and their log (``projections.access.pauses``)."""

from __future__ import annotations

import functools
import getpass
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import click

from projections.access import pauses
from projections.sql import Conn
from streams.cli.common import echo_json, settings_of, with_migrated
from streams.cli.memory import subject_of, subject_options


@dataclass(frozen=True, slots=True)
class Acting:
    """Who pauses or resumes which subject of which tenant, and why."""

    tenant: str
    subject: tuple[str, str]
    operator: str
    reason: str

    @property
    def named(self) -> str:
        return f"{self.subject[0]}:{self.subject[1]} of tenant {self.tenant}"


def acting_on_subject(command: Callable[[click.Context, Acting], None]) -> Any:
    """The options of a pause or resume (the tenant, the subject, the reason, the operator),
    handed to ``command`` as one ``Acting``."""

    @click.option("--tenant", required=True)
    @subject_options
    @click.option(
        "--reason",
        required=True,
        help="why, for the log (credentials are masked; erased with the subject)",
    )
    @click.option(
        "--operator",
        default=getpass.getuser,
        show_default="the OS user",
        help="who acts, as the log records it",
    )
    @click.pass_context
    @functools.wraps(command)
    def run(
        ctx: click.Context,
        tenant: str,
        subject: str | None,
        subject_type: str | None,
        subject_id: str | None,
        reason: str,
        operator: str,
    ) -> None:
        who = subject_of(subject, subject_type, subject_id)
        command(ctx, Acting(tenant, who, operator, reason))

    return run


def _pause_json(pause: pauses.Pause) -> dict[str, Any]:
    return {
        "tenant_id": pause.tenant_id,
        "subject_type": pause.subject_type,
        "subject_id": pause.subject_id,
        "paused_at": pause.paused_at.isoformat(),
        "paused_by": pause.paused_by,
    }


def _entry_json(entry: pauses.LogEntry) -> dict[str, Any]:
    return {
        "at": entry.at.isoformat(),
        "tenant_id": entry.tenant_id,
        "subject_type": entry.subject_type,
        "subject_id": entry.subject_id,
        "action": entry.action,
        "operator": entry.operator,
        "reason": entry.reason,
        "reason_erased_at": entry.reason_erased_at.isoformat() if entry.reason_erased_at else None,
    }


@click.group()
def subject() -> None:
    """Pause a subject: no read path (recall, search, context view, the API, the cache)
    serves its memories or the conversations it owns, while its events are still applied.
    Shared by every process and API replica from the moment the command returns."""


@subject.command("pause")
@acting_on_subject
def subject_pause(ctx: click.Context, acting: Acting) -> None:
    """Stop serving a subject (logged). A subject paused already stays paused as it was."""

    async def work(conn: Conn) -> pauses.Pause | None:
        now = datetime.now(UTC)
        return await pauses.pause(
            conn, acting.tenant, acting.subject, acting.operator, acting.reason, now
        )

    if with_migrated(settings_of(ctx), work) is None:
        click.echo(f"{acting.named} was paused already (nothing changed)")
    else:
        click.echo(f"paused {acting.named}: no read path serves it")


@subject.command("resume")
@acting_on_subject
def subject_resume(ctx: click.Context, acting: Acting) -> None:
    """Serve a paused subject again (logged), with every event applied while it was paused."""

    async def work(conn: Conn) -> bool:
        now = datetime.now(UTC)
        return await pauses.resume(
            conn, acting.tenant, acting.subject, acting.operator, acting.reason, now
        )

    if not with_migrated(settings_of(ctx), work):
        raise click.ClickException(f"{acting.named} is not paused")
    click.echo(f"resumed {acting.named}: served again")


@subject.command("list")
@click.option("--tenant", help="one tenant's pauses (default: every tenant's)")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def subject_list(ctx: click.Context, tenant: str | None, as_json: bool) -> None:
    """The subjects paused now: who paused them and when."""
    found = with_migrated(settings_of(ctx), lambda conn: pauses.list_pauses(conn, tenant))
    if as_json:
        echo_json([_pause_json(pause) for pause in found])
        return
    if not found:
        click.echo("no subject is paused")
    for pause in found:
        click.echo(
            f"{pause.tenant_id:16} {pause.subject_type}:{pause.subject_id:24} paused"
            f" {pause.paused_at.isoformat()} by {pause.paused_by}"
        )


@subject.command("log")
@click.option("--tenant", required=True)
@click.option("--subject", help="TYPE:ID: one subject's log (default: the tenant's)")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def subject_log(ctx: click.Context, tenant: str, subject: str | None, as_json: bool) -> None:
    """Every pause and resume, oldest first: who, when, why."""
    who = subject_of(subject, None, None) if subject is not None else None
    entries = with_migrated(settings_of(ctx), lambda conn: pauses.log_of(conn, tenant, who))
    if as_json:
        echo_json([_entry_json(entry) for entry in entries])
        return
    for entry in entries:
        click.echo(
            f"{entry.at.isoformat()} {entry.action:6} {entry.subject_type}:{entry.subject_id}"
            f" by {entry.operator}: {entry.reason}"
        )
