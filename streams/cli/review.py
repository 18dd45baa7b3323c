"""Review of held writes: list the queue, show a reviewer's diff, approve or reject."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

import click

from projections.memory import store as memory_store
from projections.memory.evolve import REVIEWER_TYPES
from streams.cli.common import echo_json, publish, settings_of, talks_to_kafka, with_connection
from streams.reviews import InvalidReview, build_review, pending_diffs
from topics.api.models import ReviewDiff
from topics.envelope import ActorType
from topics.registry import MEMORY_EVENTS


@click.group()
def review() -> None:
    """Writes held for review: what awaits a person, and their decision (memory.reviewed)."""


def _value(value: Any) -> str:
    return "-" if value is None else str(value)


def print_diff(diff: ReviewDiff) -> None:
    """The compact diff a reviewer decides from (also the demo's)."""
    served = diff.served
    click.echo(
        f"{diff.memory_id} v{diff.version} held for review by {_value(diff.review_rule)}"
        f" (policy v{diff.policy_version})\n"
        f"  {diff.event_type} by {diff.proposed_by['type']}:{diff.proposed_by['id']}"
        f" at {diff.proposed_at.isoformat()}\n"
        f"  subject {diff.subject['type']}:{diff.subject['id']}  scope {diff.scope}"
        f"  kind {diff.kind}  expires {_value(diff.expires_at)}\n"
        f"  source {diff.source['type']}:{diff.source['ref']}"
        f"  verification {_value(diff.verification)}\n"
        f"+ proposed: {diff.proposed_value}"
    )
    if served is None:
        click.echo("- served:   nothing (never served)")
    else:
        click.echo(f"- served:   v{served.version} {served.status} {served.value}")
    if not diff.evidence_event_ids:
        click.echo("  evidence: none cited")
    found = {message.event_id for message in diff.evidence}
    for message in diff.evidence:
        text = " ".join(
            str(block.get("text", f"[{block.get('type')}]")) for block in message.content
        )
        click.echo(
            f"  evidence {message.event_id}: {message.conversation_id}/{message.message_id}"
            f" {message.role}: {text}"
        )
    for event_id in diff.evidence_event_ids:
        if event_id not in found:
            click.echo(f"  evidence {event_id}: not a stored message (a memory event, or gone)")


@review.command("list")
@click.option("--tenant", required=True)
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1000))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def review_list(ctx: click.Context, tenant: str, limit: int, as_json: bool) -> None:
    """The tenant's versions held for review, oldest first."""
    diffs = with_connection(settings_of(ctx), lambda conn: pending_diffs(conn, tenant, limit))
    if as_json:
        echo_json([diff.model_dump(mode="json") for diff in diffs])
        return
    if not diffs:
        click.echo("nothing awaits review")
    now = datetime.now(UTC)
    for diff in diffs:
        age = (now - diff.proposed_at).total_seconds()
        click.echo(
            f"{diff.memory_id:16} v{diff.version} {diff.kind:12} {_value(diff.review_rule):28}"
            f" waiting {age:.0f}s {diff.proposed_value}"
        )


@review.command("queue")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def review_queue(ctx: click.Context, as_json: bool) -> None:
    """Per tenant: how many writes await review and how long the oldest has waited (what
    memproj_review_queue_size and memproj_review_oldest_pending_seconds sum up)."""
    queue = with_connection(
        settings_of(ctx), lambda conn: memory_store.review_queue(conn, datetime.now(UTC))
    )
    ordered = sorted(queue.items(), key=lambda item: -item[1][1])
    if as_json:
        echo_json({tenant: {"pending": n, "oldest_seconds": age} for tenant, (n, age) in ordered})
        return
    if not ordered:
        click.echo("nothing awaits review")
    for tenant, (count, age) in ordered:
        click.echo(f"{tenant}\t{count} pending\toldest {age:.0f}s")


@review.command("show")
@click.option("--tenant", required=True)
@click.argument("memory_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def review_show(ctx: click.Context, tenant: str, memory_id: str, as_json: bool) -> None:
    """The reviewer's diff of MEMORY_ID's held version: proposed value, the version served,
    the cited messages as stored (redacted), scope, expiry, policy version and rule."""
    diffs = with_connection(
        settings_of(ctx), lambda conn: pending_diffs(conn, tenant, 1, memory_id)
    )
    if not diffs:
        raise click.ClickException(f"nothing of {memory_id!r} awaits review for tenant {tenant!r}")
    if as_json:
        echo_json(diffs[0].model_dump(mode="json"))
        return
    print_diff(diffs[0])


_DECISION_OPTIONS = [
    click.option("--tenant", required=True),
    click.argument("memory_id"),
    click.option("--version", required=True, type=click.IntRange(min=1), help="the held version"),
    click.option("--note", help="why (kept with the decision, personal)"),
    click.option("--reviewer-type", required=True, type=click.Choice(sorted(REVIEWER_TYPES))),
    click.option("--reviewer-id", required=True, help="who decides (the event's actor)"),
    click.option("--json", "as_json", is_flag=True),
]


def _decision_options(function: Any) -> Any:
    for option in reversed(_DECISION_OPTIONS):
        function = option(function)
    return function


def publish_review(
    ctx: click.Context,
    decision: str,
    tenant: str,
    memory_id: str,
    version: int,
    note: str | None,
    reviewer_type: str,
    reviewer_id: str,
    as_json: bool,
) -> None:
    settings = settings_of(ctx)
    try:
        message = build_review(
            tenant,
            memory_id,
            version,
            "approved" if decision == "approved" else "rejected",
            note,
            (cast(ActorType, reviewer_type), reviewer_id),
            datetime.now(UTC),
        )
    except InvalidReview as exc:
        raise click.BadParameter(str(exc)) from None
    publish(settings, MEMORY_EVENTS, message.key, message.value, "the review")
    if as_json:
        echo_json(
            {
                "event_id": message.event_id,
                "memory_id": memory_id,
                "version": version,
                "decision": decision,
                "produced_at": message.produced_at.isoformat(),
            }
        )
    else:
        click.echo(
            f"{decision} {memory_id} v{version} ({message.event_id}); a stale or refused review"
            " reaches memory.rejections"
        )


@review.command("approve")
@_decision_options
@click.pass_context
@talks_to_kafka()
def review_approve(ctx: click.Context, /, **options: Any) -> None:
    """Approve the held version: it is served from its next version on."""
    publish_review(ctx, "approved", **options)


@review.command("reject")
@_decision_options
@click.pass_context
@talks_to_kafka()
def review_reject(ctx: click.Context, /, **options: Any) -> None:
    """Reject the held version: it is never served; the served version, if any, stays."""
    publish_review(ctx, "rejected", **options)
