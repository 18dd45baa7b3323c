"""``memproj deploy``: deployment files written from memproj's registries (which worker kinds
exist, where each serves /metrics, which stores they mount) and its settings
(``streams.deployment``)."""

from __future__ import annotations

from pathlib import Path

import click

from projections.distribution import citus_sql
from streams.cli.common import echo_json
from streams.deployment.compose import MissingBlock, compose_file
from streams.deployment.kubernetes import WORKERS_DIRECTORY, kubernetes_files
from streams.deployment.prometheus import scrape_targets
from streams.deployment.settings_reference import DOCUMENT, settings_reference
from streams.worker import WORKERS

__all__ = ["deploy", "scrape_targets"]


@click.group()
def deploy() -> None:
    """Deployment configuration derived from memproj's registries."""


@deploy.command("prometheus-targets")
@click.option("--host", help="the host every worker runs on (default: docker-compose services)")
def prometheus_targets(host: str | None) -> None:
    """Print the scrape targets of every worker kind (Prometheus file_sd JSON). ops/stack up
    writes them to ops/prometheus/targets/; docker-compose.yml carries its own (memproj
    deploy compose)."""
    echo_json(scrape_targets(host))


@deploy.command("kinds")
def kinds() -> None:
    """Print every worker kind and its metrics port, one 'KIND PORT' a line (ops/demo starts
    one worker of each)."""
    for name, port in WORKERS.metrics_ports.items():
        click.echo(f"{name} {port}")


@deploy.command("k8s")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("ops/k8s"),
    show_default=True,
    help="the kustomize base",
)
def k8s(out: Path) -> None:
    """Write every worker kind's Deployment and PodDisruptionBudget (workers/<kind>.yaml)
    and the kustomization that lists them; remove the manifests of kinds that are gone."""
    files = kubernetes_files()
    workers = out / WORKERS_DIRECTORY
    workers.mkdir(parents=True, exist_ok=True)
    for stale in sorted(workers.glob("*.yaml")):
        if f"{WORKERS_DIRECTORY}/{stale.name}" not in files:
            stale.unlink()
            click.echo(f"removed {stale}")
    for name, text in files.items():
        _write(out / name, text)


@deploy.command("compose")
@click.option(
    "--file",
    "path",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=Path("docker-compose.yml"),
    show_default=True,
)
def compose(path: Path) -> None:
    """Rewrite the worker services and their scrape targets in docker-compose.yml (the blocks
    between their BEGIN and END lines; the rest of the file is left as it is)."""
    try:
        text = compose_file(path.read_text())
    except MissingBlock as missing:
        raise click.ClickException(f"{path}: {missing}") from None
    _write(path, text)


@deploy.command("settings-doc")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DOCUMENT,
    show_default=True,
)
def settings_doc(out: Path) -> None:
    """Write the settings reference: every MEMPROJ_* setting with its default and
    description, in its group."""
    out.parent.mkdir(parents=True, exist_ok=True)
    _write(out, settings_reference())


@deploy.command("citus")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("ops/citus/distribute.sql"),
    show_default=True,
)
def citus(out: Path) -> None:
    """Write the Citus distribution script: every tenant table distributed by tenant_id and
    co-located, the tables without a tenant made reference tables (projections.distribution)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    _write(out, citus_sql())


def _write(path: Path, text: str) -> None:
    if path.exists() and path.read_text() == text:
        return
    path.write_text(text)
    click.echo(f"wrote {path}")
