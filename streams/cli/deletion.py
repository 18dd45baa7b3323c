"""Deletion operations: request a deletion, follow it, list what is pending."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import click
import psycopg

from projections import rejections
from projections.deletion import lifecycle
from projections.retention import holds as legal_holds
from projections.sql import Conn
from streams.cli.common import echo_json, publish, settings_of, talks_to_kafka, with_connection
from streams.cli.memory import parse_duration, subject_of, subject_options
from streams.deletion_requests import InvalidDeletionRequest, build_deletion_request
from streams.sample import iso
from topics.deletion import DeletionTarget
from topics.registry import DELETION_REQUESTS


def request_deletion(
    ctx: click.Context,
    tenant: str,
    target: dict[str, str],
    reason: str,
    deadline: str | None,
    actor: str,
    as_json: bool,
) -> None:
    settings = settings_of(ctx)
    try:
        request = build_deletion_request(
            tenant,
            target,
            reason,
            ("operator", actor),
            datetime.now(UTC),
            parse_duration(deadline) if deadline else None,
        )
    except InvalidDeletionRequest as exc:
        raise click.BadParameter(str(exc)) from None
    publish(settings, DELETION_REQUESTS, request.key, request.value, "the request")
    # Published whether held or not: the ledger decides, and records a refusal. Looked up
    # here to say so at once; without PostgreSQL the ledger's status says it later.
    try:
        held = with_connection(
            settings,
            lambda conn: legal_holds.holding_request(
                conn, tenant, DeletionTarget.model_validate(target), request.requested_at
            ),
        )
    except psycopg.Error:
        held = None
    if held is not None:
        raise click.ClickException(
            f"refused: {held.description} is in force; recorded as deletion"
            f" {request.deletion_id} (memproj hold list --tenant {tenant})"
        )
    if as_json:
        echo_json(
            {
                "deletion_id": request.deletion_id,
                "tenant_id": tenant,
                "requested_at": iso(request.requested_at),
            }
        )
    else:
        click.echo(
            f"requested {request.deletion_id}; follow it with:"
            f" memproj deletion status {request.deletion_id}"
        )


_COMMON = [
    click.option("--tenant", required=True),
    click.option("--reason", default="requested by an operator", show_default=True),
    click.option(
        "--deadline",
        help="how long the stores have (e.g. 10m, 24h); default: MEMPROJ_DELETION_DEADLINE_SECONDS",
    ),
    click.option("--actor", default="memproj-cli", show_default=True, help="who asks"),
    click.option("--json", "as_json", is_flag=True),
]


def _common(function: Any) -> Any:
    for option in reversed(_COMMON):
        function = option(function)
    return function


@click.group()
def delete() -> None:
    """Request a deletion (published to deletion.requests; the deletion worker carries it out)."""


@delete.command("subject")
@subject_options
@_common
@click.pass_context
@talks_to_kafka()
def delete_subject(
    ctx: click.Context,
    /,
    subject: str | None,
    subject_type: str | None,
    subject_id: str | None,
    **options: Any,
) -> None:
    """Erase a subject: its memories, the conversations it owns, and all derived from them."""
    subject_type, subject_id = subject_of(subject, subject_type, subject_id)
    target = {"type": "subject", "id": subject_id, "subject_type": subject_type}
    request_deletion(ctx, target=target, **options)


@delete.command("conversation")
@click.option("--conversation", "conversation_id", required=True)
@_common
@click.pass_context
@talks_to_kafka()
def delete_conversation(ctx: click.Context, /, conversation_id: str, **options: Any) -> None:
    """Delete a conversation: messages, summaries, context view, and memories sourced from it."""
    request_deletion(ctx, target={"type": "conversation", "id": conversation_id}, **options)


@delete.command("memory")
@click.option("--memory-id", required=True)
@_common
@click.pass_context
@talks_to_kafka()
def delete_memory(ctx: click.Context, /, memory_id: str, **options: Any) -> None:
    """Erase one memory, its history and every derived copy."""
    request_deletion(ctx, target={"type": "memory", "id": memory_id}, **options)


@click.group()
def deletion() -> None:
    """Follow deletions: per-store state, timings, verification."""


@deletion.command("status")
@click.argument("deletion_id")
@click.option("--tenant", help="the tenant (needed only if the id exists for several)")
@click.option(
    "--wait", "wait_seconds", type=float, default=0, help="wait up to this long for verification"
)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def deletion_status(
    ctx: click.Context, deletion_id: str, tenant: str | None, wait_seconds: float, as_json: bool
) -> None:
    """Per-store state, timings, verification and purge (no copy left anywhere) of one
    deletion."""

    async def load(conn: Conn) -> list[dict[str, Any]]:
        deadline = time.monotonic() + wait_seconds
        while True:
            tenants = [tenant] if tenant else await lifecycle.tenants_of(conn, deletion_id)
            found = [await lifecycle.request_detail(conn, t, deletion_id) for t in tenants]
            details = [detail for detail in found if detail is not None]
            await conn.rollback()  # a fresh snapshot for the next look
            settled = details and all(d["verified_at"] is not None for d in details)
            if settled or time.monotonic() > deadline:
                return details
            await asyncio.sleep(0.2)

    details = with_connection(settings_of(ctx), load)
    if not details and tenant is not None:
        refusal = with_connection(
            settings_of(ctx), lambda conn: rejections.legal_hold_refusal(conn, tenant, deletion_id)
        )
        if refusal is not None:
            raise click.ClickException(f"deletion {deletion_id}: {refusal}")
    if not details:
        raise click.ClickException(f"no deletion {deletion_id!r} (it may not be applied yet)")
    if as_json:
        echo_json(details[0] if len(details) == 1 else details)
        return
    for detail in details:
        click.echo(
            f"{detail['deletion_id']} ({detail['kind']} of {detail['target_type']} "
            f"{detail['target_id']}, tenant {detail['tenant_id']}): {detail['status']}"
        )
        click.echo(f"  items: {detail['items']}")
        for name, state in detail["stores"].items():
            timing = f" after {state['seconds_to_ack']:.1f}s" if "seconds_to_ack" in state else ""
            click.echo(
                f"  {name:10} {state['status']:8}{timing} removed={state['removed_count']}"
                f" attempts={state['attempts']} redeliveries={state['redeliveries']}"
                + (f" error={state['error']}" if state["error"] else "")
            )
        click.echo("  purge: " + _purge_line(detail))
        verification = detail["verification"]
        click.echo(
            "  verification: "
            + (
                "pending"
                if verification is None
                else "clean"
                if verification["clean"]
                else f"FOUND {verification['found']}"
            )
        )


def _purge_line(detail: dict[str, Any]) -> str:
    """``purged after Ns``, or which places still hold a copy (``completed`` is not gone)."""
    if "seconds_to_purge" in detail:
        return f"purged after {detail['seconds_to_purge']:.1f}s (no copy left anywhere)"
    places = detail["purge"]
    if not places:
        return "not checked yet (checked once the deletion is completed)"
    waiting = sorted(place for place, state in places.items() if state["purged_at"] is None)
    return "waiting for " + ", ".join(waiting)


@deletion.command("list")
@click.option("--pending", is_flag=True, help="only requests not completed yet")
@click.option("--tenant")
@click.option("--limit", default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def deletion_list(
    ctx: click.Context, pending: bool, tenant: str | None, limit: int, as_json: bool
) -> None:
    """Recent deletions, newest first, with the stores still to acknowledge."""
    rows = with_connection(
        settings_of(ctx), lambda conn: lifecycle.list_requests(conn, tenant, pending, limit)
    )
    if as_json:
        echo_json(rows)
        return
    for row in rows:
        waiting = ", ".join(row["waiting_for"]) or "-"
        click.echo(
            f"{row['deletion_id']:40} {row['tenant_id']:12} {row['kind']:10} "
            f"{row['target_type']}:{row['target_id']:16} {row['status']:9} waiting for {waiting}"
        )
