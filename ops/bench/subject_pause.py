"""What asking PostgreSQL whether a subject is paused costs a read.

    .venv/bin/python ops/bench/subject_pause.py [--paused 10000] [--memories 20] [--rounds 2000]

Against the local stack (``ops/stack up``; PostgreSQL and Redis, no Kafka), in a schema of its
own: ``--paused`` paused subjects in ``subject_pauses``, one unpaused subject with
``--memories`` memories. Reported, as median and p99 microseconds over ``--rounds`` calls:

- ``check``: ``pauses.check_serving`` alone (one primary-key lookup);
- ``recall_cached`` and ``recall_cached_unchecked``: ``streams.reads.recall`` answered from
  the cache (the commonest read, and the cheapest, so where the check weighs most), with the
  check and with it replaced by a no-op, alternated call by call so that the shared machine's
  drift falls on both;
- ``recall_uncached``: the same recall with the cache emptied before each call (the
  projection's query and the cache fill).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from unittest import mock

import psycopg
from environment import drop, isolated, percentile, prepare

from projections.access import pauses
from projections.cache.store import RedisCache
from projections.cache.store import connect as connect_redis
from projections.memory.store import RecallQuery
from projections.sql import Conn
from streams import reads
from streams.settings import Settings

TENANT = "acme"
SUBJECT = ("user", "alice")


async def seed(conn: Any, paused: int, memories: int, now: datetime) -> None:
    async with conn.cursor() as cursor:
        await cursor.executemany(
            "INSERT INTO subject_pauses (tenant_id, subject_type, subject_id, paused_at,"
            " paused_by) VALUES (%s, 'user', %s, %s, 'bench')",
            [(TENANT, f"u{n}", now) for n in range(paused)],
        )
        await cursor.executemany(
            "INSERT INTO memories (tenant_id, memory_id, subject_type, subject_id, scope, kind,"
            " value, source_type, source_ref, status, version, observed_at, created_at,"
            " updated_at, last_event_id) VALUES (%s, %s, %s, %s, 'user', 'preference',"
            " %s, 'message', 'c/m', 'proposed', 1, %s, %s, %s, %s)",
            [
                (TENANT, f"m{n}", *SUBJECT, json.dumps({"text": f"memory {n}"}), now, now, now, "e")
                for n in range(memories)
            ],
        )
    await conn.commit()


async def timed(rounds: int, call: Callable[[], Awaitable[Any]]) -> list[float]:
    spent = []
    for _ in range(rounds):
        started = time.perf_counter()
        await call()
        spent.append((time.perf_counter() - started) * 1e6)
    return spent


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median_us": round(statistics.median(values), 1),
        "p99_us": round(percentile(values, 0.99), 1),
    }


async def measure(settings: Settings, paused: int, memories: int, rounds: int) -> dict[str, Any]:
    now = datetime.now(UTC)
    query = RecallQuery(
        TENANT, SUBJECT[0], SUBJECT[1], None, None, ("verified", "proposed"), None, 50
    )
    redis = connect_redis(settings.redis_url)
    cache = RedisCache(redis, 300, f"bench-pause-{uuid.uuid4().hex[:6]}")

    async def unchecked(conn: Conn, tenant_id: str, subject_type: str, subject_id: str) -> None:
        return None

    try:
        async with await psycopg.AsyncConnection.connect(settings.postgres_conninfo) as conn:
            await seed(conn, paused, memories, now)
            check = await timed(rounds, lambda: pauses.check_serving(conn, TENANT, *SUBJECT))
            await conn.rollback()
            await reads.recall(conn, cache, query, now)  # fills the cache
            with_check: list[float] = []
            without: list[float] = []
            for _ in range(rounds):
                with_check += await timed(1, lambda: reads.recall(conn, cache, query, now))
                with mock.patch.object(reads, "check_serving", unchecked):
                    without += await timed(1, lambda: reads.recall(conn, cache, query, now))

            async def uncached() -> None:
                await cache.invalidate(TENANT, subject=SUBJECT)
                await reads.recall(conn, cache, query, now)

            cold = await timed(max(1, rounds // 4), uncached)
    finally:
        await redis.aclose()
    return {
        "paused_subjects": paused,
        "memories": memories,
        "rounds": rounds,
        "check": summary(check),
        "recall_cached": summary(with_check),
        "recall_cached_unchecked": summary(without),
        "recall_uncached": summary(cold),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paused", type=int, default=10_000)
    parser.add_argument("--memories", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    base = Settings()
    environment = isolated(base, f"pause{uuid.uuid4().hex[:6]}", "")
    prepare(base, environment, specs=())
    try:
        result = asyncio.run(measure(environment.settings, args.paused, args.memories, args.rounds))
    finally:
        drop(base, [environment], [])
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
