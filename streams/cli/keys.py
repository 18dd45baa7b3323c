"""``memproj keys``: the keys memproj holds. ``rotate`` and ``status`` are about the master keys
(the data keys they wrap); other kinds of keys get their own subgroup here (``memproj keys api
...`` for the HTTP API's keys), so that ``rotate`` keeps its one meaning."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
import psycopg

from projections.access import keys as access_keys
from projections.access import purposes as purposes_store
from projections.access.policy import WILDCARD, PurposePolicy, WriteBounds
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
from streams.cli.common import echo_json, settings_of, with_migrated
from streams.settings import Settings

T = TypeVar("T")


def sealers_of(settings: Settings) -> Sealers:
    master_keys = settings.worker_master_keys()
    return Sealers(
        KeyStore(master_keys, settings.key_lookups),
        LetterSealer(master_keys),
        ProbeSealer(master_keys),
    )


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


# -- API keys and purposes ------------------------------------------------------------------


def _key_json(key: access_keys.ApiKey) -> dict[str, Any]:
    return {
        "key_id": key.key_id,
        "tenant_id": key.tenant_id,
        "actor": key.actor,
        "purposes": list(key.purposes),
        "created_at": key.created_at.isoformat(),
        "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
        "write_bounds": _bounds_json(key.write_bounds),
    }


def _bounds_json(bounds: WriteBounds | None) -> dict[str, list[str]] | None:
    if bounds is None:
        return None
    return {"kinds": sorted(bounds.kinds), "scopes": sorted(bounds.scopes)}


def _describe_bounds(bounds: WriteBounds | None) -> str:
    if bounds is None:
        return "writes any kind and scope"
    kinds, scopes = ",".join(sorted(bounds.kinds)), ",".join(sorted(bounds.scopes))
    return f"writes kinds {kinds or '-'}, scopes {scopes or '-'}"


def _bounds_of(write_kinds: str | None, write_scopes: str | None) -> WriteBounds | None:
    """The bounds ``--write-kinds`` and ``--write-scopes`` name (either alone: the other is
    '*'); None when neither is given."""
    if write_kinds is None and write_scopes is None:
        return None
    kinds = _names(write_kinds) if write_kinds is not None else [WILDCARD]
    scopes = _names(write_scopes) if write_scopes is not None else [WILDCARD]
    return WriteBounds(frozenset(kinds), frozenset(scopes))


_WRITE_KINDS = click.option(
    "--write-kinds",
    help="comma-separated memory kinds its propose purpose may write ('*': any; default: any)",
)
_WRITE_SCOPES = click.option(
    "--write-scopes",
    help="comma-separated scopes its propose purpose may write ('*': any; default: any)",
)


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


@keys.group("api")
def keys_api() -> None:
    """API keys of the HTTP API (memproj serve): each bound to one tenant, an actor and
    purposes; only the hash of its secret is stored."""


@keys_api.command("create")
@click.option("--tenant", required=True)
@click.option("--actor", required=True, help="who uses the key, e.g. agent:support-bot")
@click.option("--purposes", required=True, help="comma-separated purposes the key may read under")
@_WRITE_KINDS
@_WRITE_SCOPES
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def keys_api_create(
    ctx: click.Context,
    tenant: str,
    actor: str,
    purposes: str,
    write_kinds: str | None,
    write_scopes: str | None,
    as_json: bool,
) -> None:
    """Create a key; the key itself (mpk_...) is printed once and cannot be shown again.
    With --write-kinds or --write-scopes, its propose purpose writes only those memories."""
    names = _names(purposes)
    if not names:
        raise click.BadParameter("name at least one purpose", param_hint="--purposes")
    bounds = _bounds_of(write_kinds, write_scopes)
    created = with_migrated(
        settings_of(ctx),
        lambda conn: access_keys.create_key(
            conn, tenant, actor, names, datetime.now(UTC), write_bounds=bounds
        ),
    )
    if as_json:
        echo_json({**_key_json(created.key), "key": created.token})
    else:
        click.echo(created.token)
        click.echo(
            f"key {created.key.key_id} for tenant {tenant}, actor {actor}, purposes "
            f"{', '.join(names)}, {_describe_bounds(bounds)} (shown once: store it now)",
            err=True,
        )


@keys_api.command("list")
@click.option("--tenant")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def keys_api_list(ctx: click.Context, tenant: str | None, as_json: bool) -> None:
    """Every key (never a secret), revoked ones included."""
    found = with_migrated(settings_of(ctx), lambda conn: access_keys.list_keys(conn, tenant))
    if as_json:
        echo_json([_key_json(key) for key in found])
        return
    for key in found:
        state = f"revoked {key.revoked_at.isoformat()}" if key.revoked_at else "active"
        click.echo(
            f"{key.key_id} {key.tenant_id:16} {key.actor:24} {','.join(key.purposes):32} {state}"
            f" ({_describe_bounds(key.write_bounds)})"
        )


@keys_api.command("bound")
@click.argument("key_id")
@_WRITE_KINDS
@_WRITE_SCOPES
@click.option("--unbounded", is_flag=True, help="lift the bounds: writes any kind and scope")
@click.pass_context
def keys_api_bound(
    ctx: click.Context,
    key_id: str,
    write_kinds: str | None,
    write_scopes: str | None,
    unbounded: bool,
) -> None:
    """Set the memory kinds and scopes a key's propose purpose may write (from its next
    request on), or lift them with --unbounded."""
    bounds = _bounds_of(write_kinds, write_scopes)
    if (bounds is None) != unbounded:
        raise click.UsageError("give --write-kinds and/or --write-scopes, or --unbounded")
    presented = access_keys.parse_key(key_id)
    wanted = presented.key_id if presented is not None else key_id
    key = with_migrated(settings_of(ctx), lambda conn: access_keys.bound_key(conn, wanted, bounds))
    if key is None:
        raise click.ClickException(f"no API key {wanted!r}")
    click.echo(
        f"{key.key_id} (tenant {key.tenant_id}, actor {key.actor}) {_describe_bounds(bounds)}"
    )


@keys_api.command("revoke")
@click.argument("key_id")
@click.pass_context
def keys_api_revoke(ctx: click.Context, key_id: str) -> None:
    """Revoke a key (by its id, or the whole mpk_... key): refused from the next request on."""
    presented = access_keys.parse_key(key_id)
    wanted = presented.key_id if presented is not None else key_id
    key = with_migrated(
        settings_of(ctx), lambda conn: access_keys.revoke_key(conn, wanted, datetime.now(UTC))
    )
    if key is None:
        raise click.ClickException(f"no API key {wanted!r}")
    click.echo(f"revoked {key.key_id} (tenant {key.tenant_id}, actor {key.actor})")


def _policy_json(policy: PurposePolicy) -> dict[str, Any]:
    return {
        "tenant_id": policy.tenant_id,
        "purpose": policy.purpose,
        "kinds": sorted(policy.kinds),
        "scopes": sorted(policy.scopes),
        "conversations": policy.conversations,
    }


@keys.group("purpose")
def keys_purpose() -> None:
    """The purpose policy: which memory kinds and scopes a purpose may read, and whether it
    reads conversations. A purpose without a policy reads nothing."""


@keys_purpose.command("set")
@click.option("--tenant", required=True)
@click.option("--purpose", required=True)
@click.option("--kinds", default="", help="comma-separated memory kinds; '*': any")
@click.option("--scopes", default="*", show_default=True, help="comma-separated scopes; '*': any")
@click.option(
    "--conversations/--no-conversations",
    default=False,
    show_default=True,
    help="may read messages, summaries and context views",
)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def keys_purpose_set(
    ctx: click.Context,
    tenant: str,
    purpose: str,
    kinds: str,
    scopes: str,
    conversations: bool,
    as_json: bool,
) -> None:
    """Create or replace a purpose's policy."""
    policy = with_migrated(
        settings_of(ctx),
        lambda conn: purposes_store.set_policy(
            conn, tenant, purpose, _names(kinds), _names(scopes), conversations, datetime.now(UTC)
        ),
    )
    if as_json:
        echo_json(_policy_json(policy))
    else:
        click.echo(_describe_policy(policy))


