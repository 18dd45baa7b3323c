"""Composition root of a worker process: settings in, a runnable worker out.

Each worker kind is its own consumer group, so that every projection and derived store keeps
its own offsets and can be stopped, lagged or replayed alone. Every agent takes its batches
straight from a confluent-kafka consumer of its own (``streams.consumer``), in its kind's
group, and every worker is a mode worker (ops/decisions/batch-consumer.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

import mode
from mode import Service
from prometheus_client import CollectorRegistry
from psycopg_pool import AsyncConnectionPool

from projections.bookkeeping import Conn, HandoverTracking, PostgresTracking, Tracking
from projections.conversation.projection import ConversationProjection
from projections.deletion.projection import LedgerProjection
from projections.memory.projection import MemoryProjection
from projections.sealing.fused import SealingProjection
from projections.sealing.keys import KeyStore
from projections.sealing.probes import ProbeSealer
from projections.sealing.sealer import Sealer
from projections.stores import BY_NAME, REGISTRY, STORE_NAMES, open_all
from streams.agents.cache import CacheFreshness
from streams.agents.index import EmbeddingsIndexer
from streams.agents.tombstones import TombstoneHandler
from streams.compaction import segment_rollers
from streams.consumer import KafkaBatchSource
from streams.isolation import DeadLetters, Isolation
from streams.kafka import KafkaPublisher
from streams.lag import LagCollector
from streams.loop import BatchHandler, BatchLoop, StopOnce
from streams.maintenance import LedgerMaintenance
from streams.metrics import Metrics
from streams.monitoring import MonitorService
from streams.probes import ShutdownBudget
from streams.purge import PurgeRound, purge_checks
from streams.runner import Projection, ProjectionRunner
from streams.services import (
    BatchConsumers,
    DatabaseProbe,
    DatabaseService,
    GracefulShutdown,
    OutboxService,
    ProbeService,
    PublisherService,
    StoreSupplies,
    WorkerState,
    build_embedder,
    make_pool,
)
from streams.settings import Settings
from streams.trim import raw_input_trimmers
from topics.registry import (
    CONVERSATION_EVENTS,
    CONVERSATION_MESSAGES,
    DELETION_TOMBSTONES,
    MEMORY_CURRENT,
    MEMORY_EVENTS,
    TopicSpec,
)
from topics.schemas import default_schemas

# Each kind has its own port, so that every worker on one host can be scraped.
METRICS_PORTS = {
    "memory": 9101,
    "conversation": 9102,
    "deletion": 9103,
    **{store.name: store.metrics_port for store in REGISTRY},
    "monitor": 9108,
}


def metrics_port(settings: Settings, kind: str) -> int:
    return METRICS_PORTS[kind] if settings.metrics_port is None else settings.metrics_port


@dataclass(frozen=True, slots=True)
class WorkerParts:
    services: list[Service]
    metrics: Metrics
    shutdown: GracefulShutdown


@dataclass(frozen=True, slots=True)
class Resources:
    """What every consuming worker of a kind opens once and closes at stop."""

    kind: str
    consumers: BatchConsumers
    pool: AsyncConnectionPool[Conn]
    publisher: KafkaPublisher
    services: list[Service]
    # Shared by the worker's agents: it stops once, with the first failure.
    stop: StopOnce
    state: WorkerState
    loops: list[BatchLoop]

    def parts(self, metrics: Metrics, settings: Settings, services: list[Service]) -> WorkerParts:
        budget = ShutdownBudget(settings.shutdown_timeout_seconds)
        shutdown = GracefulShutdown(self.state, self.loops, self.consumers.commit, budget)
        # The consumers last: they start once everything their agents use has started, and
        # stop first.
        return WorkerParts([*services, self.consumers], metrics, shutdown)


def probe_service(settings: Settings, metrics: Metrics, kind: str, state: WorkerState) -> Service:
    """/metrics, /healthz and /readyz on the kind's metrics port."""
    database = DatabaseProbe(settings.postgres_conninfo, settings.probe_database_timeout_seconds)
    return ProbeService(
        metrics,
        settings.metrics_host,
        metrics_port(settings, kind),
        state,
        database,
        settings.probe_stale_seconds,
    )


