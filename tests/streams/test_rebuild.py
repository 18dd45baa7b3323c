"""The memory projection's own rebuild path (streams/rebuild.py): parallel readers, records
held in memory, erasures between chunks, against the real Kafka and PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from projections import rebuilds
from projections import shadow as shadows
from projections.memory import store as memory_store
from streams.rebuild import MemoryRebuild
from streams.replay import ReplayStopped, replay_projection
from streams.replay_reading import positions, read, reader
from streams.sample import EventFactory, sample_memory_stream, to_message
from streams.worker import memory_projection
from topics.registry import DELETION_REQUESTS, MEMORY_EVENTS, MEMORY_SEALED

pytestmark = pytest.mark.integration
ALICE = ("user", "alice")


def bookkeeping(env: Any) -> tuple[list[Any], list[Any]]:
    with env.connect() as conn:
        rejections = conn.execute(
            "SELECT tenant_id, event_id, reason FROM rejections WHERE projection = 'memory'"
            " ORDER BY 1, 2, 3"
        ).fetchall()
        processed = conn.execute(
            "SELECT tenant_id, event_id, body_hash FROM processed_events"
            " WHERE projection = 'memory' ORDER BY 1, 2"
        ).fetchall()
    return rejections, processed


def test_two_readers_rebuild_what_the_live_worker_decided_and_swap_it_in(env: Any) -> None:
    env.produce(
        env.topic(MEMORY_EVENTS), [(m.key, m.value) for m in sample_memory_stream(400, 3, 9)]
    )
    env.start("memory")
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    live_rejections, live_processed = bookkeeping(env)
    seen: list[int] = []
    report = asyncio.run(
        replay_projection(
            env.settings,
            memory_projection(env.settings),
            readers=2,
            on_progress=lambda p: seen.append(p.done),
        )
    )
    assert report.events > 0 and report.differences == {}, report.to_json()
    assert report.swapped and seen[-1] == report.events
    # The swapped-in bookkeeping is the live worker's: the same rejections, the same claims.
    assert bookkeeping(env) == (live_rejections, live_processed)
    assert live_rejections  # the sample stream has conflicts and duplicates
    f = EventFactory(id_prefix="after")
    env.produce_events([f.proposed("tenant_0", "after_swap", ALICE)])
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    found = env.run(lambda c: memory_store.load_memory(c, "tenant_0", "after_swap"))
    assert found is not None


def test_an_unknown_schema_version_stops_every_reader(env: Any) -> None:
    f = EventFactory(id_prefix="v")
    env.produce_events([f.proposed(f"t{n}", f"m{n}") for n in range(8)])
    env.start("memory")
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    future = f.verified("t1", "m1", 1)
    future["schema_version"] = 7
    env.produce(env.topic(MEMORY_SEALED), [to_message(future)])
    with pytest.raises(ReplayStopped) as stopped:
        asyncio.run(replay_projection(env.settings, memory_projection(env.settings), readers=2))
    assert "unknown_schema_version" in str(stopped.value)


class ShadowRebuild:
    """A rebuild driven chunk by chunk, as ``replay_projection`` drives it."""

    def __init__(self, env: Any, **state: Any) -> None:
        self.env = env
        self.rebuild = MemoryRebuild(memory_projection(env.settings), **state)
        self.next: dict[tuple[str, int], int] = {}

    async def create(self) -> None:
        settings = self.env.settings
        async with await psycopg.AsyncConnection.connect(settings.postgres_conninfo) as conn:
            self.live = await shadows.current_schema(conn)
            # A schema of the database: a name no other test (in any process) has.
            self.shadow = f"replay_memory_test_{uuid.uuid4().hex[:12]}"
            await shadows.create_shadow(conn, shadows.MEMORY, self.live, self.shadow)
            await rebuilds.register(conn, self.shadow, "memory", "shadow")
            await conn.commit()
        self.dsn = make_conninfo(
            settings.postgres_conninfo, options=f"-csearch_path={self.shadow},{self.live}"
        )

    async def apply_what_is_there(self, chunk: int) -> None:
        """Everything of the sealed log the rebuild has not read yet, ``chunk`` at a time."""
        consumer = reader(self.env.settings)
        try:
            starts, ends = positions(consumer, [self.env.topic(MEMORY_SEALED)], "earliest")
            starts = {p: self.next.get(p, starts[p]) for p in starts}
            async with await psycopg.AsyncConnection.connect(self.dsn) as conn:
                for batch in read(consumer, starts, ends, chunk):
                    await self.rebuild.apply(conn, batch)
            self.next = ends
        finally:
            consumer.close()

    async def differences(self) -> dict[str, Any]:
        async with (
            await psycopg.AsyncConnection.connect(self.env.settings.postgres_conninfo) as live,
            await psycopg.AsyncConnection.connect(self.dsn) as shadow,
        ):
            return shadows.differences(
                await shadows.checksums(live, shadows.MEMORY),
                await shadows.checksums(shadow, shadows.MEMORY),
            )

    def rows(self) -> str:
        with self.env.connect() as conn:
            found = conn.execute(
                f"SELECT string_agg(t, ' ') FROM (SELECT row_to_json(m)::text AS t"
                f" FROM {self.shadow}.memories m UNION ALL SELECT row_to_json(v)::text"
                f" FROM {self.shadow}.memory_versions v) rows"
            ).fetchone()
        return str(found[0] or "")


def test_an_erasure_between_two_chunks_reaches_the_records_the_rebuild_holds(env: Any) -> None:
    f = EventFactory(id_prefix="e", clock=datetime.now(UTC) - timedelta(minutes=5))
    env.produce_events(
        [
            f.proposed("acme", "mem_alice", ALICE, {"text": "ALICE-SECRET value"}),
            f.proposed("acme", "mem_bob", ("user", "bob"), {"text": "BOB-KEEPS value"}),
        ]
    )
    env.start("memory", "deletion")
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    rebuild = ShadowRebuild(env)
    asyncio.run(rebuild.create())
    asyncio.run(rebuild.apply_what_is_there(chunk=1))
    assert "ALICE-SECRET" in rebuild.rows()  # held in memory and in the shadow

    env.produce_events(
        [f.deletion("acme", "d1", {"type": "subject", "id": "alice", "subject_type": "user"})],
        DELETION_REQUESTS,
    )

    def erased() -> bool:
        # Recorded in the transaction that erased the live tables and every rebuild copy.
        with env.connect() as conn:
            return bool(conn.execute("SELECT 1 FROM erased_entities").fetchone())

    env.wait_until(erased, "the erasure to commit")
    assert "ALICE-SECRET" not in rebuild.rows()  # the erasure reached the shadow
    # After the erasure's cut-off: live, the memory is gone (unknown_memory); a rebuild that
    # still applied it to the record it held would bring Alice's memory back.
    f.clock = datetime.now(UTC) + timedelta(minutes=1)
    env.produce_events([f.corrected("acme", "mem_alice", 1, {"text": "ALICE-SECRET after"})])
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    asyncio.run(rebuild.apply_what_is_there(chunk=1))

    assert asyncio.run(rebuild.differences()) == {}
    assert "ALICE-SECRET" not in rebuild.rows() and "alice" not in rebuild.rows()
    assert "BOB-KEEPS" in rebuild.rows()
    assert not rebuild.rebuild.every_key_known  # it read the shadow again


def test_a_rebuild_holding_few_records_reads_the_rest_from_the_shadow(env: Any) -> None:
    env.produce(
        env.topic(MEMORY_EVENTS), [(m.key, m.value) for m in sample_memory_stream(200, 3, 4)]
    )
    env.start("memory")
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    rebuild = ShadowRebuild(env, held_limit=5)
    asyncio.run(rebuild.create())
    asyncio.run(rebuild.apply_what_is_there(chunk=40))
    assert asyncio.run(rebuild.differences()) == {}
    assert not rebuild.rebuild.every_key_known and not rebuild.rebuild.every_claim_held
