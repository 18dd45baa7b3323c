"""Long-lived resources of a worker as mode services, started before the Faust app and
stopped after it: the PostgreSQL pool, the Kafka publisher and the /metrics endpoint."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from mode import Service
from prometheus_client import start_http_server
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from projections.bookkeeping import Conn
from projections.cache.store import RedisCache
from projections.cache.store import connect as connect_redis
from projections.embeddings.vectors import VectorStore
from projections.migrate import migrate
from projections.sealing.crypto import parse_master_key
from projections.sealing.probes import ProbeSealer
from streams.kafka import KafkaPublisher
from streams.metrics import Metrics
from streams.runner import ProjectionRunner
from streams.settings import Settings

log = logging.getLogger(__name__)


def open_vector_store(settings: Settings, table: str = "embeddings") -> VectorStore:
    # lancedb takes about a second to import: only the commands that open the store pay it.
    from projections.embeddings.lance import LanceVectorStore

    return LanceVectorStore(settings.vector_store_path, settings.embedding_dim, table=table)


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
    def redis(self) -> Redis:
        return connect_redis(self._settings.redis_url)

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
        return ProbeSealer(parse_master_key(self._settings.master_key))

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


class MetricsService(Service):
    """Serves the injected registry on /metrics and refreshes gauges that age with time."""

    def __init__(self, metrics: Metrics, host: str, port: int, **kwargs: Any) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self._server: Any = None
        super().__init__(**kwargs)

    async def on_start(self) -> None:
        if self.port:
            self._server, _thread = start_http_server(
                self.port, addr=self.host, registry=self.metrics.registry
            )
            log.info("metrics on http://%s:%d/metrics", self.host, self.port)

    async def on_stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()

    @Service.timer(2.0)
    async def _refresh(self) -> None:
        self.metrics.update_staleness(datetime.now(UTC))