def open_resources(settings: Settings, metrics: Metrics, kind: str) -> Resources:
    pool = make_pool(settings.postgres_conninfo, settings.postgres_pool_size)
    publisher = KafkaPublisher(settings.kafka)
    consumers = BatchConsumers()
    state = WorkerState(consumers.stop_once, in_group=True)
    services: list[Service] = [
        # First: it starts before the others and stops after them (mode stops in reverse).
        probe_service(settings, metrics, kind, state),
        DatabaseService(pool),
        PublisherService(publisher),
    ]
    return Resources(kind, consumers, pool, publisher, services, consumers.stop_once, state, [])


def add_agent(
    settings: Settings,
    metrics: Metrics,
    parts: Resources,
    agent_name: str,
    inputs: list[TopicSpec],
    handler: BatchHandler,
) -> None:
    """Every agent: the shared batch loop, with its own breaker, on ``inputs``, read by a
    consumer of its own in the kind's group."""
    dead_letters = DeadLetters.in_postgres(settings.worker_master_keys(), parts.pool)
    isolation = Isolation(settings.breaker.breaker(handler.name), metrics, dead_letters)
    loop = BatchLoop(handler, isolation, settings.batch_limits, metrics, parts.stop)
    parts.loops.append(loop)
    consumer = settings.group_consumer(parts.kind, inputs)
    membership = parts.state.member(agent_name)
    topic_names = [settings.topics.name(spec) for spec in inputs]
    parts.consumers.add(loop, KafkaBatchSource(settings.kafka, topic_names, consumer, membership))


def build_projection_worker(
    settings: Settings,
    metrics: Metrics,
    projection: Projection[Any, Any, Any],
    extra_services: Callable[[Resources], list[Service]] = lambda _: [],
    tracking: Tracking | None = None,
    agent_per_input: bool = False,
) -> WorkerParts:
    """A worker that feeds ``projection`` from its input topics: one agent for all of them,
    or (``agent_per_input``) one per topic, each with its own consumer and runner, so that
    one topic's backlog never delays another's messages."""
    parts = open_resources(settings, metrics, projection.name)

    def runner() -> ProjectionRunner[Any, Any, Any]:
        return ProjectionRunner(
            projection,
            parts.pool,
            parts.publisher,
            settings.topics,
            metrics,
            failpoint=settings.failpoint,
            outbox_drain_max_bytes=settings.batch_max_bytes,
            tracking=tracking,
        )

    inputs = list(projection.input_specs)
    if agent_per_input:
        agents = {f"{projection.name}-{settings.topics.name(spec)}": [spec] for spec in inputs}
    else:
        agents = {f"{projection.name}-projection": inputs}
    runners = [runner() for _ in agents]
    for (agent, topics), each in zip(agents.items(), runners, strict=True):
        add_agent(settings, metrics, parts, agent, topics, each)
    # One drain of what a previous run left in the projection's outbox (any runner's).
    services = [*parts.services, OutboxService(runners[0]), *extra_services(parts)]
    return parts.parts(metrics, settings, services)


def key_store(settings: Settings) -> KeyStore:
    return KeyStore(settings.worker_master_keys())


def probe_sealer(settings: Settings) -> ProbeSealer:
    return ProbeSealer(settings.worker_master_keys())


def sealer(settings: Settings, raw: TopicSpec) -> Sealer:
    """The sealing of one raw topic (see projections.sealing)."""
    return Sealer(
        default_schemas(),
        settings.topics,
        key_store(settings),
        settings.max_memory_value_bytes,
        input_specs=(raw,),
    )


# The worker kind that sealed both raw topics before the one-hop stages: a fused
# worker takes over its raw offsets (``HandoverTracking``).
SEALER = "sealer"
# The raw topic each one-hop projection seals and projects.
RAW_INPUTS: dict[str, TopicSpec] = {"memory": MEMORY_EVENTS, "conversation": CONVERSATION_EVENTS}


@dataclass(frozen=True, slots=True)
class LiveInput:
    """What the live worker of a projection reads, and so what its tracking rows
    (``projection_offsets``) are of: the raw topic, which it seals and projects in one stage
    (a partition it has never tracked starts where the ``SEALER`` left it), or, with
    ``MEMPROJ_PROJECTION_SOURCE=sealed``, the sealed log alone. A rebuild's swap keeps these
    rows true of the tables it swaps in (``streams.replay``)."""

    specs: tuple[TopicSpec, ...]
    seals: bool
    inherit_from: str | None

    def tracking(self) -> Tracking:
        if self.inherit_from is None:
            return PostgresTracking()
        return HandoverTracking(self.inherit_from)


