"""Long-lived resources of a worker as mode services, started before its consumers
(``BatchConsumers``) and stopped after them: the PostgreSQL pool, the Kafka publisher, the
/metrics and probe endpoint; and the graceful shutdown that precedes the consumers' own
stop."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import UTC, datetime
from functools import cached_property
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import orjson
import psycopg
from mode import Service
from prometheus_client import make_wsgi_app
from psycopg_pool import AsyncConnectionPool

from projections.cache.store import RedisCache, RedisClient
from projections.cache.store import connect as connect_redis
from projections.embeddings import factory
from projections.embeddings.embedder import Embedder
from projections.embeddings.vectors import VectorStore, VectorTables
from projections.migrate import migrate
from projections.sealing.probes import ProbeSealer
from projections.sql import Conn
from projections.stores.base import VectorShadows
from streams.consumer import KafkaBatchSource
from streams.failures import loggable
from streams.kafka import KafkaPublisher
from streams.loop import BatchLoop, StopOnce
from streams.metrics import Metrics
from streams.probes import (
    HEARTBEAT_INTERVAL_SECONDS,
    NOT_READY_HOLD_SECONDS,
    DatabaseAnswer,
    GroupMembership,
    ShutdownBudget,
    Verdict,
    liveness,
    needs_database_check,
    readiness,
)
from streams.runner import ProjectionRunner
from streams.settings import Settings

if TYPE_CHECKING:
    from projections.embeddings.postgres import Pool

log = logging.getLogger(__name__)

# A shutdown that overran its bound (sysexits' EX_SOFTWARE).
EXIT_SHUTDOWN_TIMEOUT = 70


def open_vector_store(
    settings: Settings, table: str = "embeddings", *, adopt: bool = False, create: bool = True
) -> VectorStore:
    """The vector store of the configured embedder, where ``MEMPROJ_VECTOR_STORE`` keeps it:
    refuses a table of another model (``adopt``: only the rebuild, which replaces it);
    ``create=False`` (a reader that never writes) refuses a missing table instead of creating
    it."""
    model = settings.embedder_identity
    if settings.vector_store == "postgres":
        from projections.embeddings.postgres import PostgresVectorStore

        return PostgresVectorStore(
            vector_pool(settings.postgres_conninfo, settings.postgres_pool_size),
            model.dim,
            table,
            model=model.name,
            adopt=adopt,
            create=create,
        )
    # lancedb takes about a second to import: only the commands that open the store pay it.
    from projections.embeddings.lance import LanceVectorStore

    return LanceVectorStore(
        settings.vector_store_path,
        model.dim,
        table=table,
        model=model.name,
        adopt=adopt,
        create=create,
    )


def open_vector_tables(settings: Settings) -> VectorTables:
    """The rebuild tables beside the live vector store, and what each records."""
    model = settings.embedder_identity
    if settings.vector_store == "postgres":
        from projections.embeddings.postgres import PostgresCollections

        pool = vector_pool(settings.postgres_conninfo, settings.postgres_pool_size)
        return PostgresCollections(pool, model.dim, model=model.name)
    from projections.embeddings.lance_tables import LanceShadows  # lancedb: see open_vector_store

    return LanceShadows(settings.vector_store_path, model.dim, model=model.name)


# The PostgreSQL vector store's pools of this process, by connection string and size.
_vector_pools: dict[tuple[str, int], Pool] = {}
_vector_pools_lock = threading.Lock()


def vector_pool(conninfo: str, size: int) -> Pool:
    """The process's pool of synchronous connections for the PostgreSQL vector store (its
    methods run in worker threads), opened on first use: one per database, however many
    times the store is opened."""
    from projections.embeddings.postgres import open_pool

    with _vector_pools_lock:
        pool = _vector_pools.get((conninfo, size))
        if pool is None:
            pool = _vector_pools[(conninfo, size)] = open_pool(conninfo, size)
        return pool


def close_vector_pools() -> None:
    """Closes every pool ``vector_pool`` opened (a process that opens many databases: the
    tests)."""
    with _vector_pools_lock:
        pools = list(_vector_pools.values())
        _vector_pools.clear()
    for pool in pools:
        pool.close()


def build_embedder(settings: Settings) -> Embedder:
    """The configured embedder (``MEMPROJ_EMBEDDER``), loaded: once per entry point, and
    passed to whatever embeds (wordllama takes a second and 60 MB to load)."""
    return factory.build_embedder(settings.embedder, settings.embedding_dim)


class StoreSupplies:
    """What derived stores are opened from (``projections.stores.base.StoreResources``):
    the worker's pool, and the vector store, the cache and the probe sealer opened on first
    use, so that a worker pays only for what its stores use."""

    def __init__(self, settings: Settings, pool: AsyncConnectionPool[Conn]) -> None:
        self._settings = settings
        self.pool = pool

    @cached_property
    def vectors(self) -> VectorStore:
        return open_vector_store(self._settings)

    @cached_property
    def redis(self) -> RedisClient:
        return connect_redis(self._settings.redis_url, self._settings.redis_cluster)

    @cached_property
    def cache(self) -> RedisCache:
        settings = self._settings
        return RedisCache(self.redis, settings.cache_ttl_seconds, settings.cache_namespace)

    async def aclose(self) -> None:
        """Closes the Redis connection, if one was opened (commands; workers exit with it)."""
        if "redis" in self.__dict__:
            await self.redis.aclose()

    @cached_property
    def probes(self) -> ProbeSealer:
        return ProbeSealer(self._settings.worker_master_keys())

    @cached_property
    def vector_shadows(self) -> VectorShadows:
        return open_vector_tables(self._settings)

    @cached_property
    def vector_writes(self) -> asyncio.Lock:
        return asyncio.Lock()


def make_pool(dsn: str, size: int) -> AsyncConnectionPool[Conn]:
    return AsyncConnectionPool(
        dsn, min_size=1, max_size=size, open=False, kwargs={"autocommit": False}
    )


class DatabaseService(Service):
    """Opens the pool and brings the schema up to date before any agent runs."""

    def __init__(self, pool: AsyncConnectionPool[Conn], **kwargs: Any) -> None:
        self.pool = pool
        super().__init__(**kwargs)

    async def on_start(self) -> None:
        await self.pool.open(wait=True, timeout=60)
        async with self.pool.connection() as conn:
            applied = await migrate(conn)
        if applied:
            log.info("applied migrations: %s", ", ".join(applied))

    async def on_stop(self) -> None:
        await self.pool.close()


class PublisherService(Service):
    def __init__(self, publisher: KafkaPublisher, **kwargs: Any) -> None:
        self.publisher = publisher
        super().__init__(**kwargs)

    async def on_stop(self) -> None:
        self.publisher.close()


class OutboxService(Service):
    """Publishes what a previous run committed but did not get to publish, before the agent
    applies anything new."""

    def __init__(self, runner: ProjectionRunner[Any, Any, Any], **kwargs: Any) -> None:
        self.runner = runner
        super().__init__(**kwargs)

    async def on_start(self) -> None:
        drained = await self.runner.drain_outbox()
        if drained:
            log.info("%s: republished %d outbox messages", self.runner.projection.name, drained)


class BatchConsumers(Service):
    """Runs a worker's batch loops, each on a Kafka batch source of its own
    (``streams.consumer``): joins the group once the services before it have started, stops
    its agents first, and crashes the worker (``stop_once``) on the first failure of any
    loop, which the graceful shutdown then reports.

    Each agent has its own consumer, so that one agent's backlog never holds up another's
    messages: a store worker's tombstones are fetched and honoured while its feed is behind
    (in faust's app, one consumer fed every agent, and a full buffer of one stalled all)."""

    def __init__(self, **kwargs: Any) -> None:
        self.stop_once = StopOnce(self.crash)
        self._runs: list[tuple[BatchLoop, KafkaBatchSource]] = []
        self._agents: list[asyncio.Task[None]] = []
        super().__init__(**kwargs)

    def add(self, loop: BatchLoop, source: KafkaBatchSource) -> None:
        self._runs.append((loop, source))

    @property
    def runs(self) -> list[tuple[BatchLoop, KafkaBatchSource]]:
        """Each agent's loop and its source."""
        return list(self._runs)

    async def on_start(self) -> None:
        for loop, source in self._runs:
            await source.start()
            name = f"{loop.handler.name}-consumer"
            self._agents.append(asyncio.create_task(self._run(loop, source), name=name))

    async def _run(self, loop: BatchLoop, source: KafkaBatchSource) -> None:
        try:
            await loop.run(source)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the consumer failed (e.g. KafkaSecurityError)
            log.critical("%s: stopping the worker: %s", loop.handler.name, loggable(exc))
            await self.stop_once(exc)

    async def commit(self) -> None:
        await asyncio.gather(*(source.commit() for _, source in self._runs))

    async def on_stop(self) -> None:
        for task in self._agents:
            task.cancel()
        if self._agents:
            await asyncio.wait(self._agents)
        await asyncio.gather(*(source.close() for _, source in self._runs))


class WorkerState:
    """What the probes report, written by the event loop and read by the probe server's
    threads (single attribute reads and writes: atomic under the GIL)."""

    def __init__(self, stop: StopOnce | None, in_group: bool) -> None:
        self.stop = stop
        self.in_group = in_group
        # One membership per consumer of the worker (a store worker has one for tombstones
        # and one for its feed), each written only by that consumer's thread. The names are
        # registered before any consumer starts, so the dict never changes size while read.
        self._members: dict[str, GroupMembership] = {}
        self.stopping = False
        self.heartbeat = time.monotonic()

    def beat(self) -> None:
        self.heartbeat = time.monotonic()

    def member(self, name: str) -> ConsumerMembership:
        """The observer one consumer of this worker reports its membership to."""
        assert name not in self._members, f"consumer {name} registered twice"
        self._members[name] = GroupMembership()
        return ConsumerMembership(self._members, name)

    @property
    def membership(self) -> GroupMembership | None:
        """The worker's membership, all its consumers together (None: it consumes nothing):
        joined once every consumer is, rebalancing while any one is."""
        if not self.in_group:
            return None
        members = list(self._members.values())
        if not members or any(member.assigned is None for member in members):
            return GroupMembership()
        assigned = frozenset().union(*(member.assigned or () for member in members))
        return GroupMembership(assigned, any(member.rebalancing for member in members))


class ConsumerMembership:
    """``streams.consumer.MembershipObserver`` of one consumer: told from that consumer's
    thread (the rebalance callbacks), one dict item written per call."""

    def __init__(self, members: dict[str, GroupMembership], name: str) -> None:
        self._members = members
        self._name = name

    def rebalancing(self) -> None:
        self._members[self._name] = self._members[self._name].revoked()

    def assigned(self, positions: Iterable[tuple[str, int]]) -> None:
        """The consumer's whole assignment now (a cooperative rebalance adds to it)."""
        self._members[self._name] = self._members[self._name].assigned_to(positions)


class DatabaseProbe:
    """``SELECT 1`` on a fresh connection (not the pool, which busy agents may hold), at most
    once per ``DATABASE_CHECK_TTL_SECONDS``; concurrent probes share the last answer."""

    def __init__(self, dsn: str, timeout_seconds: float) -> None:
        self._dsn = dsn
        # libpq takes whole seconds and treats less than 2 as 2.
        self._connect_timeout = max(2, math.ceil(timeout_seconds))
        self._checking = threading.Lock()
        self._answer: DatabaseAnswer | None = None

    def answer(self) -> DatabaseAnswer | None:
        now = time.monotonic()
        if needs_database_check(self._answer, now) and self._checking.acquire(blocking=False):
            try:
                self._answer = self._check(now)
            finally:
                self._checking.release()
        return self._answer

    def _check(self, now: float) -> DatabaseAnswer:
        try:
            with psycopg.connect(
                self._dsn, connect_timeout=self._connect_timeout, autocommit=True
            ) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error as exc:
            # The class only: the message names hosts, and the DSN must never be echoed.
            return DatabaseAnswer(False, f"unreachable ({type(exc).__name__})", now)
        return DatabaseAnswer(True, "SELECT 1 answered", now)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds would flood the log."""


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a stuck request never holds up the process's exit


class ProbeService(Service):
    """Serves /metrics, /healthz and /readyz (``streams.probes``) from a thread, so that
    /metrics and the liveness verdict answer even while the event loop is busy; the loop
    ticks the heartbeat the liveness probe judges, and refreshes gauges that age with time.

    The server keeps answering until the process exits (it is not stopped with the
    services): during a shutdown /readyz says why it is not ready instead of refusing."""

    def __init__(
        self,
        metrics: Metrics,
        host: str,
        port: int,
        worker_state: WorkerState,
        database: DatabaseProbe,
        stale_after_seconds: float,
        **kwargs: Any,
    ) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self.worker_state = worker_state
        self.database = database
        self.stale_after = stale_after_seconds
        self._metrics_app = make_wsgi_app(metrics.registry)
        self._last_ready: bool | None = None
        super().__init__(**kwargs)

    def liveness(self) -> Verdict:
        return liveness(time.monotonic() - self.worker_state.heartbeat, self.stale_after)

    def readiness(self) -> Verdict:
        state = self.worker_state
        failure = state.stop.failure if state.stop is not None else None
        verdict = readiness(state.membership, self.database.answer(), state.stopping, failure)
        if verdict.ok != self._last_ready:
            self._last_ready = verdict.ok
            log.info("readiness: %s %s", verdict.ok, orjson.dumps(verdict.body()).decode())
        return verdict

    def wsgi(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            verdict = self.liveness()
        elif path == "/readyz":
            verdict = self.readiness()
        else:
            return self._metrics_app(environ, start_response)  # type: ignore[no-any-return]
        body = orjson.dumps(verdict.body())
        status = "200 OK" if verdict.ok else "503 Service Unavailable"
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        start_response(status, headers)
        return [body]

    async def on_start(self) -> None:
        self.worker_state.beat()
        if self.port:
            server = make_server(
                self.host, self.port, self.wsgi, _ThreadingServer, handler_class=_QuietHandler
            )
            threading.Thread(target=server.serve_forever, name="probes", daemon=True).start()
            log.info(
                "metrics and probes on http://%s:%d/{metrics,healthz,readyz}", self.host, self.port
            )

    @Service.timer(HEARTBEAT_INTERVAL_SECONDS)
    async def _heartbeat(self) -> None:
        self.worker_state.beat()

    @Service.timer(2.0)
    async def _refresh(self) -> None:
        self.metrics.update_staleness(datetime.now(UTC))


class GracefulShutdown:
    """The first step of a worker's stop (SIGTERM, or a failure that stops it), before its
    consumers stop: not ready at once; every batch loop takes no new batch and finishes
    (commit, publish, acknowledge) or abandons (rolls back) the batch in progress; the
    acknowledged offsets are committed. The consumers' stop then leaves the group. Past the whole
    bound the process exits, whatever is still stopping."""

    def __init__(
        self,
        state: WorkerState,
        loops: Sequence[BatchLoop],
        commit: Callable[[], Awaitable[object]] | None,
        budget: ShutdownBudget,
    ) -> None:
        """``commit``: commits the acknowledged offsets (None: the worker consumes nothing)."""
        self.state = state
        self.loops = loops
        self.commit = commit
        self.budget = budget
        self.began: float | None = None  # monotonic time the stop began

    async def begin(self) -> None:
        if self.state.stopping:
            return
        self.state.stopping = True
        self.began = started = time.monotonic()
        watchdog = threading.Timer(self.budget.total_seconds, self._exit_now)
        watchdog.daemon = True
        watchdog.start()
        failure = self.state.stop.failure if self.state.stop is not None else None
        cause = "a signal" if failure is None else type(failure).__name__
        log.info("shutdown (%s): not ready; finishing the batches in progress", cause)
        finished = await asyncio.gather(
            *(each.drain(self.budget.drain_seconds) for each in self.loops)
        )
        abandoned = finished.count(False)
        await self._commit_offsets()
        log.info(
            "shutdown: batches drained in %.1f s (%d abandoned and rolled back), offsets "
            "committed; leaving the group",
            time.monotonic() - started,
            abandoned,
        )

    async def hold_not_ready(self, seconds: float = NOT_READY_HOLD_SECONDS) -> None:
        """Waits out what is left of ``seconds`` since the stop began: until then the process
        keeps answering /readyz "shutting down" (nothing to wait when it never began)."""
        if self.began is not None:
            await asyncio.sleep(max(0.0, self.began + seconds - time.monotonic()))

    async def _commit_offsets(self) -> None:
        membership = self.state.membership
        if self.commit is None or membership is None or membership.assigned is None:
            return  # never consumed: nothing acknowledged
        try:
            await asyncio.wait_for(self.commit(), self.budget.reserve_seconds / 2)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            log.warning("shutdown: offset commit cancelled by the consumer's stop")
        except Exception as exc:  # committed again as the consumer stops
            log.warning("shutdown: offset commit failed (%s)", type(exc).__name__)

    def _exit_now(self) -> None:
        log.critical(
            "shutdown: still stopping after %.0f s (MEMPROJ_SHUTDOWN_TIMEOUT_SECONDS): exiting; "
            "what was not acknowledged is redelivered",
            self.budget.total_seconds,
        )
        logging.shutdown()
        os._exit(EXIT_SHUTDOWN_TIMEOUT)
