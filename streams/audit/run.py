"""``memproj audit plaintext``: every source searched for one marker, into one report."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

import psycopg

from projections.cache.store import connect as connect_redis
from projections.deadletters.sealing import LetterSealer
from projections.sealing.keys import KeyStore
from streams.audit.kafka import scan_kafka, topics_to_scan
from streams.audit.openers import OpenerContext
from streams.audit.plaintext import Matcher, Report
from streams.audit.postgres import scan_postgres
from streams.audit.stores import scan_files, scan_redis
from streams.settings import Settings
from topics.registry import ALL_TOPICS, INPUT_TOPICS


class Source(StrEnum):
    POSTGRES = "postgres"
    KAFKA = "kafka"
    REDIS = "redis"
    FILES = "files"


# How long a raw record may wait for the sealer before a trim is due: its lag budget.
SEALER_LAG_BUDGET_MS = 60_000


def raw_windows(settings: Settings) -> dict[str, int | None]:
    """Per raw input topic (base name), how long its records may keep plaintext, in ms: the
    sealer deletes them once sealed (``MEMPROJ_RAW_INPUT_TRIM_SECONDS``), so the window is
    that interval plus the sealer's lag budget; with trimming off, the topic's retention."""
    trim_ms = int(settings.raw_input_trim_seconds * 1000)
    return {
        spec.base_name: trim_ms + SEALER_LAG_BUDGET_MS if trim_ms > 0 else spec.retention_ms
        for spec in INPUT_TOPICS
    }


async def audit_plaintext(
    settings: Settings,
    marker: str,
    *,
    schemas: Sequence[str] = (),
    sources: Sequence[Source] = tuple(Source),
) -> Report:
    """Search every source for ``marker``; ``schemas`` limits PostgreSQL to those named."""
    report = Report(Matcher.of(marker))
    master = settings.worker_master_keys()
    keys = KeyStore(master, settings.key_lookups)
    async with await psycopg.AsyncConnection.connect(settings.postgres_conninfo) as conn:
        # One snapshot for the tables and the data keys the openers use.
        await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        await conn.set_read_only(True)
        async with conn.transaction():
            if Source.POSTGRES in sources:
                await scan_postgres(conn, report.matcher, report, schemas)
            if Source.KAFKA in sources:
                topics = topics_to_scan(settings.topics, ALL_TOPICS, raw_windows(settings))
                context = OpenerContext(conn, keys, LetterSealer(master))
                await scan_kafka(settings.kafka, topics, report.matcher, report, context)
    if Source.REDIS in sources:
        redis = connect_redis(settings.redis_url, settings.redis_cluster)
        try:
            await scan_redis(redis, settings.cache_namespace, report.matcher, report)
        finally:
            await redis.aclose()
    if Source.FILES in sources:
        scan_files(settings.data_dir, report.matcher, report)
    return report