def live_input(settings: Settings, projection: Projection[Any, Any, Any]) -> LiveInput:
    if settings.projection_source == "sealed":
        return LiveInput(tuple(projection.input_specs), seals=False, inherit_from=None)
    return LiveInput((RAW_INPUTS[projection.name],), seals=True, inherit_from=SEALER)


def build_fused_worker(
    settings: Settings, metrics: Metrics, projection: Projection[Any, Any, Any]
) -> WorkerParts:
    """``projection`` fed from its raw topic in one stage: sealed, projected, and the sealed
    log published, in one transaction per batch (projections.sealing.fused); with
    ``MEMPROJ_PROJECTION_SOURCE=sealed``, the projection alone on the sealed log."""
    source = live_input(settings, projection)
    if not source.seals:
        return build_projection_worker(settings, metrics, projection)
    (raw,) = source.specs
    fused = SealingProjection(sealer(settings, raw), projection)
    # Topic lifetimes: the raw input is deleted up to what this stage committed.
    return build_projection_worker(
        settings,
        metrics,
        fused,
        lambda parts: raw_input_trimmers(settings, metrics, parts.pool, fused),
        source.tracking(),
    )


def memory_projection(settings: Settings, metrics: Metrics | None = None) -> MemoryProjection:
    return MemoryProjection(
        default_schemas(),
        settings.topics,
        settings.max_memory_value_bytes,
        timedelta(seconds=settings.deletion_deadline_seconds),
        key_store(settings),
        metrics,
    )


def conversation_projection(settings: Settings, metrics: Metrics) -> ConversationProjection:
    return ConversationProjection(
        default_schemas(), settings.topics, settings.context, metrics, key_store(settings)
    )


def build_memory_worker(settings: Settings, metrics: Metrics) -> WorkerParts:
    return build_fused_worker(settings, metrics, memory_projection(settings, metrics))


def build_conversation_worker(settings: Settings, metrics: Metrics) -> WorkerParts:
    return build_fused_worker(settings, metrics, conversation_projection(settings, metrics))


def build_deletion_worker(settings: Settings, metrics: Metrics) -> WorkerParts:
    """The ledger: requests and acknowledgements, plus redelivery, verification and the
    deletion metrics."""
    # The verification probes are searched in the vector store: its embedder's vectors.
    embedder = build_embedder(settings)
    probes = probe_sealer(settings)  # the ledger seals probes, the verification opens them
    projection = LedgerProjection(
        default_schemas(),
        settings.topics,
        embedder,
        timedelta(seconds=settings.deletion_deadline_seconds),
        metrics,
        probes=probes,
    )

    def maintenance(parts: Resources) -> list[Service]:
        # The verification probe reads every store: each is opened here, read-only.
        stores = open_all(StoreSupplies(settings, parts.pool))
        return [
            LedgerMaintenance(
                parts.pool,
                parts.publisher,
                stores,
                settings.topics,
                metrics,
                timedelta(seconds=settings.deletion_check_interval_seconds),
                timedelta(seconds=settings.deletion_redelivery_seconds),
                timedelta(seconds=settings.rebuild_grace_seconds),
                audit_retention=settings.api_audit_retention,
                purge=PurgeRound(parts.pool, purge_checks(settings, parts.pool, stores))
                if settings.deletion_purge_check_seconds > 0
                else None,
                purge_interval=timedelta(seconds=settings.deletion_purge_check_seconds),
            ),
            # Topic lifetimes: memory.current's segments roll (streams.compaction).
            *segment_rollers(settings, metrics),
        ]

    # Requests and acknowledgements each on a consumer of their own: under load the stores
    # acknowledge hundreds of tombstones a second (a revocation sends one to every store),
    # and a request waiting behind them delayed its own erasure by seconds.
    return build_projection_worker(settings, metrics, projection, maintenance, agent_per_input=True)


def build_store_worker(settings: Settings, metrics: Metrics, store: str) -> WorkerParts:
    """A derived store: honours tombstones in its own consumer group, and keeps itself up to
    date where it is fed by a stream (``STORE_FEEDS``)."""
    parts = open_resources(settings, metrics, store)
    supplies = StoreSupplies(settings, parts.pool)
    derived = BY_NAME[store].open(supplies)
    feed = STORE_FEEDS.get(store)
    if feed is not None:
        feed(settings, metrics, parts, supplies)
    handler = TombstoneHandler(derived, parts.publisher, settings.topics, metrics)
    add_agent(settings, metrics, parts, handler.name, [DELETION_TOMBSTONES], handler)
    return parts.parts(metrics, settings, parts.services)


