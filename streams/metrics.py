"""The contract's Prometheus metrics, built against an injected registry.

Workers never touch metrics inside reducers: the runner and the adapters report to an
observer at the edges (a batch applied, a message dead-lettered), as faust's sensors do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from projections.deletion.lifecycle import PendingDeletions, Unpurged
from streams.lag import PartitionLag


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
        self.shredded_events = Counter(
            "memproj_shredded_events_skipped",
            "sealed events whose data key a deletion destroyed, skipped unread",
            ["projection"],
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
        self.admissions = Counter(
            "memproj_admissions",
            "admission decisions on memory writes under a policy, by decision and by what"
            " decided (no_policy excluded; bounded: never the kind)",
            ["decision", "kind_rule"],
            registry=registry,
        )
        self.instruction_matches = Counter(
            "memproj_instruction_matches",
            "memory values held for review as active instructions, by the rule matched",
            ["rule"],
            registry=registry,
        )
        self.memories_evidence_erased = Gauge(
            "memproj_memories_evidence_erased",
            "memories whose cited evidence an erasure removed (flagged)",
            registry=registry,
        )
        # Summed over tenants: a tenant label would grow with the tenants (unbounded); which
        # tenant waits is `memproj review queue`.
        self.review_queue_size = Gauge(
            "memproj_review_queue_size",
            "memory versions held for review (pending_review), all tenants",
            registry=registry,
        )
        self.review_oldest_pending = Gauge(
            "memproj_review_oldest_pending_seconds",
            "age of the oldest version held for review, any tenant (0: none held)",
            registry=registry,
        )
        self.tombstones_applied = Counter(
            "memproj_tombstones_applied",
            "tombstones a derived store has applied and acknowledged",
            ["store"],
            registry=registry,
        )
        self.items_removed = Counter(
            "memproj_derived_items_removed",
            "items removed from a derived store by tombstones",
            ["store"],
            registry=registry,
        )
        self.deletions_pending = Gauge(
            "memproj_deletions_pending",
            "tombstones not yet acknowledged",
            ["store"],
            registry=registry,
        )
        self.deletion_oldest_pending = Gauge(
            "memproj_deletion_oldest_pending_seconds",
            "age of the oldest unacknowledged tombstone",
            ["store"],
            registry=registry,
        )
        self.deletions_overdue = Gauge(
            "memproj_deletions_overdue",
            "tombstones past their deadline and not yet acknowledged",
            ["store"],
            registry=registry,
        )
        self.retention_due = Gauge(
            "memproj_retention_due",
            "conversations past their retention period (and memories past expiry and grace)"
            " not erased yet, held ones excepted; by configured class (others: default)",
            ["retention_class"],
            registry=registry,
        )
        self.retention_overdue = Gauge(
            "memproj_retention_overdue_seconds",
            "how long past its due time the oldest item retention must erase has waited",
            registry=registry,
        )
        self.lag_messages = Gauge(
            "memproj_consumer_lag_messages",
            "end offset minus committed offset",
            ["group", "topic", "partition"],
            registry=registry,
        )
        self.lag_seconds = Gauge(
            "memproj_consumer_lag_seconds",
            "age of the oldest unconsumed message",
            ["group", "topic", "partition"],
            registry=registry,
        )
        self.deletion_slo = Gauge(
            "memproj_deletion_slo_seconds",
            "how long a derived store may take to acknowledge a tombstone (its registry entry)",
            ["store"],
            registry=registry,
        )
        self.ghosts = Gauge(
            "memproj_ghost_items",
            "items found in a store although the ledger says they are deleted",
            ["store"],
            registry=registry,
        )
        # Duties that run once among a kind's replicas (streams.coordination): which replica
        # leads each. A standby exports 0 and none of the duty's own gauges.
        self.duty_leader = Gauge(
            "memproj_duty_leader",
            "1 where this replica leads the duty (holds its lease), 0 where it stands by",
            ["duty"],
            registry=registry,
        )
        self.deletion_completion = Histogram(
            "memproj_deletion_completion_seconds",
            "time from a deletion request to its last acknowledgement",
            buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400),
            registry=registry,
        )
        # -- purge: the second milestone (streams.purge)
        self.deletion_purge = Histogram(
            "memproj_deletion_purge_seconds",
            "time from a deletion request to no copy left anywhere memproj writes (purged)",
            buckets=(10, 30, 60, 300, 900, 1800, 3600, 7200, 14400, 86400, 604800),
            registry=registry,
        )
        self.deletions_unpurged = Gauge(
            "memproj_deletions_unpurged",
            "completed deletions whose copies are not purged yet, per place a copy can remain "
            "(the stores, memory.current, raw_input, postgres, rebuild_copies)",
            ["store"],
            registry=registry,
        )
        self.deletion_oldest_unpurged = Gauge(
            "memproj_deletion_oldest_unpurged_seconds",
            "age (since its request) of the oldest completed deletion not purged yet, per place",
            ["store"],
            registry=registry,
        )
        self._blocked_reads: dict[str, int] = {}
        registry.register(_BlockedReads(self._blocked_reads))
        self.index_updates = Counter(
            "memproj_index_updates",
            "derived-store index updates by outcome (indexed, removed, stale, erased)",
            ["store", "outcome"],
            registry=registry,
        )
        self._newest_applied: dict[str, datetime] = {}
        # -- topic lifetimes (streams.trim, streams.compaction) ---------------------------
        self.raw_trimmed_records = Counter(
            "memproj_raw_trim_records",
            "raw input records deleted (DeleteRecords) once the worker that seals them had "
            "committed them",
            ["topic"],
            registry=registry,
        )
        self.raw_trim_errors = Counter(
            "memproj_raw_trim_errors",
            "raw input trims that failed: transient (retried next round) or refused (by the "
            "broker or an ACL, e.g. TOPIC_AUTHORIZATION_FAILED: needs an operator)",
            ["topic", "kind", "error"],
            registry=registry,
        )
        self.raw_untrimmed_records = Gauge(
            "memproj_raw_trim_behind_records",
            "raw input records the worker that seals them has committed but that are not "
            "deleted yet",
            ["topic"],
            registry=registry,
        )
        self.compaction_rolls = Counter(
            "memproj_compaction_rolls",
            "markers appended to a quiet compacted partition so that its segment rolls",
            ["topic"],
            registry=registry,
        )
        self.compaction_roll_errors = Counter(
            "memproj_compaction_roll_errors",
            "segment-roll checks that failed (retried next round)",
            ["topic", "error"],
            registry=registry,
        )
        # -- end of topic lifetimes

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
            # A producer's clock ahead of this host's puts occurred_at in the future: the
            # projection is then current, not ahead (a negative gauge would read as better).
            staleness = max(0.0, (now - newest).total_seconds())
            self.projection_staleness.labels(projection).set(staleness)

    def rejected(self, reason: str) -> None:
        self.events_rejected.labels(reason).inc()

    def dead_lettered(self, topic: str, error: str) -> None:
        self.dead_letters.labels(topic, error).inc()

    def redelivered(self, projection: str, kind: str, count: int) -> None:
        if count:
            self.redeliveries.labels(projection, kind).inc(count)

    def tombstone_applied(self, store: str, removed: int) -> None:
        self.tombstones_applied.labels(store).inc()
        self.items_removed.labels(store).inc(removed)

    def deletion_completed(self, seconds: float) -> None:
        self.deletion_completion.observe(seconds)

    def deletion_purged(self, seconds: float) -> None:
        self.deletion_purge.observe(seconds)

    def unpurged_deletions(self, by_place: Mapping[str, Unpurged], places: Iterable[str]) -> None:
        for place in places:
            unpurged = by_place.get(place, Unpurged(0, 0.0))
            self.deletions_unpurged.labels(place).set(unpurged.count)
            self.deletion_oldest_unpurged.labels(place).set(unpurged.oldest_seconds)

    def deletion_slos(self, slo_seconds: Mapping[str, float]) -> None:
        for store, seconds in slo_seconds.items():
            self.deletion_slo.labels(store).set(seconds)

    def pending_deletions(
        self, by_store: Mapping[str, PendingDeletions], stores: tuple[str, ...]
    ) -> None:
        for store in stores:
            pending = by_store.get(store, PendingDeletions(0, 0.0, 0))
            self.deletions_pending.labels(store).set(pending.count)
            self.deletion_oldest_pending.labels(store).set(pending.oldest_seconds)
            self.deletions_overdue.labels(store).set(pending.overdue)

    def retention(self, due: Mapping[str, int], oldest_overdue_seconds: float) -> None:
        """Replace the retention series: a class no longer configured disappears."""
        self.retention_due.clear()
        for retention_class, count in due.items():
            self.retention_due.labels(retention_class).set(count)
        self.retention_overdue.set(oldest_overdue_seconds)

    def consumer_lag(self, lags: Iterable[PartitionLag]) -> None:
        """Replace every lag series: a group or partition that is gone disappears."""
        self.lag_messages.clear()
        self.lag_seconds.clear()
        for lag in lags:
            labels = (lag.group, lag.topic, str(lag.partition))
            self.lag_messages.labels(*labels).set(lag.messages)
            self.lag_seconds.labels(*labels).set(lag.seconds)

    def ghost_items(self, counts: Mapping[str, int]) -> None:
        for store, count in counts.items():
            self.ghosts.labels(store).set(count)

    def monitor_standing_by(self) -> None:
        """A monitor that lost its lease exports no lag or ghost series: the leader does."""
        self.lag_messages.clear()
        self.lag_seconds.clear()
        self.ghosts.clear()

    def blocked_reads(self, totals: dict[str, int]) -> None:
        """Reads are blocked in whichever process serves them (the CLI, an API); the totals
        live in PostgreSQL, and the deletion worker exports them from there."""
        self._blocked_reads.update(totals)

    def index_update(self, store: str, outcome: str, count: int = 1) -> None:
        if count:
            self.index_updates.labels(store, outcome).inc(count)

    def redacted(self, kind: str, count: int) -> None:
        self.redactions.labels(kind).inc(count)

    def review_queue(self, by_tenant: Mapping[str, tuple[int, float]]) -> None:
        """``projections.memory.store.review_queue``'s answer, over all tenants."""
        self.review_queue_size.set(sum(count for count, _ in by_tenant.values()))
        self.review_oldest_pending.set(max((age for _, age in by_tenant.values()), default=0.0))

    def admitted(self, decision: str, cause: str, count: int) -> None:
        self.admissions.labels(decision, cause).inc(count)

    def instruction_matched(self, rule: str, count: int) -> None:
        self.instruction_matches.labels(rule).inc(count)

    def shredded(self, projection: str, count: int) -> None:
        if count:
            self.shredded_events.labels(projection).inc(count)

    def retried(self, projection: str, error: str) -> None:
        self.batch_retries.labels(projection, error).inc()


class _BlockedReads(Collector):
    """``memproj_ghost_reads_blocked_total{store}``, from totals kept in PostgreSQL."""

    def __init__(self, totals: dict[str, int]) -> None:
        self._totals = totals

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "memproj_ghost_reads_blocked",
            "index hits dropped at hydration because they were deleted",
            labels=["store"],
        )
        for store, total in sorted(self._totals.items()):
            family.add_metric([store], total)
        yield family
