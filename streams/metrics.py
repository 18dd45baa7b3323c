"""The contract's Prometheus metrics, built against an injected registry.

Workers never touch metrics inside reducers: the runner and the adapters report to an
observer at the edges (a batch applied, a message dead-lettered), as faust's sensors do.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.events_applied = Counter(
            "memproj_events_applied",
            "events applied to a projection",
            ["projection", "event_type"],
            registry=registry,
        )
        self.events_rejected = Counter(
            "memproj_events_rejected", "refused events", ["reason"], registry=registry
        )
        self.dead_letters = Counter(
            "memproj_dead_letters",
            "messages sent to a dead-letter topic",
            ["topic", "error"],
            registry=registry,
        )
        self.redeliveries = Counter(
            "memproj_redeliveries",
            "messages or events already applied, recognised and skipped",
            ["projection", "kind"],
            registry=registry,
        )
        self.projection_staleness = Gauge(
            "memproj_projection_staleness_seconds",
            "now minus occurred_at of the newest applied event",
            ["projection"],
            registry=registry,
        )
        self.batch_seconds = Histogram(
            "memproj_batch_seconds",
            "time to apply one batch, from decode to offsets acknowledged",
            ["projection"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.batch_retries = Counter(
            "memproj_batch_retries",
            "batches retried after a transient failure (database, broker)",
            ["projection", "error"],
            registry=registry,
        )
        self.redactions = Counter(
            "memproj_redactions",
            "credentials masked in conversation content before persistence",
            ["kind"],
            registry=registry,
        )
        self._newest_applied: dict[str, datetime] = {}

    def batch_applied(
        self,
        projection: str,
        event_types: Iterable[str],
        newest_occurred_at: datetime | None,
        seconds: float,
    ) -> None:
        for event_type in event_types:
            self.events_applied.labels(projection, event_type).inc()
        if newest_occurred_at is not None:
            current = self._newest_applied.get(projection)
            if current is None or newest_occurred_at > current:
                self._newest_applied[projection] = newest_occurred_at
            self.update_staleness(datetime.now(UTC))
        self.batch_seconds.labels(projection).observe(seconds)

    def update_staleness(self, now: datetime) -> None:
        for projection, newest in self._newest_applied.items():
            self.projection_staleness.labels(projection).set((now - newest).total_seconds())

    def rejected(self, reason: str) -> None:
        self.events_rejected.labels(reason).inc()

    def dead_lettered(self, topic: str, error: str) -> None:
        self.dead_letters.labels(topic, error).inc()

    def redelivered(self, projection: str, kind: str, count: int) -> None:
        if count:
            self.redeliveries.labels(projection, kind).inc(count)

    def redacted(self, kind: str, count: int) -> None:
        self.redactions.labels(kind).inc(count)

    def retried(self, projection: str, error: str) -> None:
        self.batch_retries.labels(projection, error).inc()
