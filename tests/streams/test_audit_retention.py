"""The API's read audit is trimmed past its retention by the deletion worker's maintenance."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry

from projections.access import audit
from projections.access.policy import allowed
from projections.sql import KeyLookups
from streams.kafka import KafkaPublisher
from streams.maintenance import LedgerMaintenance
from streams.metrics import Metrics
from streams.services import make_pool
from support.environment import Env

pytestmark = pytest.mark.integration


def test_rows_past_the_retention_are_trimmed(env: Env) -> None:
    now = datetime.now(UTC)
    retention = timedelta(days=30)

    async def run() -> list[str]:
        pool = make_pool(env.settings.postgres_dsn, 2)
        await pool.open()
        try:
            async with pool.connection() as conn:
                for age, key_id in ((timedelta(days=31), "old"), (timedelta(days=29), "new")):
                    entry = audit.AuditEntry(
                        now - age, key_id, "acme", "agent:a", "p", "/v1/x", "user:u", allowed([])
                    )
                    await audit.record(conn, entry)
                await conn.commit()

            def maintenance(kept: timedelta | None) -> LedgerMaintenance:
                return LedgerMaintenance(
                    pool,
                    KafkaPublisher(env.settings.kafka),
                    [],
                    env.settings.topics,
                    Metrics(CollectorRegistry()),
                    timedelta(seconds=1),
                    timedelta(seconds=1),
                    timedelta(days=7),
                    clock=lambda: now,
                    audit_retention=kept,
                    lookups=KeyLookups(),
                )

            assert await maintenance(None).trim_read_audit() == 0  # kept forever
            assert await maintenance(retention).trim_read_audit() == 1
            async with pool.connection() as conn:
                cursor = await conn.execute("SELECT key_id FROM api_read_audit")
                return [row[0] for row in await cursor.fetchall()]
        finally:
            await pool.close()

    assert asyncio.run(run()) == ["new"]
    assert (
        env.settings.model_copy(update={"api_audit_retention_seconds": 0}).api_audit_retention
        is None
    )
