"""The copies rebuilds leave (a swapped rebuild's retired tables, an unswapped shadow) are
reached by erasures, verification and the ghost audit, and dropped after their grace period,
against the real Kafka and PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from projections import rebuilds
from projections.deletion import audit
from streams.metrics import Metrics
from streams.replay import replay_projection
from streams.sample import EventFactory
from streams.worker import conversation_projection, memory_projection
from support.deletion_scenario import stores_of, wait_indexed
from topics.registry import CONVERSATION_EVENTS, DELETION_REQUESTS, MEMORY_EVENTS

pytestmark = pytest.mark.integration
ALICE, BOB = ("user", "alice"), ("user", "bob")


def rows_with(env: Any, schema: str, marker: str) -> dict[str, int]:
    """Rows of every table of ``schema`` whose text holds ``marker``."""
    found = {}
    with env.connect() as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (schema,),
        ).fetchall()
        for (table,) in tables:
            row = conn.execute(
                f'SELECT count(*) FROM "{schema}"."{table}" t WHERE strpos(t::text, %s) > 0',
                (marker,),
            ).fetchone()
            if row and row[0]:
                found[table] = int(row[0])
    return found


def test_an_erasure_reaches_retired_and_shadow_copies_and_they_expire(env: Any) -> None:
    f = EventFactory(id_prefix="rb", clock=datetime.now(UTC) - timedelta(minutes=5))
    env.produce_events(
        [
            f.started("acme", "c_alice", ALICE),
            f.message("acme", "c_alice", "m1", "user", "ALICE-SECRET message"),
            f.summary("acme", "c_alice", 1, "ALICE-SECRET summary", ["m1"]),
            f.started("acme", "c_bob", BOB),
            f.message("acme", "c_bob", "m1", "user", "BOB-KEEPS message"),
        ],
        CONVERSATION_EVENTS,
    )
    env.produce_events(
        [
            f.proposed("acme", "mem_alice", ALICE, {"text": "ALICE-SECRET value"}),
            f.proposed("acme", "mem_bob", BOB, {"text": "BOB-KEEPS value"}),
        ]
    )
    env.start("memory", "conversation", "deletion", "embeddings", "summaries", "cache", "context")
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")
    wait_indexed(env, "acme", 4)  # two memories, two messages

    swapped = asyncio.run(replay_projection(env.settings, memory_projection(env.settings)))
    unswapped = asyncio.run(
        replay_projection(
            env.settings,
            conversation_projection(env.settings, Metrics(CollectorRegistry())),
            swap="never",
        )
    )
    assert swapped.swapped and swapped.retired and not unswapped.swapped
    copies = {swapped.retired, unswapped.shadow}
    assert {s.name for s in env.run(rebuilds.registered)} == copies
    assert all(rows_with(env, schema, "ALICE-SECRET") for schema in copies)

    env.produce_events(
        [f.deletion("acme", "d1", {"type": "subject", "id": "alice", "subject_type": "user"})],
        DELETION_REQUESTS,
    )

    def verified() -> tuple[bool, Any] | None:
        with env.connect() as conn:
            row = conn.execute("SELECT verified_at, verification FROM deletion_requests").fetchone()
        return (True, row[1]) if row and row[0] else None

    _, verification = env.wait_until(verified, "the erasure to be verified")
    assert verification["clean"], verification
    assert verification["found"]["rebuild_copies"] == []

    for schema in copies:
        assert rows_with(env, schema, "ALICE-SECRET") == {}, schema
    assert rows_with(env, unswapped.shadow, "BOB-KEEPS")
    assert rows_with(env, swapped.retired, "BOB-KEEPS")
    assert env.run(rebuilds.covered_copies) == []
    audited = env.run(lambda conn: audit.audit_ghosts(conn, stores_of(env), datetime.now(UTC)))
    assert audited[audit.REBUILDS].ghosts == []

    async def expire(conn: Any) -> tuple[list[str], list[str]]:
        now = datetime.now(UTC)
        kept = await rebuilds.drop_expired(conn, now, timedelta(hours=1))
        dropped = await rebuilds.drop_expired(conn, now + timedelta(hours=2), timedelta(hours=1))
        await conn.commit()
        return kept, dropped

    kept, dropped = env.run(expire)
    assert kept == [] and set(dropped) == copies
    assert env.run(rebuilds.registered) == []


def test_a_covered_row_left_in_a_copy_is_a_ghost_of_the_audit(env: Any) -> None:
    """A copy written outside memproj's erasure (restored from a dump, say) is still found."""
    with env.connect() as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "retired_{env.schema}"')
        conn.execute(
            f'CREATE TABLE "retired_{env.schema}".memories'
            f' (LIKE "{env.schema}".memories INCLUDING ALL)'
        )
        conn.execute(
            f'INSERT INTO "retired_{env.schema}".memories (tenant_id, memory_id, subject_type,'
            " subject_id, scope, kind, value, source_type, source_ref, status, version,"
            " observed_at, created_at, updated_at, last_event_id)"
            " VALUES ('acme', 'm1', 'user', 'alice', 'user', 'note', '{}', 'message', 'x', "
            " 'proposed', 1, now() - interval '1 hour', now() - interval '1 hour',"
            " now() - interval '1 hour', 'e1')"
        )
        conn.execute(
            "INSERT INTO erased_entities (tenant_id, entity_type, subject_type, entity_id,"
            " cut_off, deletion_id) VALUES ('acme', 'subject', 'user', 'alice', now(), 'd1')"
        )
        conn.commit()
    env.run(lambda conn: _register(conn, f"retired_{env.schema}"))
    assert env.run(rebuilds.covered_copies) == [f"retired_{env.schema}.memories: 1"]


async def _register(conn: Any, schema: str) -> None:
    await rebuilds.register(conn, schema, "memory", "retired")
    await conn.commit()
