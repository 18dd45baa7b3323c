"""The conversation worker against the real broker and PostgreSQL."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
import pytest

from projections.conversation import store
from projections.conversation.context import ContextSettings, build_context
from projections.conversation.reducer import reduce_batch
from projections.memory import store as memory_store
from projections.sql import KeyLookups
from streams.sample import EventFactory, to_message
from support.deadletters import open_topic_letters
from support.ports import free_port
from topics.codec import EventCodec
from topics.registry import (
    CONVERSATION_EVENTS,
    CONVERSATION_MESSAGES,
    CONVERSATION_REJECTIONS,
    MEMORY_EVENTS,
)
from topics.schemas import default_schemas

pytestmark = pytest.mark.integration
T = TypeVar("T")
CODEC = EventCodec(
    default_schemas(),
    frozenset(t for t in default_schemas().event_types() if t.startswith("conversation.")),
)

SECRETS = {
    "api_key": "sk-ant-api03-Zx9Yw8Vu7Ts6Rq5Po4Nm",
    "bearer_token": "Bearer eyJhbGciOiJIUzI1NiJ9.c2VjcmV0.sig",
    "password": "password: Tr0ub4dor&3",
    "private_key": (
        "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0\n-----END PRIVATE KEY-----"
    ),
    "card_number": "5555 5555 5555 4444",
}


def read(env: Any, work: Callable[[Any], Awaitable[T]]) -> T:
    async def run() -> T:
        async with await psycopg.AsyncConnection.connect(env.settings.postgres_dsn) as conn:
            return await work(conn)

    return asyncio.run(run())


def weather_conversation(f: EventFactory, tenant: str = "acme") -> list[dict[str, Any]]:
    return [
        f.started(tenant, "c1", ("user", "alice"), provider_ref="thread_abc"),
        f.message(tenant, "c1", "m1", "user", "what is the weather in Oslo?"),
        f.message(
            tenant,
            "c1",
            "m2",
            "assistant",
            [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "tu1", "name": "weather", "input": {"city": "Oslo"}},
            ],
        ),
        f.message(
            tenant,
            "c1",
            "m3",
            "user",
            [{"type": "tool_result", "tool_use_id": "tu1", "content": "rain, 9C"}],
        ),
        f.message(tenant, "c1", "m4", "assistant", "Rainy and 9C."),
        f.summary(tenant, "c1", 1, "Alice asked about Oslo weather.", ["m1", "m2"]),
        f.message(tenant, "c1", "m5", "user", "and the 10-day forecast, in detail?"),
        f.message(
            tenant,
            "c1",
            "m6",
            "assistant",
            [{"type": "tool_use", "id": "tu2", "name": "forecast", "input": {"days": 10}}],
        ),
        f.message(
            tenant,
            "c1",
            "m7",
            "user",
            [{"type": "tool_result", "tool_use_id": "tu2", "content": "day: rain. " * 900}],
        ),
        f.summary(tenant, "c1", 2, "Cites a message that never came.", ["m1", "m99"]),
    ]


def test_messages_summaries_and_the_context_view(env: Any) -> None:
    f = EventFactory()
    events = weather_conversation(f)
    env.produce_events(events, CONVERSATION_EVENTS)
    env.worker("conversation", context_budget_tokens=3000, context_tool_result_max_chars=500)
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")

    detail = read(env, lambda c: store.load_conversation(c, "acme", "c1"))
    assert detail is not None
    shown = detail.to_json()
    assert [m["message_id"] for m in shown["messages"]] == [f"m{i}" for i in range(1, 8)]
    assert [m["seq"] for m in shown["messages"]] == list(range(1, 8))
    assert shown["conversation"]["provider_conversation_ref"] == "thread_abc"
    assert shown["conversation"]["owner_id"] == "alice"
    (summary,) = shown["summaries"]  # version 2 was refused
    assert [s["message_id"] for s in summary["sources"]] == ["m1", "m2"]

    rejections = [value for _, value in env.read(CONVERSATION_REJECTIONS)]
    assert [(r["reason"], r["entity_id"]) for r in rejections] == [("unknown_source_message", "c1")]
    assert "m99" in rejections[0]["details"]

    view = read(env, lambda c: store.load_context(c, "acme", "c1"))
    assert view is not None
    roles = [(item["role"], item.get("message_id")) for item in view["items"]]
    # The finished turn is its question and final answer (text only); the active turn is
    # whole, its tool_use with its tool_result.
    assert roles == [
        ("summary", None),
        ("user", "m1"),
        ("assistant", "m4"),
        ("user", "m5"),
        ("assistant", "m6"),
        ("user", "m7"),
    ]
    assert view["items"][2]["content"] == [{"type": "text", "text": "Rainy and 9C."}]
    result = view["items"][5]["content"][0]
    assert result["tool_use_id"] == "tu2" and "omitted" in result["content"]
    assert view["token_estimate"] <= view["budget_tokens"] == 3000
    assert view["omitted_tool_results"] == 1


def test_redaction_happens_before_postgres_and_is_counted(env: Any) -> None:
    f = EventFactory()
    port = free_port()
    env.produce_events(
        [
            f.started("acme", "c_secret"),
            *[
                f.message("acme", "c_secret", f"m_{kind}", "user", f"here you go: {secret}")
                for kind, secret in SECRETS.items()
            ],
            f.summary("acme", "c_secret", 1, f"user shared {SECRETS['api_key']}", ["m_api_key"]),
        ],
        CONVERSATION_EVENTS,
    )
    env.worker("conversation", metrics_port=port)
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")

    with env.connect() as conn:
        stored = conn.execute(
            "SELECT string_agg(content::text || redactions::text, ' ') FROM conversation_messages"
        ).fetchone()[0]
        stored += conn.execute(
            "SELECT string_agg(text, ' ') FROM conversation_summaries"
        ).fetchone()[0]
        stored += conn.execute(
            "SELECT string_agg(view::text, ' ') FROM conversation_context"
        ).fetchone()[0]
        counts = dict(
            conn.execute("SELECT message_id, redactions FROM conversation_messages").fetchall()
        )
    for kind, secret in SECRETS.items():
        core = secret.split()[-1] if kind != "private_key" else "MIIEvQIBADANBgkqhkiG9w0"
        assert core not in stored, kind
        assert f"[REDACTED:{kind}]" in stored
        assert counts[f"m_{kind}"] == {kind: 1}
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'memproj_redactions_total{kind="api_key"} 2.0' in metrics
    assert 'memproj_redactions_total{kind="card_number"} 1.0' in metrics

    # conversation.messages carries the messages sealed: neither the secrets nor the text.
    def published() -> bytes | None:
        values = [m.value or b"" for m in env.read_messages(CONVERSATION_MESSAGES)]
        return b" ".join(values) if len(values) == len(SECRETS) else None

    on_topic = env.wait_until(published, "the messages on conversation.messages")
    assert on_topic.count(b'"sealed"') == len(SECRETS)
    assert b"REDACTED" not in on_topic and b"here you go" not in on_topic
    for kind, secret in SECRETS.items():
        core = secret.split()[-1] if kind != "private_key" else "MIIEvQIBADANBgkqhkiG9w0"
        assert core.encode() not in on_topic, kind


def test_order_survives_redelivery_and_restarts(env: Any) -> None:
    f = EventFactory()
    events = [f.started("acme", "c_long")]
    events += [
        f.message("acme", "c_long", f"m{i:03d}", "user" if i % 2 else "assistant", f"line {i}")
        for i in range(1, 301)
    ]
    env.produce_events(events[:150], CONVERSATION_EVENTS)
    first = env.worker("conversation", batch_max_events=20)
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")
    first.kill()
    env.produce_events(events, CONVERSATION_EVENTS)  # the first half again, then the rest
    env.worker("conversation", batch_max_events=20)
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")

    with env.connect() as conn:
        rows = conn.execute(
            "SELECT message_id, seq FROM conversation_messages ORDER BY seq"
        ).fetchall()
        count = conn.execute(
            "SELECT message_count FROM conversations WHERE conversation_id = 'c_long'"
        ).fetchone()[0]
        rejected = conn.execute("SELECT count(*) FROM rejections").fetchone()[0]
    assert rows == [(f"m{i:03d}", i) for i in range(1, 301)]
    assert count == 300
    assert rejected == 0  # redelivered events are recognised, not refused


def test_tenant_b_reads_nothing_of_tenant_a(env: Any) -> None:
    f = EventFactory()
    env.produce_events(weather_conversation(f, tenant="tenant_a"), CONVERSATION_EVENTS)
    env.produce_events(
        [f.proposed("tenant_a", "mem1", ("user", "alice"), source=("message", "c1/m1"))],
        MEMORY_EVENTS,
    )
    env.worker("conversation")
    env.worker("memory")
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")
    env.wait_caught_up(MEMORY_EVENTS, "memory")

    assert read(env, lambda c: store.load_conversation(c, "tenant_b", "c1")) is None
    assert read(env, lambda c: store.load_context(c, "tenant_b", "c1")) is None
    assert read(env, lambda c: memory_store.memories_from_conversation(c, "tenant_b", "c1")) == []
    assert read(env, lambda c: store.load_conversation(c, "tenant_a", "c1")) is not None


def test_memories_derived_from_a_conversation_are_listed_from_it(env: Any) -> None:
    f = EventFactory()
    env.produce_events(
        [
            f.proposed("acme", "mem_rain", ("user", "alice"), source=("message", "c1/m4")),
            f.proposed("acme", "mem_other", ("user", "alice"), source=("message", "c2/m1")),
            f.proposed("acme", "mem_crm", ("user", "alice"), source=("crm", "c1/m4")),
            f.proposed("acme", "mem_fixed", ("user", "alice"), source=("message", "c9/m1")),
            f.corrected("acme", "mem_fixed", 1, {"text": "new"}, source=("message", "c1/m7")),
        ]
    )
    env.worker("memory")
    env.wait_caught_up()
    found = read(env, lambda c: memory_store.memories_from_conversation(c, "acme", "c1"))
    assert sorted(r.memory_id for r in found) == ["mem_fixed", "mem_rain"]


def test_a_message_too_large_once_sealed_is_dead_lettered_and_the_rest_applied(env: Any) -> None:
    f = EventFactory()
    # Valid under the contract and under Kafka's limit as produced, but base64 grows its
    # sealed form by a third, past the largest message memproj produces.
    huge = f.message("acme", "c1", "m_huge", "user", "x" * 900_000)
    events = [
        f.started("acme", "c1", ("user", "alice")),
        f.message("acme", "c1", "m1", "user", "hello"),
        huge,
        f.message("acme", "c1", "m2", "assistant", "hi"),
    ]
    env.produce_events(events, CONVERSATION_EVENTS)
    workers = [env.worker("conversation")]
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")

    dead = [letter for _, letter in env.read(CONVERSATION_EVENTS, ".dlq")]
    assert [(d["key"], d["error_code"]) for d in dead] == [("acme:c1", "unstorable")]
    assert dead[0]["original_truncated"] is True
    [view] = open_topic_letters(env, CONVERSATION_EVENTS)
    assert view.opened is not None and "above the limit" in view.opened.detail
    conversation = read(env, lambda c: store.load_conversation(c, "acme", "c1"))
    assert conversation is not None
    assert [m.message_id for m in conversation.messages] == ["m1", "m2"]
    assert all(worker.alive() for worker in workers)


# -- the context view's bounded rebuild ---------------------------------------------------


def turn(f: EventFactory, number: int, tenant: str = "acme") -> list[dict[str, Any]]:
    """A question, a tool exchange and an answer: four messages."""
    tool = f"tu{number}"
    return [
        f.message(tenant, "c1", f"q{number}", "user", f"question {number}: what about it?"),
        f.message(
            tenant,
            "c1",
            f"u{number}",
            "assistant",
            [{"type": "tool_use", "id": tool, "name": "search", "input": {"n": number}}],
        ),
        f.message(
            tenant,
            "c1",
            f"r{number}",
            "user",
            [{"type": "tool_result", "tool_use_id": tool, "content": "found " * (number % 97)}],
        ),
        f.message(tenant, "c1", f"a{number}", "assistant", f"answer {number}. " * 6),
    ]


async def apply_batch(
    conn: Any, raws: list[dict[str, Any]], context: ContextSettings
) -> store.ContextStats | None:
    """One batch as the conversation worker applies it: decode, reduce, save, commit."""
    events = [CODEC.decode(*to_message(raw)) for raw in raws]
    async with conn.transaction():
        state = await store.load_state(conn, events, KeyLookups())  # type: ignore[arg-type]
        result = reduce_batch(events, state, {})  # type: ignore[arg-type]
        assert not result.rejections, result.rejections
        return await store.save_batch(conn, result, context, KeyLookups())


async def full_view(conn: Any, context: ContextSettings) -> dict[str, Any]:
    """The view as a rebuild from every stored message and the latest summary makes it."""
    detail = await store.load_conversation(conn, "acme", "c1")
    assert detail is not None
    summary = detail.summaries[-1] if detail.summaries else None
    return build_context(detail.messages, summary, context).to_json()


async def stored_view(conn: Any) -> dict[str, Any]:
    view = await store.load_context(conn, "acme", "c1")
    assert view is not None
    return {k: v for k, v in view.items() if k not in ("built_at", "owner")}


def test_a_long_conversation_reads_a_bounded_number_of_rows_per_batch(env: Any) -> None:
    # 3,000 messages in 30 batches, with summaries of all but the newest messages now and
    # then: after every batch the view is the full rebuild's, and what a batch reads does
    # not grow with the conversation.
    context = ContextSettings(budget_tokens=1500, tool_result_max_chars=200)
    f = EventFactory()

    async def run() -> list[store.ContextStats]:
        stats = []
        dsn = env.settings.postgres_dsn
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await apply_batch(conn, [f.started("acme", "c1", ("user", "alice"))], context)
            ids: list[str] = []
            summaries = 0
            for batch in range(30):
                raws = [m for n in range(25) for m in turn(f, batch * 25 + n)]
                ids += [raw["payload"]["message_id"] for raw in raws]
                if batch % 4 == 3:
                    summaries += 1
                    raws.append(f.summary("acme", "c1", summaries, "so far: " * 20, ids[:-40]))
                done = await apply_batch(conn, raws, context)
                assert done is not None
                stats.append(done)
                assert await stored_view(conn) == await full_view(conn, context), batch
        return stats

    stats = asyncio.run(run())
    reads = [s.rows_read for s in stats]
    # No batch is rebuilt from every message: conversation.started wrote the first index.
    assert [s.full_rebuilds for s in stats] == [0] * 30
    # A batch reads its 100 new messages, the active turn (4), the summary and the newest
    # finished turns, at most two pages of 32 (2 rows each); one with a new summary also
    # looks up the 400 messages it adds to the one before, the 100 turns that keep them
    # (2 rows each) and the summary before. As many at 3,000 messages as at 800.
    plain = [r for batch, r in enumerate(reads) if batch % 4 != 3]
    summarising = [r for batch, r in enumerate(reads) if batch % 4 == 3]
    most = 100 + 4 + 1 + 2 * 2 * 32
    assert max(plain[6:]) <= max(plain[1:6]) <= most
    assert max(summarising[2:]) <= summarising[1] <= most + 400 + 2 * 100 + 1

    def marks() -> Any:
        with env.connect() as conn:
            return conn.execute(
                "SELECT count(*), count(DISTINCT context_turn), max(context_turn)"
                " FROM conversation_messages WHERE context_turn IS NOT NULL"
            ).fetchone()

    # 750 turns, 749 finished, each keeping its question and its answer.
    assert marks() == (2 * 749, 749, 749)


def test_a_late_tool_result_rebuilds_the_view_from_every_message(env: Any) -> None:
    context = ContextSettings(budget_tokens=3000)
    f = EventFactory()

    async def run() -> list[store.ContextStats | None]:
        dsn = env.settings.postgres_dsn
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            stats = [await apply_batch(conn, [f.started("acme", "c1"), *turn(f, 1)], context)]
            stats.append(await apply_batch(conn, turn(f, 2) + turn(f, 3), context))
            # A second result for turn 1's tool_use: turns 1 to 3 are one open exchange now.
            late = f.message(
                "acme",
                "c1",
                "late",
                "user",
                [{"type": "tool_result", "tool_use_id": "tu1", "content": "more"}],
            )
            stats.append(await apply_batch(conn, [late], context))
            stats.append(await apply_batch(conn, turn(f, 4), context))
            assert await stored_view(conn) == await full_view(conn, context)
            view = await stored_view(conn)
            assert view["finished_turns"] == 1  # turns 1-3 and the late result, then turn 4
        return stats

    stats = asyncio.run(run())
    assert [s.full_rebuilds if s else None for s in stats] == [1, 0, 1, 0]


def test_the_worker_keeps_the_view_equal_to_a_full_rebuild_across_batches(env: Any) -> None:
    context = ContextSettings(budget_tokens=800, tool_result_max_chars=100)
    f = EventFactory()
    env.produce_events([f.started("acme", "c1", ("user", "alice"))], CONVERSATION_EVENTS)
    worker_settings = {"context_budget_tokens": 800, "context_tool_result_max_chars": 100}
    env.worker("conversation", **worker_settings)
    for round_ in range(3):
        raws = [m for n in range(40) for m in turn(f, round_ * 40 + n)]
        if round_:
            ids = [f"{kind}{n}" for n in range(round_ * 40 - 5) for kind in "qura"]
            raws.append(f.summary("acme", "c1", round_, "summary", ids))
        env.produce_events(raws, CONVERSATION_EVENTS)
        env.wait_caught_up(CONVERSATION_EVENTS, "conversation")
        assert read(env, stored_view) == read(env, lambda c: full_view(c, context))
    with env.connect() as conn:
        (index,) = conn.execute("SELECT turn_index FROM conversation_context").fetchone()
    assert index["finished"] == 119 and index["through_seq"] == 480
