"""Composition root of a worker process: settings in, a runnable Faust worker out.

Each worker kind is its own Faust app and therefore its own consumer group, so that every
projection and derived store keeps its own offsets and can be stopped, lagged or replayed
alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import faust
from mode import Service
from prometheus_client import CollectorRegistry

from projections.conversation.projection import ConversationProjection
from projections.memory.projection import MemoryProjection
from streams.agents.projection import add_projection_agent
from streams.app import build_app
from streams.kafka import KafkaPublisher
from streams.metrics import Metrics
from streams.runner import Projection, ProjectionRunner
from streams.services import (
    DatabaseService,
    MetricsService,
    OutboxService,
    PublisherService,
    make_pool,
)
from streams.settings import Settings
from topics.schemas import default_schemas

# Each kind has its own port, so that every worker on one host can be scraped.
METRICS_PORTS = {"memory": 9101, "conversation": 9102}


def metrics_port(settings: Settings, kind: str) -> int:
    return METRICS_PORTS[kind] if settings.metrics_port is None else settings.metrics_port


@dataclass(frozen=True, slots=True)
class WorkerParts:
    app: faust.App
    services: list[Service]
    metrics: Metrics


def build_projection_worker(
    settings: Settings, metrics: Metrics, projection: Projection[Any, Any, Any]
) -> WorkerParts:
    """A Faust app whose one agent feeds ``projection`` from its input topic."""
    kind = projection.name
    app = build_app(settings, kind)
    pool = make_pool(settings.postgres_dsn, settings.postgres_pool_size)
    publisher = KafkaPublisher(settings.kafka_bootstrap)
    runner = ProjectionRunner(projection, pool, publisher, settings.topics, metrics)
    add_projection_agent(
        app,
        settings.topics.name(projection.input_spec),
        runner,
        settings.batch_max_events,
        settings.batch_max_wait_seconds,
    )
    return WorkerParts(
        app,
        [
            MetricsService(metrics, settings.metrics_host, metrics_port(settings, kind)),
            DatabaseService(pool),
            PublisherService(publisher),
            OutboxService(runner),
        ],
        metrics,
    )


def build_memory_worker(settings: Settings, metrics: Metrics) -> WorkerParts:
    projection = MemoryProjection(
        default_schemas(), settings.topics, settings.max_memory_value_bytes
    )
    return build_projection_worker(settings, metrics, projection)


def build_conversation_worker(settings: Settings, metrics: Metrics) -> WorkerParts:
    projection = ConversationProjection(default_schemas(), settings.context, metrics)
    return build_projection_worker(settings, metrics, projection)


WORKER_KINDS: dict[str, Callable[[Settings, Metrics], WorkerParts]] = {
    "memory": build_memory_worker,
    "conversation": build_conversation_worker,
}


def build_worker(settings: Settings, kind: str) -> faust.Worker:
    parts = WORKER_KINDS[kind](settings, Metrics(CollectorRegistry()))
    return faust.Worker(
        parts.app,
        *parts.services,
        loglevel=settings.log_level,
        redirect_stdouts=False,
    )