def feed_embeddings(
    settings: Settings, metrics: Metrics, parts: Resources, supplies: StoreSupplies
) -> None:
    """Index updates from memory.current and conversation.messages. They take the vector
    store's write lock that tombstones take: one write at a time."""
    indexer = EmbeddingsIndexer(
        parts.pool,
        supplies.vectors,
        build_embedder(settings),
        parts.publisher,
        settings.topics,
        metrics,
        supplies.vector_writes,
        key_store(settings),
    )
    add_agent(
        settings,
        metrics,
        parts,
        "embeddings-index",
        [MEMORY_CURRENT, CONVERSATION_MESSAGES],
        indexer,
    )


def feed_cache(
    settings: Settings, metrics: Metrics, parts: Resources, supplies: StoreSupplies
) -> None:
    """Invalidation of cached reads that a memory.current update makes stale."""
    freshness = CacheFreshness(supplies.cache, parts.publisher)
    add_agent(settings, metrics, parts, "cache-freshness", [MEMORY_CURRENT], freshness)


# The stores that are also fed by a stream, besides tombstones.
STORE_FEEDS: dict[str, Callable[[Settings, Metrics, Resources, StoreSupplies], None]] = {
    "embeddings": feed_embeddings,
    "cache": feed_cache,
}


def consumers_per_worker(kind: str) -> int:
    """The members one worker of ``kind`` adds to its group: a consumer per agent (the
    ledger's requests and acknowledgements; a store's tombstones and its feed where it has
    one; the monitor consumes nothing)."""
    if kind not in CONSUMING_KINDS:
        return 0
    if kind == "deletion":
        return len(LedgerProjection.input_specs)  # requests, acknowledgements
    return 2 if kind in STORE_FEEDS else 1


def build_monitor_worker(settings: Settings, metrics: Metrics) -> WorkerParts:
    """Consumer lag of every memproj group and the ghost audit of every derived store."""
    pool = make_pool(settings.postgres_conninfo, settings.postgres_pool_size)
    monitor = MonitorService(
        LagCollector(settings.kafka, settings.group_prefix),
        pool,
        open_all(StoreSupplies(settings, pool)),
        metrics,
        timedelta(seconds=settings.monitor_interval_seconds),
        timedelta(seconds=settings.audit_interval_seconds),
    )
    state = WorkerState(None, in_group=False)
    services: list[Service] = [
        probe_service(settings, metrics, "monitor", state),
        DatabaseService(pool),
        monitor,
    ]
    budget = ShutdownBudget(settings.shutdown_timeout_seconds)
    return WorkerParts(services, metrics, GracefulShutdown(state, [], None, budget))


WORKER_KINDS: dict[str, Callable[[Settings, Metrics], WorkerParts]] = {
    "memory": build_memory_worker,
    "conversation": build_conversation_worker,
    "deletion": build_deletion_worker,
    **{store: partial(build_store_worker, store=store) for store in STORE_NAMES},
    "monitor": build_monitor_worker,
}
# Every kind but the monitor, which consumes no topic.
CONSUMING_KINDS = tuple(kind for kind in WORKER_KINDS if kind != "monitor")


class GracefulWorker(mode.Worker):
    """mode's worker (SIGTERM and SIGINT stop it) whose stop begins with the graceful
    shutdown, before any service stops."""

    def __init__(self, *services: Service, shutdown: GracefulShutdown, **kwargs: Any) -> None:
        self.graceful = shutdown
        super().__init__(*services, **kwargs)

    async def on_stop(self) -> None:
        await self.graceful.begin()
        await super().on_stop()


def build_worker(settings: Settings, kind: str) -> mode.Worker:
    settings.worker_master_keys()  # refuses the development key outside local development
    # A wrong password, an untrusted certificate or a group it may not use ends it here.
    settings.kafka.check_connection(group=None if kind == "monitor" else settings.group_id(kind))
    parts = WORKER_KINDS[kind](settings, Metrics(CollectorRegistry()))
    options: dict[str, Any] = {
        "shutdown": parts.shutdown,
        "loglevel": settings.log_level,
        "redirect_stdouts": False,
    }
    return GracefulWorker(*parts.services, **options)
