"""Deployment configuration that comes from the registries: which worker kinds exist and
where each serves /metrics."""

from __future__ import annotations

import click

from streams.cli.common import echo_json
from streams.worker import METRICS_PORTS


def scrape_targets(host: str | None) -> list[dict[str, object]]:
    """Prometheus file-based discovery: one target per worker kind, labelled by its kind;
    ``host`` None: each kind's docker-compose service (``memproj-<kind>``)."""
    return [
        {"targets": [f"{host or f'memproj-{kind}'}:{port}"], "labels": {"worker": kind}}
        for kind, port in METRICS_PORTS.items()
    ]


@click.group()
def deploy() -> None:
    """Deployment configuration derived from memproj's registries."""


@deploy.command("prometheus-targets")
@click.option("--host", help="the host every worker runs on (default: docker-compose services)")
def prometheus_targets(host: str | None) -> None:
    """Print the scrape targets of every worker kind (Prometheus file_sd JSON). ops/stack up
    writes them to ops/prometheus/targets/; docker-compose.yml carries its own, tested
    against this."""
    echo_json(scrape_targets(host))
