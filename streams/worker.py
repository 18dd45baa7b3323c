"""Composition root of a worker process: settings in, a runnable worker out.

Each worker kind is its own consumer group, so that every projection and derived store keeps
its own offsets and can be stopped, lagged or replayed alone. Every agent takes its batches
straight from a confluent-kafka consumer of its own (``streams.consumer``), in its kind's
group, and every worker is a mode worker (ops/decisions/batch-consumer.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property, partial
from typing import Any

import mode
from mode import Service
from prometheus_client import CollectorRegistry
from psycopg_pool import AsyncConnectionPool

from projections.bookkeeping import HandoverTracking, PostgresTracking, Tracking
from projections.conversation.projection import ConversationProjection
from projections.deletion.projection import LedgerProjection
from projections.embeddings.lance_writer import LanceWriterLock
from projections.memory.projection import MemoryProjection
from projections.sealing.fused import SealingProjection
from projections.sealing.keys import KeyStore
from projections.sealing.probes import ProbeSealer
from projections.sealing.sealer import Sealer
from projections.sql import Conn, KeyLookups
from projections.stores import STORES, DerivedStore, StoreRegistry
from streams.agents.cache import CacheFreshness
from streams.agents.index import EmbeddingsIndexer
from streams.agents.tombstones import TombstoneHandler
from streams.compaction import segment_rollers
from streams.consumer import KafkaBatchSource
from streams.coordination import Lease, in_postgres
from streams.isolation import DeadLetters, Isolation
from streams.kafka import KafkaPublisher
from streams.lag import LagCollector
from streams.loop import BatchHandler, BatchLoop, StopOnce
from streams.maintenance import LedgerMaintenance
from streams.metrics import Metrics
from streams.monitoring import MonitorService
from streams.probes import ShutdownBudget
from streams.purge import PurgeRound, purge_checks
from streams.retention import RetentionScheduler, retention_settings
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


def metrics_port(settings: Settings, default: int) -> int:
    """The port a worker serves /metrics on: its kind's, unless the settings name one."""
    return default if settings.metrics_port is None else settings.metrics_port


log = logging.getLogger(__name__)


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


def probe_service(settings: Settings, metrics: Metrics, port: int, state: WorkerState) -> Service:
    """/metrics, /healthz and /readyz on the kind's metrics port (``port``)."""
    database = DatabaseProbe(settings.postgres_conninfo, settings.probe_database_timeout_seconds)
    return ProbeService(
        metrics,
        settings.metrics_host,
        metrics_port(settings, port),
        state,
        database,
        settings.probe_stale_seconds,
    )


