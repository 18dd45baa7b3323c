"""Retention end to end: a conversation past its period is erased everywhere through the
ledger while the memories taken from it stay; an expired memory goes after its grace; a held
subject stays until its release; two schedulers never issue the same erasure twice."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from projections.retention import classes
from projections.sql import KeyLookups
from streams.cli import cli
from streams.metrics import Metrics
from streams.retention import RetentionScheduler, RetentionSettings
from streams.services import make_pool
from support.deletion_scenario import audit, recent_factory, wait_verified
from support.environment import settings_environment
from topics.registry import CONVERSATION_EVENTS, MEMORY_EVENTS

pytestmark = pytest.mark.integration

ALL_KINDS = ("memory", "conversation", "deletion", "embeddings", "summaries", "cache", "context")
MARKER = "quokkazebra"
CAROL = ("user", "carol")
DAN = ("user", "dan")
FAST = {"retention_check_seconds": 0.5, "expiry_grace_seconds": 1.0}


def invoke(env: Any, *args: str) -> str:
    result = CliRunner().invoke(cli, list(args), env=settings_environment(env.settings))
    assert result.exit_code == 0, result.output
    return result.output


def issued(env: Any, target_id: str) -> str | None:
    with env.connect() as conn:
        row = conn.execute(
            "SELECT deletion_id FROM retention_issued WHERE target_id = %s", (target_id,)
        ).fetchone()
    return None if row is None else str(row[0])


def seed(env: Any) -> None:
    f = recent_factory()
    env.produce_events(
        [
            f.started("acme", "c_carol", CAROL, retention_class="support_short"),
            f.message("acme", "c_carol", "m1", "user", f"my locker code is {MARKER} 4471"),
            f.started("acme", "c_dan", DAN, retention_class="support_short"),
            f.message("acme", "c_dan", "m1", "user", "dan prefers email"),
        ],
        CONVERSATION_EVENTS,
    )
    env.produce_events(
        [
            f.proposed(
                "acme",
                "mem_carol",
                CAROL,
                {"text": "has a locker"},
                source=("message", "c_carol/m1"),
            ),
            f.proposed(
                "acme",
                "mem_expiring",
                CAROL,
                {"text": "on holiday this week"},
                source=("crm", "note/1"),
                expires_at=datetime.now(UTC) - timedelta(minutes=1),
            ),
        ],
        MEMORY_EVENTS,
    )


def test_retention_erases_content_keeps_memories_expires_and_respects_holds(env: Any) -> None:
    seed(env)
    env.start(*ALL_KINDS, **FAST)
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    held = invoke(
        env, "hold", "add", "--tenant", "acme", "--subject", "user:dan", "--reason", "case 7"
    )
    hold_id = held.split("legal hold ")[1].split(" ")[0]
    invoke(
        env, "retention", "set", "--tenant", "acme", "--class", "support_short", "--period", "2s"
    )

    carol = env.wait_until(lambda: issued(env, "c_carol"), "the retention erasure of c_carol")
    found = wait_verified(env, "acme", carol)
    assert found["status"] == "completed" and found["verification"]["clean"], found
    expired = env.wait_until(lambda: issued(env, "mem_expiring"), "the expiry erasure")
    assert wait_verified(env, "acme", expired)["status"] == "completed"
    with env.connect() as conn:
        assert conn.execute(
            "SELECT count(*) FROM conversation_messages WHERE conversation_id = 'c_carol'"
        ).fetchone() == (0,)
        # The memory taken from the conversation keeps its own lifecycle.
        assert (
            conn.execute("SELECT status FROM memories WHERE memory_id = 'mem_carol'").fetchone()
            is not None
        )
        assert conn.execute(
            "SELECT count(*) FROM memories WHERE memory_id = 'mem_expiring'"
        ).fetchone() == (0,)
        reason = conn.execute(
            "SELECT reason FROM deletion_requests WHERE deletion_id = %s", (carol,)
        ).fetchone()
        assert reason == ("retention",)
        # Held: not issued.
        assert issued(env, "c_dan") is None
        assert conn.execute(
            "SELECT count(*) FROM conversation_messages WHERE conversation_id = 'c_dan'"
        ).fetchone() == (1,)

    def nowhere() -> dict[str, Any] | None:
        _, report = audit(env, MARKER)
        outside = [f for f in report["findings"] if not f.get("within_window")]
        return report if not outside else None

    env.wait_until(nowhere, "the marker to be readable nowhere", seconds=120)

    # The memory's value still opens on the sealed log (under its conversation's source key,
    # which a content erasure leaves): a rebuild keeps it.
    status, kept = audit(env, "has a locker")
    assert status == 1 and any(
        f["kind"] == "topic" and f["name"].endswith("memory.events.sealed")
        for f in kept["findings"]
    ), kept

    report = invoke(env, "retention", "report", "--tenant", "acme")
    lines = report.splitlines()
    assert any(line.startswith("acme\tsupport_short\t2s\t") for line in lines), report
    assert any(line.startswith("acme\texpired memories\texpiry+grace\t") for line in lines)

    invoke(env, "hold", "release", "--tenant", "acme", "--hold", hold_id)
    dan = env.wait_until(lambda: issued(env, "c_dan"), "the erasure of c_dan after the release")
    assert wait_verified(env, "acme", dan)["status"] == "completed"


def test_two_schedulers_issue_each_erasure_once(env: Any) -> None:
    f = recent_factory()
    env.produce_events(
        [f.started("acme", f"c{i}", CAROL, retention_class="short") for i in range(20)],
        CONVERSATION_EVENTS,
    )
    env.start("conversation")
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")

    class Published:
        def __init__(self) -> None:
            self.messages: list[Any] = []

        async def publish(self, messages: list[Any]) -> None:
            self.messages += messages

    async def run() -> tuple[int, int, set[bytes]]:
        pool = make_pool(env.settings.postgres_dsn, 4)
        await pool.open()
        try:
            async with pool.connection() as conn:
                await classes.set_class(
                    conn, "acme", "short", timedelta(seconds=1), datetime.now(UTC), "test"
                )
                await conn.commit()
            settings = RetentionSettings(timedelta(seconds=1), None, timedelta(0), 500)
            sinks = [Published(), Published()]
            schedulers = [
                RetentionScheduler(
                    pool,
                    sink,  # type: ignore[arg-type]
                    env.settings.topics,
                    Metrics(CollectorRegistry()),
                    settings,
                    lookups=KeyLookups(),
                )
                for sink in sinks
            ]
            for _ in range(3):
                await asyncio.gather(*(s.issue_due() for s in schedulers))
            keys = [m.key for sink in sinks for m in sink.messages]
            return len(keys), len(set(keys)), {m.value for sink in sinks for m in sink.messages}
        finally:
            await pool.close()

    published, distinct, _ = asyncio.run(run())
    assert published == distinct == 20
