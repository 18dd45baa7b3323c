"""Admission policies: ``memproj policy set/clear/show/history/list``.

Operators set policies from the command line only (ops/decisions/governed-writes.md): a policy
decides what every agent of a tenant may write, and the people who may change it are the ones
who hold the database's credentials, not an API key's purpose.
"""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Any

import click
import yaml

from projections.admission import store
from projections.admission.policy import EMPTY_DOCUMENT, PolicyDocument, parse_document
from projections.admission.store import StoredPolicy
from streams.cli.common import echo_json, settings_of, with_connection


def _shown(stored: StoredPolicy) -> dict[str, Any]:
    return {
        "tenant_id": stored.tenant_id,
        "version": stored.version,
        "created_at": stored.created_at.isoformat(),
        "created_by": stored.created_by,
        "cleared": stored.cleared,
        "policy": stored.document.model_dump(mode="json", exclude_defaults=True),
    }


def read_policy_file(path: Path) -> PolicyDocument:
    """A policy document from a YAML (or JSON) file; a click error naming what is wrong."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise click.BadParameter(f"{path}: {exc}") from None
    try:
        return parse_document(raw)
    except ValueError as exc:
        raise click.BadParameter(f"{path}: {exc}") from None


def _add(ctx: click.Context, tenant: str, document: PolicyDocument, by: str | None) -> None:
    async def add(conn: Any) -> StoredPolicy:
        async with conn.transaction():
            return await store.add_version(conn, tenant, document, by or getpass.getuser())

    stored = with_connection(settings_of(ctx), add)
    echo_json(_shown(stored))


@click.group()
def policy() -> None:
    """A tenant's admission policy: which memory kinds are admitted, reviewed or refused."""


BY = click.option("--by", help="who sets it (recorded; default: the OS user)")


@policy.command("set")
@click.option("--tenant", required=True)
@click.option(
    "--file", "path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@BY
@click.pass_context
def policy_set(ctx: click.Context, tenant: str, path: Path, by: str | None) -> None:
    """Store the policy in FILE (YAML) as the tenant's next version. Events sealed from now
    on are decided under it; those sealed before keep the version they were stamped with."""
    _add(ctx, tenant, read_policy_file(path), by)


@policy.command("clear")
@click.option("--tenant", required=True)
@BY
@click.pass_context
def policy_clear(ctx: click.Context, tenant: str, by: str | None) -> None:
    """A new version without rules: every kind admitted, but grants and values holding
    instructions are still reviewed (no policy at all is never restored: history is kept)."""
    _add(ctx, tenant, EMPTY_DOCUMENT, by)


@policy.command("show")
@click.option("--tenant", required=True)
@click.option("--version", type=int, help="a past version (default: the latest)")
@click.pass_context
def policy_show(ctx: click.Context, tenant: str, version: int | None) -> None:
    """One version of the tenant's policy, as YAML."""
    stored = with_connection(
        settings_of(ctx), lambda conn: store.load_version(conn, tenant, version)
    )
    if stored is None:
        raise click.ClickException(
            f"tenant {tenant!r} has no policy"
            + ("" if version is None else f" version {version}")
            + " (version 0: every write admitted as in contract 1.1)"
        )
    click.echo(yaml.safe_dump(_shown(stored), sort_keys=False).rstrip())


@policy.command("history")
@click.option("--tenant", required=True)
@click.pass_context
def policy_history(ctx: click.Context, tenant: str) -> None:
    """Every version of the tenant's policy, oldest first."""
    versions = with_connection(settings_of(ctx), lambda conn: store.history(conn, tenant))
    echo_json([_shown(stored) for stored in versions])


@policy.command("list")
@click.pass_context
def policy_list(ctx: click.Context) -> None:
    """Every tenant with a policy, and its latest version."""
    for tenant, version, created_at in with_connection(settings_of(ctx), store.tenants):
        click.echo(f"{tenant}\tv{version}\t{created_at.isoformat()}")