def open_resources(settings: Settings, metrics: Metrics, kind: str, port: int) -> Resources:
    pool = make_pool(settings.postgres_conninfo, settings.postgres_pool_size)
    publisher = KafkaPublisher(settings.kafka)
    consumers = BatchConsumers()
    state = WorkerState(consumers.stop_once, in_group=True)
    services: list[Service] = [
        # First: it starts before the others and stops after them (mode stops in reverse).
        probe_service(settings, metrics, port, state),
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
    dead_letters = DeadLetters.in_postgres(
        settings.worker_master_keys(), parts.pool, settings.key_lookups
    )
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
    port: int,
    projection: Projection[Any, Any, Any],
    extra_services: Callable[[Resources], list[Service]] = lambda _: [],
    tracking: Tracking | None = None,
    agent_per_input: bool = False,
) -> WorkerParts:
    """A worker that feeds ``projection`` from its input topics: one agent for all of them,
    or (``agent_per_input``) one per topic, each with its own consumer and runner, so that
    one topic's backlog never delays another's messages."""
    parts = open_resources(settings, metrics, projection.name, port)

    def runner() -> ProjectionRunner[Any, Any, Any]:
        return ProjectionRunner(
            projection,
            parts.pool,
            parts.publisher,
            settings.topics,
            metrics,
            failpoint=settings.failpoint,
            outbox_drain_max_bytes=settings.batch_max_bytes,
            tracking=tracking or PostgresTracking(settings.key_lookups),
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
    return KeyStore(settings.worker_master_keys(), settings.key_lookups)


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

    def tracking(self, lookups: KeyLookups) -> Tracking:
        if self.inherit_from is None:
            return PostgresTracking(lookups)
        return HandoverTracking(self.inherit_from, lookups)


def live_input(settings: Settings, projection: Projection[Any, Any, Any]) -> LiveInput:
    if settings.projection_source == "sealed":
        return LiveInput(tuple(projection.input_specs), seals=False, inherit_from=None)
    return LiveInput((RAW_INPUTS[projection.name],), seals=True, inherit_from=SEALER)


def build_fused_worker(
    settings: Settings, metrics: Metrics, port: int, projection: Projection[Any, Any, Any]
) -> WorkerParts:
    """``projection`` fed from its raw topic in one stage: sealed, projected, and the sealed
    log published, in one transaction per batch (projections.sealing.fused); with
    ``MEMPROJ_PROJECTION_SOURCE=sealed``, the projection alone on the sealed log."""
    source = live_input(settings, projection)
    if not source.seals:
        return build_projection_worker(settings, metrics, port, projection)
    (raw,) = source.specs
    fused = SealingProjection(sealer(settings, raw), projection)
    # Topic lifetimes: the raw input is deleted up to what this stage committed.
    return build_projection_worker(
        settings,
        metrics,
        port,
        fused,
        lambda parts: raw_input_trimmers(settings, metrics, parts.pool, fused),
        source.tracking(settings.key_lookups),
    )


def memory_projection(
    settings: Settings, metrics: Metrics | None = None, stores: StoreRegistry = STORES
) -> MemoryProjection:
    """The memory projection; its revocations wait for ``stores``."""
    return MemoryProjection(
        default_schemas(),
        settings.topics,
        settings.max_memory_value_bytes,
        timedelta(seconds=settings.deletion_deadline_seconds),
        key_store(settings),
        metrics,
        stores.requirements,
        metrics,
    )


def conversation_projection(settings: Settings, metrics: Metrics) -> ConversationProjection:
    return ConversationProjection(
        default_schemas(), settings.topics, settings.context, metrics, key_store(settings)
    )


def build_memory_worker(
    settings: Settings, metrics: Metrics, port: int, stores: StoreRegistry
) -> WorkerParts:
    projection = memory_projection(settings, metrics, stores)
    return build_fused_worker(settings, metrics, port, projection)


def build_conversation_worker(settings: Settings, metrics: Metrics, port: int) -> WorkerParts:
    projection = conversation_projection(settings, metrics)
    return build_fused_worker(settings, metrics, port, projection)


def ledger_projection(
    settings: Settings, metrics: Metrics, stores: StoreRegistry = STORES
) -> LedgerProjection:
    """The deletion ledger; each deletion waits for the ``stores`` that hold its target."""
    return LedgerProjection(
        default_schemas(),
        settings.topics,
        # The verification probes are searched in the vector store: its embedder's vectors.
        build_embedder(settings),
        timedelta(seconds=settings.deletion_deadline_seconds),
        metrics,
        # The ledger seals probes, the verification opens them.
        probes=probe_sealer(settings),
        lookups=settings.key_lookups,
        stores=stores,
    )


def build_deletion_worker(
    settings: Settings, metrics: Metrics, port: int, stores: StoreRegistry
) -> WorkerParts:
    """The ledger of ``stores``: requests and acknowledgements, plus redelivery,
    verification and the deletion metrics. Its duties run once among its replicas: where the
    deletion duties' lease leads (the retention schedule takes a lock per round)."""
    projection = ledger_projection(settings, metrics, stores)

    def maintenance(parts: Resources) -> list[Service]:
        # The verification probe reads every store: each is opened here, read-only.
        opened = stores.open_all(StoreSupplies(settings, parts.pool))
        # Before the duties: it starts first and stops last (mode stops in reverse).
        lease = Lease(in_postgres(settings.postgres_conninfo), DELETION_DUTIES, metrics)
        return [
            lease,
            LedgerMaintenance(
                parts.pool,
                parts.publisher,
                opened,
                settings.topics,
                metrics,
                timedelta(seconds=settings.deletion_check_interval_seconds),
                timedelta(seconds=settings.deletion_redelivery_seconds),
                timedelta(seconds=settings.rebuild_grace_seconds),
                audit_retention=settings.api_audit_retention,
                purge=PurgeRound(parts.pool, purge_checks(settings, parts.pool, opened))
                if settings.deletion_purge_check_seconds > 0
                else None,
                purge_interval=timedelta(seconds=settings.deletion_purge_check_seconds),
                lease=lease,
                lookups=settings.key_lookups,
            ),
            # Retention and expiry issue their erasures (streams.retention).
            RetentionScheduler(
                parts.pool,
                parts.publisher,
                settings.topics,
                metrics,
                retention_settings(settings),
                lookups=settings.key_lookups,
            ),
            # Topic lifetimes: memory.current's segments roll (streams.compaction).
            *segment_rollers(settings, metrics, lease),
        ]

    # Requests and acknowledgements each on a consumer of their own: under load the stores
    # acknowledge hundreds of tombstones a second (a revocation sends one to every store),
    # and a request waiting behind them delayed its own erasure by seconds.
    return build_projection_worker(
        settings, metrics, port, projection, maintenance, agent_per_input=True
    )


# The leases of the duties that run once among a kind's replicas (streams.coordination).
DELETION_DUTIES = "deletion-maintenance"
MONITOR_DUTIES = "monitor"


# How a derived store is kept up to date from a stream besides tombstones (``STORE_FEEDS``):
# it adds the agents that feed it to the store worker's resources.
Feed = Callable[[Settings, Metrics, "Resources", StoreSupplies], None]


def build_store_worker(
    settings: Settings,
    metrics: Metrics,
    port: int,
    store: type[DerivedStore],
    feed: Feed | None,
    stores: StoreRegistry,
) -> WorkerParts:
    """A derived store: honours tombstones in its own consumer group, and keeps itself up to
    date where it is fed by a stream (``feed``)."""
    parts = open_resources(settings, metrics, store.name, port)
    supplies = StoreSupplies(settings, parts.pool)
    derived = store.open(supplies)
    if feed is not None:
        feed(settings, metrics, parts, supplies)
    handler = TombstoneHandler(derived, parts.publisher, settings.topics, metrics, stores=stores)
    add_agent(settings, metrics, parts, handler.name, [DELETION_TOMBSTONES], handler)
    return parts.parts(metrics, settings, parts.services)


def feed_embeddings(
    settings: Settings, metrics: Metrics, parts: Resources, supplies: StoreSupplies
) -> None:
    """Index updates from memory.current and conversation.messages. They take the vector
    store's write lock that tombstones take: one write at a time. On LanceDB, one process
    writes a directory: a second worker stands by here until the writer stops (the lock is
    held until this process ends)."""
    if settings.vector_store == "lancedb":
        LanceWriterLock(settings.vector_store_path).acquire()
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
STORE_FEEDS: dict[str, Feed] = {
    "embeddings": feed_embeddings,
    "cache": feed_cache,
}


def build_monitor_worker(
    settings: Settings, metrics: Metrics, port: int, stores: StoreRegistry
) -> WorkerParts:
    """Consumer lag of every memproj group and the ghost audit of every one of ``stores``,
    collected and exported by the monitor that leads (the others stand by)."""
    pool = make_pool(settings.postgres_conninfo, settings.postgres_pool_size)
    lease = Lease(
        in_postgres(settings.postgres_conninfo),
        MONITOR_DUTIES,
        metrics,
        metrics.monitor_standing_by,
    )
    monitor = MonitorService(
        LagCollector(settings.kafka, settings.group_prefix),
        pool,
        stores.open_all(StoreSupplies(settings, pool)),
        metrics,
        timedelta(seconds=settings.monitor_interval_seconds),
        timedelta(seconds=settings.audit_interval_seconds),
        lease=lease,
    )
    state = WorkerState(None, in_group=False)
    services: list[Service] = [
        probe_service(settings, metrics, port, state),
        DatabaseService(pool),
        lease,
        monitor,
    ]
    budget = ShutdownBudget(settings.shutdown_timeout_seconds)
    return WorkerParts(services, metrics, GracefulShutdown(state, [], None, budget))


@dataclass(frozen=True, slots=True)
class WorkerKind:
    """A kind of worker (``memproj worker NAME``): how it is built, and what a deployment of
    it must know (``streams.deployment`` writes the Kubernetes, compose and Prometheus files
    from these)."""

    name: str
    # Its /metrics, /healthz and /readyz port: each kind its own, so that every worker on
    # one host can be scraped.
    metrics_port: int
    builder: Callable[[Settings, Metrics, int], WorkerParts]
    # The members one worker adds to its kind's consumer group, a consumer per agent (0: it
    # consumes nothing).
    consumers: int
    # Why one worker of the kind runs at a time; None: more share the kind's partitions.
    single: str | None = None
    # The derived store the kind keeps (a store worker).
    store: type[DerivedStore] | None = None
    # Whether it opens every derived store (the verification probe, the ghost audit): it
    # mounts their volumes, beside their writers.
    reads_every_store: bool = False

    def build(self, settings: Settings, metrics: Metrics) -> WorkerParts:
        return self.builder(settings, metrics, self.metrics_port)


@dataclass(frozen=True)
class WorkerRegistry:
    """Every worker kind: the projections, the ledger, a worker per derived store of
    ``stores`` (fed by ``feeds`` where a stream keeps it up to date), and the monitor.
    ``WORKERS`` is memproj's; ``with_store`` adds a store, and its worker, without editing
    a registry's module."""

    stores: StoreRegistry = STORES
    feeds: Mapping[str, Feed] = field(default_factory=lambda: dict(STORE_FEEDS))

    @cached_property
    def kinds(self) -> dict[str, WorkerKind]:
        stores = self.stores
        kinds = [
            WorkerKind("memory", 9101, partial(build_memory_worker, stores=stores), 1),
            WorkerKind("conversation", 9102, build_conversation_worker, 1),
            WorkerKind(
                "deletion",
                9103,
                partial(build_deletion_worker, stores=stores),
                len(LedgerProjection.input_specs),  # requests, acknowledgements
                reads_every_store=True,
            ),
            *(self._store_kind(store) for store in stores),
            WorkerKind(
                "monitor",
                9108,
                partial(build_monitor_worker, stores=stores),
                0,
                reads_every_store=True,
            ),
        ]
        for fact in ("name", "metrics_port"):
            values = [getattr(kind, fact) for kind in kinds]
            shared = sorted({str(v) for v in values if values.count(v) > 1})
            if shared:
                raise ValueError(f"worker kinds share a {fact}: {', '.join(shared)}")
        return {kind.name: kind for kind in kinds}

    def _store_kind(self, store: type[DerivedStore]) -> WorkerKind:
        feed = self.feeds.get(store.name)
        build = partial(build_store_worker, store=store, feed=feed, stores=self.stores)
        # Its tombstones, and its feed where it has one.
        consumers = 1 if feed is None else 2
        return WorkerKind(
            store.name, store.metrics_port, build, consumers, store.single_writer, store
        )

    def with_store(self, store: type[DerivedStore], feed: Feed | None = None) -> WorkerRegistry:
        feeds = dict(self.feeds) if feed is None else {**self.feeds, store.name: feed}
        return WorkerRegistry(self.stores.with_store(store), feeds)

    @property
    def metrics_ports(self) -> dict[str, int]:
        return {name: kind.metrics_port for name, kind in self.kinds.items()}

    @property
    def consuming(self) -> tuple[str, ...]:
        """Every kind with a consumer group (all but the monitor)."""
        return tuple(name for name, kind in self.kinds.items() if kind.consumers)


WORKERS = WorkerRegistry()
WORKER_KINDS: dict[str, Callable[[Settings, Metrics], WorkerParts]] = {
    name: kind.build for name, kind in WORKERS.kinds.items()
}
METRICS_PORTS = WORKERS.metrics_ports
CONSUMING_KINDS = WORKERS.consuming


def consumers_per_worker(kind: str) -> int:
    """The members one worker of ``kind`` adds to its group."""
    return WORKERS.kinds[kind].consumers


class GracefulWorker(mode.Worker):
    """mode's worker (SIGTERM and SIGINT stop it) whose stop begins with the graceful
    shutdown, before any service stops."""

    def __init__(self, *services: Service, shutdown: GracefulShutdown, **kwargs: Any) -> None:
        self.graceful = shutdown
        super().__init__(*services, **kwargs)

    async def on_stop(self) -> None:
        await self.graceful.begin()
        await super().on_stop()

    async def _sentinel_task(self) -> None:
        # mode-streaming 0.7.1: Worker._shutdown_loop awaits this coroutine at every exit,
        # after the services stopped and the tasks left were cancelled; mode's own is a fixed
        # asyncio.sleep(1.0). Here the exit waits only for the cancelled tasks to unwind (at
        # most that second) and for the rest of the not-ready hold. If mode stops calling it,
        # tests/streams/test_worker.py::test_a_stopped_worker_exits_through_its_own_final_wait
        # fails.
        current = asyncio.current_task()
        unwinding = [task for task in asyncio.all_tasks() if task is not current]
        left: set[asyncio.Task[Any]] = set()
        if unwinding:
            _, left = await asyncio.wait(unwinding, timeout=1.0)
        await self.graceful.hold_not_ready()
        log.info("exit: %d of %d tasks unwound", len(unwinding) - len(left), len(unwinding))


def build_worker(settings: Settings, kind: str) -> mode.Worker:
    settings.worker_master_keys()  # refuses the development key outside local development
    # A wrong password, an untrusted certificate or a group it may not use ends it here.
    settings.kafka.check_connection(group=None if kind == "monitor" else settings.group_id(kind))
    parts = WORKERS.kinds[kind].build(settings, Metrics(CollectorRegistry()))
    options: dict[str, Any] = {
        "shutdown": parts.shutdown,
        "loglevel": settings.log_level,
        "redirect_stdouts": False,
    }
    return GracefulWorker(*parts.services, **options)
