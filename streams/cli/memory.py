"""Reading the memory projection: recall and provenance."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from projections.access import pauses
from projections.access.pauses import SubjectPaused
from projections.admission import flags as evidence_flags
from projections.cache.store import RedisCache
from projections.cache.store import connect as connect_redis
from projections.memory import store
from projections.memory.store import RecallQuery
from projections.sql import Conn
from streams import reads
from streams.cli.common import echo_json, paused_refusal, settings_of, with_connection
from streams.reads import Hydrated
from streams.services import build_embedder, open_vector_store

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "": "days"}


def parse_duration(text: str) -> timedelta:
    match = _DURATION.match(text.strip())
    if match is None:
        raise click.BadParameter(f"{text!r}: use a number of days or e.g. 90m, 12h, 30d")
    amount, unit = match.groups()
    return timedelta(**{_UNITS[unit]: float(amount)})


def parse_subject(text: str) -> tuple[str, str]:
    subject_type, sep, subject_id = text.partition(":")
    if not sep or not subject_type or not subject_id:
        raise click.BadParameter(f"{text!r}: expected TYPE:ID, e.g. user:u_123")
    return subject_type, subject_id


def subject_of(
    subject: str | None, subject_type: str | None, subject_id: str | None
) -> tuple[str, str]:
    """The subject of ``--subject TYPE:ID`` (split at its first ``:``), or of
    ``--subject-type`` and ``--subject-id``: any ids, a type holding ``:`` among them."""
    if subject is not None:
        if subject_type is not None or subject_id is not None:
            raise click.UsageError("give --subject, or --subject-type and --subject-id, not both")
        return parse_subject(subject)
    if subject_type is None or subject_id is None:
        raise click.UsageError("give --subject TYPE:ID, or --subject-type and --subject-id")
    return subject_type, subject_id


SUBJECT_OPTIONS = [
    click.option(
        "--subject", help="TYPE:ID of the subject, e.g. user:u_123 (split at the first ':')"
    ),
    click.option("--subject-type", help="the subject's type, for any type (one with ':' too)"),
    click.option("--subject-id", help="the subject's id, with --subject-type"),
]


def subject_options(function: Any) -> Any:
    for option in reversed(SUBJECT_OPTIONS):
        function = option(function)
    return function


@click.command()
@click.option("--tenant", required=True)
@subject_options
@click.option("--scope")
@click.option("--kind")
@click.option(
    "--status", default="verified,proposed", show_default=True, help="comma-separated statuses"
)
@click.option("--max-age", help="only memories observed within this age (30d, 12h, 90m)")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000))
@click.option(
    "--query", "text", help="semantic recall: candidates from the vector store, then hydrated"
)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def recall(
    ctx: click.Context,
    tenant: str,
    subject: str | None,
    subject_type: str | None,
    subject_id: str | None,
    scope: str | None,
    kind: str | None,
    status: str,
    max_age: str | None,
    limit: int,
    text: str | None,
    as_json: bool,
) -> None:
    """Eligible memories about a subject: never revoked, superseded, expired or another
    tenant's. With --query, ranked by similarity to TEXT; every candidate from the vector
    store or the cache is re-read through the projection and the deletion ledger."""
    subject_type, subject_id = subject_of(subject, subject_type, subject_id)
    statuses = tuple(s.strip() for s in status.split(",") if s.strip())
    unknown = set(statuses) - {"verified", "proposed"}
    if unknown:
        raise click.BadParameter(f"recall returns verified or proposed memories, not {unknown}")
    query = RecallQuery(
        tenant_id=tenant,
        subject_type=subject_type,
        subject_id=subject_id,
        scope=scope,
        kind=kind,
        statuses=statuses,  # type: ignore[arg-type]
        max_age=parse_duration(max_age) if max_age else None,
        limit=limit,
    )
    now = datetime.now(UTC)
    settings = settings_of(ctx)

    async def read(conn: Conn) -> Hydrated:
        redis = connect_redis(settings.redis_url, settings.redis_cluster)
        cache = RedisCache(redis, settings.cache_ttl_seconds, settings.cache_namespace)
        try:
            if text is None:
                return await reads.recall(conn, cache, query, now)
            vectors = open_vector_store(settings)
            embedder = build_embedder(settings)
            return await reads.recall_by_text(
                conn, vectors, embedder, query, text, now, settings.search_mode
            )
        finally:
            await redis.aclose()

    try:
        hydrated = with_connection(settings, read)
    except SubjectPaused as paused:
        raise paused_refusal(paused) from None
    records = hydrated.records
    if hydrated.blocked_total:
        click.echo(f"hydration guard dropped {dict(hydrated.blocked)}", err=True)
    if as_json:
        echo_json([record.model_dump(mode="json") for record in records])
        return
    if not records:
        click.echo("no eligible memories")
    for record in records:
        click.echo(
            f"{record.memory_id:16} v{record.version} {record.status:9} {record.kind:12} "
            f"{record.value}"
        )


@click.group()
def memory() -> None:
    """One memory and its provenance."""


@memory.command("show")
@click.option("--tenant", required=True)
@click.option("--memory-id", required=True)
@click.option("--history", is_flag=True, help="include every version, oldest first")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def memory_show(
    ctx: click.Context, tenant: str, memory_id: str, history: bool, as_json: bool
) -> None:
    """Where did this memory come from: source, observation, verification, every version.
    An operator's inspection, not a read path: it shows a paused subject's memory too, and
    says that it is paused."""

    async def load(conn: Any) -> dict[str, Any] | None:
        record = await store.load_memory(conn, tenant, memory_id)
        if record is None:
            return None
        shown: dict[str, Any] = {"current": record.model_dump(mode="json")}
        shown["eligible"] = record.is_eligible(datetime.now(UTC))
        shown["subject_paused"] = await pauses.is_paused(
            conn, tenant, record.subject.type, record.subject.id
        )
        shown["evidence_erased"] = [
            {"event_id": f.event_id, "deletion_id": f.deletion_id, "at": f.flagged_at.isoformat()}
            for f in await evidence_flags.flags_of(conn, tenant, memory_id)
        ]
        if history:
            shown["history"] = [
                {
                    "version": entry.record.version,
                    "status": entry.record.status,
                    "value": entry.record.value,
                    "source": entry.record.source.model_dump(),
                    "observed_at": entry.record.observed_at.isoformat(),
                    "verification": entry.record.verification,
                    "expires_at": entry.record.expires_at.isoformat()
                    if entry.record.expires_at
                    else None,
                    "event_id": entry.event_id,
                    "event_type": entry.event_type,
                    "occurred_at": entry.occurred_at.isoformat(),
                    "actor": {"type": entry.actor_type, "id": entry.actor_id},
                    "superseded_at": entry.superseded_at.isoformat()
                    if entry.superseded_at
                    else None,
                    "policy_version": entry.policy_version,
                    "review_rule": entry.review_rule,
                }
                for entry in await store.load_history(conn, tenant, memory_id)
            ]
        return shown

    shown = with_connection(settings_of(ctx), load)
    if shown is None:
        raise click.ClickException(f"no memory {memory_id!r} for tenant {tenant!r}")
    if as_json:
        echo_json(shown)
        return
    current = shown["current"]
    if shown["subject_paused"]:
        notice = "its subject is paused: no read path serves it (shown to the operator)"
        click.echo(notice, err=True)
    click.echo(
        f"{memory_id} v{current['version']} {current['status']} "
        f"(eligible: {shown['eligible']})\n  value: {current['value']}\n"
        f"  source: {current['source']['type']} {current['source']['ref']}, "
        f"observed {current['observed_at']}, verification {current['verification']}"
    )
    for flag in shown["evidence_erased"]:
        click.echo(f"  FLAGGED: cited evidence {flag['event_id']} erased by {flag['deletion_id']}")
    for entry in shown.get("history", []):
        click.echo(
            f"  v{entry['version']} {entry['event_type']:17} {entry['occurred_at']} "
            f"{entry['status']:9} {entry['source']['type']}:{entry['source']['ref']} "
            f"{entry['value']} policy v{entry['policy_version']}"
            + (f" review: {entry['review_rule']}" if entry["review_rule"] else "")
            + (f" superseded {entry['superseded_at']}" if entry["superseded_at"] else "")
        )