def _describe_policy(policy: PurposePolicy) -> str:
    return (
        f"{policy.tenant_id} {policy.purpose}: kinds {','.join(sorted(policy.kinds)) or '-'},"
        f" scopes {','.join(sorted(policy.scopes)) or '-'},"
        f" conversations {'yes' if policy.conversations else 'no'}"
    )


@keys_purpose.command("list")
@click.option("--tenant")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def keys_purpose_list(ctx: click.Context, tenant: str | None, as_json: bool) -> None:
    found = with_migrated(settings_of(ctx), lambda conn: purposes_store.list_policies(conn, tenant))
    if as_json:
        echo_json([_policy_json(policy) for policy in found])
        return
    for policy in found:
        click.echo(_describe_policy(policy))


@keys_purpose.command("remove")
@click.option("--tenant", required=True)
@click.option("--purpose", required=True)
@click.pass_context
def keys_purpose_remove(ctx: click.Context, tenant: str, purpose: str) -> None:
    """Remove a purpose's policy: the purpose then reads nothing."""
    removed = with_migrated(
        settings_of(ctx), lambda conn: purposes_store.remove_policy(conn, tenant, purpose)
    )
    if not removed:
        raise click.ClickException(f"no policy for purpose {purpose!r} of tenant {tenant!r}")
    click.echo(f"removed the policy of {tenant} {purpose}")
