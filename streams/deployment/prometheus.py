"""The Prometheus scrape targets of every worker kind (file-based service discovery)."""

from __future__ import annotations

import json

from streams.worker import WORKERS, WorkerRegistry


def scrape_targets(host: str | None, workers: WorkerRegistry = WORKERS) -> list[dict[str, object]]:
    """One target per worker kind, labelled by its kind; ``host`` None: each kind's
    docker-compose service (``memproj-<kind>``)."""
    return [
        {"targets": [f"{host or f'memproj-{kind}'}:{port}"], "labels": {"worker": kind}}
        for kind, port in workers.metrics_ports.items()
    ]


def targets_json(targets: list[dict[str, object]]) -> str:
    """The targets as a JSON array, one target a line."""
    lines = ",\n".join(f"  {json.dumps(target)}" for target in targets)
    return f"[\n{lines}\n]\n"
