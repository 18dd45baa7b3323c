"""The metrics observers' own arithmetic (no services)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry

from streams.metrics import Metrics


def staleness(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value(
        "memproj_projection_staleness_seconds", {"projection": "memory"}
    )


def test_staleness_is_how_far_the_newest_applied_event_lies_behind() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    newest = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    metrics.batch_applied("memory", [], newest, 0.01)
    metrics.update_staleness(newest + timedelta(seconds=42))
    assert staleness(registry) == 42


def test_an_event_from_a_clock_ahead_leaves_the_projection_current_not_ahead() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    newest = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    metrics.batch_applied("memory", [], newest, 0.01)
    metrics.update_staleness(newest - timedelta(seconds=3))
    assert staleness(registry) == 0


def test_the_review_queue_is_summed_over_tenants_and_empty_is_zero() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.review_queue({"acme": (3, 120.0), "globex": (1, 7200.5)})
    assert registry.get_sample_value("memproj_review_queue_size") == 4
    assert registry.get_sample_value("memproj_review_oldest_pending_seconds") == 7200.5
    metrics.review_queue({})
    assert registry.get_sample_value("memproj_review_queue_size") == 0
    assert registry.get_sample_value("memproj_review_oldest_pending_seconds") == 0
