"""Rebuilds from topic offsets, offsets administration, and crypto-shredding, against the
real Kafka and PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import psycopg
import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from projections.deletion import guard as erasure_guard
from projections.memory import store as memory_store
from projections.memory.projection import MemoryProjection
from projections.memory.reducer import BatchResult
from projections.memory.store import RecallQuery
from projections.sealing.crypto import Unreadable, parse_master_key
from projections.sealing.fields import Shredded, sealing_keys, unseal
from projections.sealing.keys import KeyStore
from projections.sql import KeyLookups
from streams.cli import cli
from streams.metrics import Metrics
from streams.replay import ReplayStopped, replay_projection
from streams.replay_embeddings import replay_embeddings
from streams.sample import (
    EventFactory,
    sample_conversation_stream,
    sample_memory_stream,
    to_message,
)
from streams.worker import conversation_projection, memory_projection
from topics.registry import (
    CONVERSATION_EVENTS,
    CONVERSATION_SEALED,
    DELETION_REQUESTS,
    MEMORY_EVENTS,
    MEMORY_SEALED,
)
from topics.schemas import default_schemas

pytestmark = pytest.mark.integration
ALICE = ("user", "alice")


def mixed_stream(env: Any) -> None:
    env.produce(
        env.topic(MEMORY_EVENTS), [(m.key, m.value) for m in sample_memory_stream(400, 3, 9)]
    )
    env.produce(
        env.topic(CONVERSATION_EVENTS),
        [(m.key, m.value) for m in sample_conversation_stream(40, 3, 9)],
    )


def caught_up(env: Any) -> None:
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")


def test_a_rebuild_from_earliest_matches_live_and_swaps_in(env: Any) -> None:
    mixed_stream(env)
    env.start("memory", "conversation")
    caught_up(env)
    memory = asyncio.run(replay_projection(env.settings, memory_projection(env.settings)))
    conversation = asyncio.run(
        replay_projection(
            env.settings, conversation_projection(env.settings, Metrics(CollectorRegistry()))
        )
    )
    for report in (memory, conversation):
        assert report.events > 0 and report.differences == {}, report.to_json()
        assert report.swapped and report.retired is not None
    # The live workers carry on, on the swapped-in tables.
    f = EventFactory(id_prefix="after")
    env.produce_events([f.proposed("tenant_0", "after_swap", ALICE)])
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    found = env.run(lambda c: memory_store.load_memory(c, "tenant_0", "after_swap"))
    assert found is not None


class ChangedReducer(MemoryProjection):
    """A "bug fix" in the reducer: every kind is now stored in upper case."""

    def reduce(self, events: Any, state: Any, seen: Any) -> BatchResult:
        result = super().reduce(events, state, seen)
        result.records = {
            key: record.model_copy(update={"kind": record.kind.upper()})
            for key, record in result.records.items()
        }
        return result


def test_a_rebuild_after_a_reducer_change_reports_differences_and_swaps_only_on_request(
    env: Any,
) -> None:
    mixed_stream(env)
    env.start("memory")
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    changed = ChangedReducer(
        default_schemas(),
        env.settings.topics,
        env.settings.max_memory_value_bytes,
        timedelta(hours=1),
        KeyStore(parse_master_key(env.settings.master_key), KeyLookups()),
    )
    report = asyncio.run(replay_projection(env.settings, changed))
    assert set(report.differences) == {"tenant_0", "tenant_1", "tenant_2"}
    assert not report.swapped
    with env.connect() as conn:
        kinds = {row[0] for row in conn.execute("SELECT DISTINCT kind FROM memories")}
    assert kinds == {"preference", "fact", "profile", "goal"}  # live untouched

    forced = asyncio.run(replay_projection(env.settings, changed, swap="always"))
    assert forced.swapped
    with env.connect() as conn:
        kinds = {row[0] for row in conn.execute("SELECT DISTINCT kind FROM memories")}
    assert kinds == {"PREFERENCE", "FACT", "PROFILE", "GOAL"}


def test_live_recall_keeps_answering_during_a_rebuild(env: Any) -> None:
    env.produce(
        env.topic(MEMORY_EVENTS), [(m.key, m.value) for m in sample_memory_stream(3000, 3, 4)]
    )
    env.start("memory")
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    answers: list[int] = []
    failures: list[BaseException] = []
    done = threading.Event()

    def keep_recalling() -> None:
        async def recall() -> int:
            async with await psycopg.AsyncConnection.connect(env.settings.postgres_dsn) as conn:
                query = RecallQuery("tenant_0", "user", "user_1")
                return len(await memory_store.recall(conn, query, datetime.now(UTC)))

        while not done.is_set():
            try:
                answers.append(asyncio.run(recall()))
            except BaseException as exc:  # any failure of a live read fails the test
                failures.append(exc)

    reader = threading.Thread(target=keep_recalling)
    reader.start()
    try:
        report = asyncio.run(replay_projection(env.settings, memory_projection(env.settings)))
    finally:
        done.set()
        reader.join(30)
    assert not failures, failures[:3]
    assert len(answers) >= 5 and all(count > 0 for count in answers)
    assert report.swapped and report.differences == {}


def test_after_an_erasure_nothing_of_the_subject_survives_a_replay_or_the_sealed_log(
    env: Any,
) -> None:
    f = EventFactory(id_prefix="s", clock=datetime.now(UTC) - timedelta(minutes=5))
    env.produce_events(
        [
            f.started("acme", "c_alice", ALICE),
            f.message("acme", "c_alice", "m1", "user", "ALICE-SECRET: my diagnosis is X"),
            f.summary("acme", "c_alice", 1, "ALICE-SECRET summary", ["m1"]),
            f.started("acme", "c_bob", ("user", "bob")),
            f.message("acme", "c_bob", "m1", "user", "BOB-KEEPS this"),
        ],
        CONVERSATION_EVENTS,
    )
    env.produce_events(
        [
            f.proposed("acme", "mem_alice", ALICE, {"text": "ALICE-SECRET value"}),
            f.corrected("acme", "mem_alice", 1, {"text": "ALICE-SECRET corrected"}),
            f.proposed("acme", "mem_bob", ("user", "bob"), {"text": "BOB-KEEPS value"}),
        ]
    )
    env.start("memory", "conversation", "deletion", "embeddings", "summaries", "cache", "context")
    caught_up(env)
    # A late event about Alice: it happened before the erasure, and arrives after it.
    late = f.corrected("acme", "mem_alice", 2, {"text": "ALICE-SECRET late"})
    env.produce_events(
        [f.deletion("acme", "d1", {"type": "subject", "id": "alice", "subject_type": "user"})],
        DELETION_REQUESTS,
    )

    def verified() -> bool:
        with env.connect() as conn:
            row = conn.execute("SELECT verified_at FROM deletion_requests").fetchone()
        return bool(row and row[0])

    env.wait_until(verified, "the erasure to complete")
    env.produce_events([late])
    caught_up(env)

    reports = [
        asyncio.run(replay_projection(env.settings, memory_projection(env.settings))),
        asyncio.run(
            replay_projection(
                env.settings, conversation_projection(env.settings, Metrics(CollectorRegistry()))
            )
        ),
    ]
    for report in reports:
        assert report.differences == {} and report.swapped, report.to_json()
    env.workers[[w.kind for w in env.workers].index("embeddings")].stop()
    vectors = asyncio.run(replay_embeddings(env.settings))
    assert vectors.differences == {} and vectors.swapped

    with env.connect() as conn:
        everything = conn.execute(
            "SELECT string_agg(t::text, ' ') FROM ("
            " SELECT row_to_json(m)::text AS t FROM memories m UNION ALL"
            " SELECT row_to_json(v)::text FROM memory_versions v UNION ALL"
            " SELECT row_to_json(c)::text FROM conversation_messages c UNION ALL"
            " SELECT row_to_json(s)::text FROM conversation_summaries s UNION ALL"
            " SELECT row_to_json(x)::text FROM conversation_context x) rows"
        ).fetchone()[0]
    assert "ALICE-SECRET" not in everything and "alice" not in everything
    assert "BOB-KEEPS" in everything

    # The sealed log, read with a plain consumer: nothing of Alice opens, Bob's still does.
    keys = KeyStore(parse_master_key(env.settings.master_key), KeyLookups())

    async def all_keys() -> dict[Any, bytes]:
        async with await psycopg.AsyncConnection.connect(env.settings.postgres_dsn) as conn:
            refs: list[Any] = []
            for spec in (MEMORY_SEALED, CONVERSATION_SEALED):
                for _, raw in env.read(spec):
                    if raw:
                        refs.extend(sealing_keys(raw))
            return await keys.keys(conn, refs)

    available = asyncio.run(all_keys())
    opened, unreadable = [], 0
    for spec in (MEMORY_SEALED, CONVERSATION_SEALED):
        for _, raw in env.read(spec):
            assert b"ALICE-SECRET" not in orjson.dumps(raw)
            if not sealing_keys(raw):
                continue
            try:
                opened.append(orjson.dumps(unseal(raw, available.get)))
            except (Shredded, Unreadable):
                unreadable += 1
    # Alice's proposal, correction and late correction, her message and her summary.
    assert unreadable == 5
    assert not any(b"ALICE-SECRET" in text for text in opened)
    assert any(b"BOB-KEEPS" in text for text in opened)


def test_offsets_reset_refuses_while_the_group_is_active(env: Any) -> None:
    mixed_stream(env)
    # The memory group reads the raw topic: kept whole here, so that its earliest
    # offsets are 0.
    worker = env.worker("memory", raw_input_trim_seconds=0)
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    environment = env.settings.as_environment()
    runner = CliRunner()
    refused = runner.invoke(
        cli, ["offsets", "reset", "memory", "--to", "earliest"], env=environment
    )
    assert refused.exit_code != 0
    assert (
        "active members" in refused.output
        and "stop every `memproj worker memory`" in refused.output
    )

    shown = runner.invoke(cli, ["offsets", "show", "memory", "--json"], env=environment)
    before = orjson.loads(shown.output)
    assert before["active_members"] and all(p["lag_messages"] == 0 for p in before["partitions"])

    worker.stop()

    def empty() -> bool:
        result = runner.invoke(cli, ["offsets", "show", "memory", "--json"], env=environment)
        return result.exit_code == 0 and not orjson.loads(result.output)["active_members"]

    env.wait_until(empty, "the group to have no members")
    reset = runner.invoke(
        cli, ["offsets", "reset", "memory", "--to", "earliest", "--json"], env=environment
    )
    assert reset.exit_code == 0, reset.output
    assert all(row["offset"] == 0 for row in orjson.loads(reset.output)["reset"])
    after = orjson.loads(
        runner.invoke(cli, ["offsets", "show", "memory", "--json"], env=environment).output
    )
    assert sum(p["lag_messages"] for p in after["partitions"]) > 0


def test_an_unknown_schema_version_stops_the_replay_with_an_actionable_error(env: Any) -> None:
    f = EventFactory(id_prefix="v")
    env.produce_events([f.proposed("t1", "m1")])
    env.start("memory")
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    # A newer memproj wrote version 7 to the sealed log; this one does not know it.
    future = f.verified("t1", "m1", 1)
    future["schema_version"] = 7
    env.produce(env.topic(MEMORY_SEALED), [to_message(future)])
    with pytest.raises(ReplayStopped) as stopped:
        asyncio.run(replay_projection(env.settings, memory_projection(env.settings)))
    assert "unknown_schema_version" in str(stopped.value)
    assert "upgrade memproj" in str(stopped.value)


def test_a_swap_holding_the_erasures_lock_makes_an_erasure_wait(env: Any) -> None:
    """The swap sweeps erased rows and swaps in one window no erasure can enter: an erasure
    that starts meanwhile waits, and one that is under way makes the swap wait."""

    # Tenant locks are the database's, not the test schema's: tenants of this test's own, which
    # no other test's workers (in the session's other process) lock meanwhile.
    tenant, other = (f"{name}-{uuid.uuid4().hex[:8]}" for name in ("acme", "other"))

    async def scenario() -> tuple[bool, bool]:
        dsn = env.settings.postgres_dsn
        async with (
            await psycopg.AsyncConnection.connect(dsn) as swap,
            await psycopg.AsyncConnection.connect(dsn) as erasure,
        ):
            await erasure.execute("SET lock_timeout = '200ms'")
            async with swap.transaction():
                await erasure_guard.hold_erasures(swap)
                try:
                    async with erasure.transaction():
                        await erasure_guard.lock_tenants(erasure, [tenant], exclusive=True)
                    erased_during_swap = True
                except psycopg.errors.LockNotAvailable:
                    erased_during_swap = False
            # The erasures lock is the database's: this erasure waits as long as another
            # test's swap (in the session's other process) holds it.
            await erasure.execute("SET lock_timeout = 0")
            async with erasure.transaction():
                await erasure_guard.lock_tenants(erasure, [tenant], exclusive=True)
                # Projections take tenant locks shared: they never wait on a swap.
                await swap.execute("SET lock_timeout = '200ms'")
                async with swap.transaction():
                    await erasure_guard.lock_tenants(swap, [other], exclusive=False)
                try:
                    async with swap.transaction():
                        await erasure_guard.hold_erasures(swap)
                    swapped_during_erasure = True
                except psycopg.errors.LockNotAvailable:
                    swapped_during_erasure = False
            return erased_during_swap, swapped_during_erasure

    assert asyncio.run(scenario()) == (False, False)


def test_a_conversation_with_new_data_after_its_erasure_still_rebuilds(env: Any) -> None:
    """After the erasure, a conversation id gets a new data key for its new data. What was
    sealed under the destroyed key, on the sealed log and on conversation.messages, is
    shredded, not unreadable: rebuilds skip it instead of stopping on it."""
    before = EventFactory(id_prefix="old", clock=datetime.now(UTC) - timedelta(minutes=5))
    env.produce_events(
        [
            before.started("acme", "c1", ALICE),
            before.message("acme", "c1", "m1", "user", "ALICE-SECRET before"),
        ],
        CONVERSATION_EVENTS,
    )
    env.start("conversation", "deletion", "embeddings")
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")
    env.produce_events(
        [before.deletion("acme", "d1", {"type": "conversation", "id": "c1"})], DELETION_REQUESTS
    )

    def erased() -> bool:
        with env.connect() as conn:
            return bool(conn.execute("SELECT 1 FROM shredded_keys").fetchone())

    env.wait_until(erased, "the conversation's key to be shredded")
    after = EventFactory(id_prefix="new", clock=datetime.now(UTC) + timedelta(seconds=1))
    env.produce_events(
        [
            after.started("acme", "c1", ALICE),
            after.message("acme", "c1", "m2", "user", "new data after the erasure"),
        ],
        CONVERSATION_EVENTS,
    )
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")

    rebuilt = asyncio.run(
        replay_projection(
            env.settings,
            conversation_projection(env.settings, Metrics(CollectorRegistry())),
            swap="never",
        )
    )
    assert rebuilt.differences == {}, rebuilt.to_json()
    vectors = asyncio.run(replay_embeddings(env.settings, swap="never"))
    assert vectors.events >= 2 and not vectors.swapped


def test_a_second_swapped_rebuild_keeps_what_the_live_workers_applied_during_it(
    env: Any,
) -> None:
    """Two swapped rebuilds of each projection, the second with live traffic (revocations
    included) applied while it reads: afterwards each projection equals a projection of
    every event. The first swap must leave no tracking row that the second swap's catch-up
    would take for the live worker's progress."""
    f = EventFactory(id_prefix="swaps")
    memory_topic, conversation_topic = env.topic(MEMORY_EVENTS), env.topic(CONVERSATION_EVENTS)
    mixed_stream(env)
    env.start("memory", "conversation")
    caught_up(env)
    environment = env.settings.as_environment()
    for kind in ("memory", "conversation"):
        first = CliRunner().invoke(cli, ["replay", kind, "--swap", "--json"], env=environment)
        assert first.exit_code == 0 and orjson.loads(first.output)["swapped"], first.output

    # Applied live between the two rebuilds: in the second one's read.
    env.produce(
        memory_topic,
        [to_message(f.proposed("tenant_0", f"between_{n}", ALICE)) for n in range(3)],
    )
    env.produce(
        conversation_topic,
        [
            to_message(f.started("tenant_0", "c_between", ALICE)),
            to_message(f.message("tenant_0", "c_between", "m1", "user", "before the rebuild")),
        ],
    )
    caught_up(env)

    # Applied live while the second rebuild reads: after its end offsets, before its swap.
    during = {
        "memory": (
            memory_topic,
            MEMORY_EVENTS,
            [
                f.revoked("tenant_0", "between_0", "the user withdrew it"),
                f.verified("tenant_0", "between_1", 1),
                f.proposed("tenant_1", "during_0", ALICE),
                f.revoked("tenant_1", "during_0", "proposed and withdrawn"),
                f.proposed("tenant_2", "during_1", ALICE),
            ],
        ),
        "conversation": (
            conversation_topic,
            CONVERSATION_EVENTS,
            [
                f.message("tenant_0", "c_between", "m2", "assistant", "during the rebuild"),
                f.started("tenant_1", "c_during", ALICE),
                f.message("tenant_1", "c_during", "m1", "user", "also during it"),
            ],
        ),
    }

    def second_swap(projection: Any) -> None:
        topic, spec, events = during[projection.name]
        applied: list[bool] = []

        def live_traffic(progress: Any) -> None:
            if applied:
                return
            applied.append(True)
            env.produce(topic, [to_message(event) for event in events])
            # Waited for in a thread of its own: this one runs the replay's event loop.
            waiter = threading.Thread(target=env.wait_caught_up, args=(spec, projection.name))
            waiter.start()
            waiter.join()

        report = asyncio.run(
            replay_projection(env.settings, projection, swap="always", on_progress=live_traffic)
        )
        assert applied and report.swapped, report.to_json()

    second_swap(memory_projection(env.settings))
    second_swap(conversation_projection(env.settings, Metrics(CollectorRegistry())))
    caught_up(env)

    def status(tenant: str, memory_id: str) -> str | None:
        with env.connect() as conn:
            row = conn.execute(
                "SELECT status FROM memories WHERE tenant_id = %s AND memory_id = %s",
                (tenant, memory_id),
            ).fetchone()
        return None if row is None else str(row[0])

    assert status("tenant_0", "between_0") == "revoked"  # not undone by the swap
    assert status("tenant_0", "between_1") == "verified"
    assert status("tenant_1", "during_0") == "revoked"
    assert status("tenant_2", "during_1") == "proposed"
    with env.connect() as conn:
        messages = conn.execute(
            "SELECT conversation_id, count(*) FROM conversation_messages"
            " WHERE conversation_id IN ('c_between', 'c_during') GROUP BY 1 ORDER BY 1"
        ).fetchall()
    assert messages == [("c_between", 2), ("c_during", 1)]
    # Each projection equals a projection of every event: a third rebuild, compared only.
    for projection in (
        memory_projection(env.settings),
        conversation_projection(env.settings, Metrics(CollectorRegistry())),
    ):
        check = asyncio.run(replay_projection(env.settings, projection, swap="never"))
        assert check.differences == {}, check.to_json()
