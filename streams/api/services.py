"""What the API's routes use, built once at the entry point from Settings and handed to
``create_app``: the PostgreSQL pool, the Redis cache, the vector store and its embedder, the
Kafka producer, the metrics, the rate limits and the clock. ``start``/``aclose`` are the
application's lifespan."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property

from prometheus_client import CollectorRegistry
from psycopg_pool import AsyncConnectionPool

from projections.cache.store import RedisCache, RedisClient
from projections.cache.store import connect as connect_redis
from projections.embeddings.embedder import Embedder
from projections.embeddings.vectors import VectorStore
from projections.migrate import migrate
from projections.sql import Conn
from streams.api.limits import RateLimit
from streams.api.metrics import ApiMetrics
from streams.kafka import DeliveringProducer
from streams.services import build_embedder, make_pool, open_vector_store
from streams.settings import Settings

log = logging.getLogger(__name__)

KAFKA_CHECK_TIMEOUT_SECONDS = 2.0


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class ApiServices:
    settings: Settings
    pool: AsyncConnectionPool[Conn]
    redis: RedisClient
    open_embedder: Callable[[], Embedder]
    metrics: ApiMetrics
    rate_limit: RateLimit
    login_limit: RateLimit  # failed authentications per client address
    open_vectors: Callable[[], VectorStore]
    clock: Callable[[], datetime] = _now
    _producer: DeliveringProducer | None = field(default=None, repr=False)

    @cached_property
    def cache(self) -> RedisCache:
        settings = self.settings
        return RedisCache(self.redis, settings.cache_ttl_seconds, settings.cache_namespace)

    @cached_property
    def embedder(self) -> Embedder:
        """The configured embedder (MEMPROJ_EMBEDDER), loaded at start."""
        return self.open_embedder()

    @cached_property
    def vectors(self) -> VectorStore:
        """Opened on first use: lancedb takes a second to import."""
        return self.open_vectors()

    @property
    def producer(self) -> DeliveringProducer:
        """The producer of proposals and deletion requests (each request awaits its own
        message's delivery), created on first use."""
        if self._producer is None:
            self._producer = DeliveringProducer(
                self.settings.kafka, self.settings.api_delivery_timeout_seconds
            )
        return self._producer

    async def start(self) -> None:
        # Loaded before the first request, not by it (wordllama takes a second).
        await asyncio.to_thread(lambda: self.embedder)
        await self.pool.open(wait=True, timeout=60)
        async with self.pool.connection() as conn:
            applied = await migrate(conn)
        if applied:
            log.info("applied migrations: %s", ", ".join(applied))

    async def aclose(self) -> None:
        await self.pool.close()
        await self.redis.aclose()
        if self._producer is not None:
            self._producer.close()

    async def database_ready(self) -> str | None:
        """None if PostgreSQL answers; else why not (the class of the error only)."""
        try:
            async with self.pool.connection(timeout=KAFKA_CHECK_TIMEOUT_SECONDS) as conn:
                await conn.execute("SELECT 1")
        except Exception as exc:
            return f"unreachable ({type(exc).__name__})"
        return None

    async def kafka_ready(self) -> str | None:
        """None if a broker answers the producer's metadata request; else why not: refused
        (authentication, TLS) or unreachable. Asked of the producer the writes go through,
        so that readiness recovers when Kafka accepts that producer again."""
        producer = self.producer  # made on the event loop: one producer, however many ask
        return await asyncio.to_thread(producer.answer, KAFKA_CHECK_TIMEOUT_SECONDS)


def build_services(settings: Settings, registry: CollectorRegistry | None = None) -> ApiServices:
    """The API's services from settings (nothing is connected until ``start``)."""
    return ApiServices(
        settings=settings,
        pool=make_pool(settings.postgres_conninfo, settings.postgres_pool_size),
        redis=connect_redis(settings.redis_url, settings.redis_cluster),
        open_embedder=lambda: build_embedder(settings),
        metrics=ApiMetrics(registry if registry is not None else CollectorRegistry()),
        rate_limit=RateLimit.of(
            settings.api_rate_limit,
            settings.api_rate_limit_storage,
            settings.redis_url,
            settings.cache_namespace,
            settings.redis_cluster,
        ),
        login_limit=RateLimit.of(
            settings.api_login_rate_limit,
            settings.api_rate_limit_storage,
            settings.redis_url,
            f"{settings.cache_namespace}-login",
            settings.redis_cluster,
        ),
        # The API never writes the store (its volume is mounted read-only): a missing table is
        # refused (a 503), not created.
        open_vectors=lambda: open_vector_store(settings, create=False),
    )
