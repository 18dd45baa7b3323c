"""The memory worker against the real broker and PostgreSQL."""

from __future__ import annotations

import asyncio
import random
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import psycopg
import pytest

from projections.memory import store
from projections.memory.store import RecallQuery
from streams.sample import EventFactory, sample_memory_stream, to_message
from support.deadletters import open_topic_letters, opened_original
from support.ports import free_port
from topics.registry import (
    MEMORY_CURRENT,
    MEMORY_EVENTS,
    MEMORY_REJECTIONS,
    MEMORY_SEALED,
    entity_of_message,
)

pytestmark = pytest.mark.integration


def recall(env: Any, tenant: str, subject: tuple[str, str], **options: Any) -> list[str]:
    async def run() -> list[str]:
        async with await psycopg.AsyncConnection.connect(env.settings.postgres_dsn) as conn:
            query = RecallQuery(tenant, subject[0], subject[1], **options)
            return [r.memory_id for r in await store.recall(conn, query, datetime.now(UTC))]

    return asyncio.run(run())


def test_corrections_conflicts_revocations_and_recall(env: Any) -> None:
    f = EventFactory(clock=datetime.now(UTC) - timedelta(hours=1))
    alice = ("user", "alice")
    env.produce_events(
        [
            f.proposed("acme", "m_tea", alice, {"text": "likes tea"}),
            f.verified("acme", "m_tea", 1),
            f.corrected("acme", "m_tea", 2, {"text": "likes coffee"}, verification="crm_field"),
            f.verified("acme", "m_tea", 1),  # stale expected_version
            f.proposed("acme", "m_city", alice, {"text": "lives in Oslo"}),
            f.revoked("acme", "m_city", "user asked"),
            f.corrected("acme", "m_city", 2, {"text": "lives in Rome"}),  # on a revoked memory
            f.proposed("acme", "m_short", alice, expires_at=f.clock + timedelta(seconds=30)),
            f.proposed("acme", "m_long", alice, expires_at=datetime.now(UTC) + timedelta(days=9)),
            f.verified("acme", "m_ghost", 1),
        ]
    )
    env.worker()
    env.wait_caught_up()

    assert sorted(recall(env, "acme", alice)) == ["m_long", "m_tea"]
    assert recall(env, "acme", alice, kind="goal") == []
    assert recall(env, "acme", alice, statuses=("verified",)) == ["m_tea"]

    history = asyncio.run(_history(env, "acme", "m_tea"))
    assert [
        (h.record.version, h.record.value["text"], h.superseded_at is not None) for h in history
    ] == [
        (1, "likes tea", True),
        (2, "likes tea", True),
        (3, "likes coffee", False),
    ]
    assert history[2].record.verification == "crm_field"

    reasons = {value["entity_id"]: value["reason"] for _, value in env.read(MEMORY_REJECTIONS)}
    assert reasons == {
        "m_tea": "version_conflict",
        "m_city": "revoked",
        "m_ghost": "unknown_memory",
    }
    with env.connect() as conn:
        rows = conn.execute("SELECT entity_id, reason, details FROM rejections").fetchall()
    assert {(row[0], row[1]) for row in rows} == set(reasons.items())

    current = {key.decode(): value for key, value in env.read(MEMORY_CURRENT)}
    assert current["acme:m_city"] is None  # revoked: a tombstone on the compacted topic
    assert current["acme:m_tea"]["version"] == 3


def test_a_correction_keeps_removes_or_replaces_the_expiry_as_it_says(env: Any) -> None:
    # Contract 1.1, through the real memory worker (it seals, then projects): an omitted
    # expires_at keeps the current expiry, an explicit null removes it, a timestamp replaces it.
    f = EventFactory(clock=datetime.now(UTC) - timedelta(hours=1))
    alice = ("user", "alice")
    expires = (datetime.now(UTC) + timedelta(days=9)).replace(microsecond=0)
    replaced = expires + timedelta(days=1)
    removing = f.corrected("acme", "m_null", 1, {"text": "b2"})
    removing["payload"]["expires_at"] = None
    events = [
        f.proposed("acme", "m_kept", alice, {"text": "a"}, expires_at=expires),
        f.corrected("acme", "m_kept", 1, {"text": "a2"}),
        f.corrected("acme", "m_kept", 2, {"text": "a3"}, verification="crm_field"),
        f.proposed("acme", "m_null", alice, {"text": "b"}, expires_at=expires),
        removing,
        f.proposed("acme", "m_new", alice, {"text": "c"}, expires_at=expires),
        f.corrected("acme", "m_new", 1, {"text": "c2"}, expires_at=replaced),
    ]
    env.produce_events(events)
    env.worker()
    env.wait_caught_up()

    async def load(conn: Any) -> dict[str, Any]:
        ids = ("m_kept", "m_null", "m_new")
        return {m: await store.load_memory(conn, "acme", m) for m in ids}

    records = env.run(load)
    assert {m: (r.version, r.value, r.expires_at) for m, r in records.items()} == {
        "m_kept": (3, {"text": "a3"}, expires),
        "m_null": (2, {"text": "b2"}, None),
        "m_new": (2, {"text": "c2"}, replaced),
    }
    current = {key.decode(): value for key, value in env.read(MEMORY_CURRENT)}
    assert current["acme:m_kept"]["expires_at"] is not None
    assert current["acme:m_null"]["expires_at"] is None
    # The sealed log keeps the omission (and the explicit null) as the producer sent them.
    sealed = {v["event_id"]: v["payload"] for _, v in env.read(MEMORY_SEALED)}
    corrections = [e for e in events if e["event_type"] == "memory.corrected"]
    assert [
        ("expires_at" in sealed[e["event_id"]], sealed[e["event_id"]].get("expires_at"))
        for e in corrections
    ] == [
        (False, None),
        (False, None),
        (True, None),
        (True, replaced.isoformat().replace("+00:00", "Z")),
    ]


def test_memory_current_names_the_memory_in_headers(env: Any) -> None:
    # "org:acme" + "m1" and "org" + "acme:m1" share the key "org:acme:m1": only the headers
    # tell a consumer of a null-valued tombstone which memory is gone.
    f = EventFactory()
    env.produce_events(
        [
            f.proposed("org:acme", "m1", ("user", "u1"), {"text": "to revoke"}),
            f.revoked("org:acme", "m1", "user asked"),
            f.proposed("org", "acme:m2", ("user", "u1"), {"text": "kept"}),
        ]
    )
    env.worker()
    env.wait_caught_up()

    named = {
        entity_of_message(m.key, m.headers): m.value for m in env.read_messages(MEMORY_CURRENT)
    }
    assert set(named) == {("org:acme", "m1"), ("org", "acme:m2")}
    assert named[("org:acme", "m1")] is None
    assert recall(env, "org", ("user", "u1")) == ["acme:m2"]
    assert recall(env, "org:acme", ("user", "u1")) == []


async def _history(env: Any, tenant: str, memory_id: str) -> list[store.VersionEntry]:
    async with await psycopg.AsyncConnection.connect(env.settings.postgres_dsn) as conn:
        return await store.load_history(conn, tenant, memory_id)


def test_tenant_b_never_sees_tenant_a(env: Any) -> None:
    f = EventFactory()
    shared_subject = ("user", "same_id")
    env.produce_events(
        [
            f.proposed("tenant_a", "canary", shared_subject, {"text": "CANARY-A"}),
            f.proposed("tenant_b", "other", shared_subject, {"text": "b's own"}),
        ]
    )
    env.worker()
    env.wait_caught_up()
    assert recall(env, "tenant_b", shared_subject) == ["other"]
    assert recall(env, "tenant_a", shared_subject) == ["canary"]

    async def show() -> Any:
        async with await psycopg.AsyncConnection.connect(env.settings.postgres_dsn) as conn:
            return await store.load_memory(conn, "tenant_b", "canary")

    assert asyncio.run(show()) is None


def test_invalid_messages_go_to_the_dlq_and_the_worker_keeps_going(env: Any) -> None:
    f = EventFactory()
    good = [f.proposed("t1", f"ok_{i}") for i in range(5)]
    unknown_version = f.proposed("t1", "bad_version")
    unknown_version["schema_version"] = 7
    missing = f.proposed("t1", "bad_missing")
    del missing["payload"]["scope"]
    oversized = f.proposed("t1", "bad_big", value={"blob": "x" * 70_000})
    messages = [
        to_message(good[0]),
        (b"t1:bad_json", b'{"event_id": '),
        to_message(good[1]),
        (b"t1:someone_else", to_message(f.proposed("t1", "bad_key"))[1]),
        to_message(good[2]),
        to_message(unknown_version),
        to_message(missing),
        to_message(oversized),
        (b"t1:nothing", None),
        to_message(good[3]),
        to_message(good[4]),
    ]
    env.produce(env.topic(MEMORY_EVENTS), messages)
    worker = env.worker()
    env.wait_caught_up()

    dead = [value for _, value in env.read(MEMORY_EVENTS, ".dlq")]
    codes = sorted(d["error_code"] for d in dead)
    assert codes == sorted(
        [
            "malformed_json",
            "key_mismatch",
            "unknown_schema_version",
            "invalid_event",
            "value_too_large",
            "empty_value",
        ]
    )
    for view in open_topic_letters(env, MEMORY_EVENTS):
        assert view.letter.topic == env.topic(MEMORY_EVENTS)
        assert view.letter.error
        # The sealed original is the message, with its key (the keys here are unique).
        assert view.opened is not None and view.opened.key is not None
        assert opened_original(view) == (dict(messages)[view.opened.key] or b"")
    with env.connect() as conn:
        stored = {row[0] for row in conn.execute("SELECT memory_id FROM memories")}
    assert stored == {f"ok_{i}" for i in range(5)}
    assert worker.alive()


def test_what_postgresql_or_kafka_cannot_hold_is_dead_lettered_and_the_rest_applied(
    env: Any,
) -> None:
    f = EventFactory()
    good = [f.proposed("t1", f"ok_{i}") for i in range(4)]
    nul = f.proposed("t1", "bad_nul", value={"text": "a\x00b"})
    # Valid under the contract (128 and 512 characters), but 4-byte characters that do not
    # compress make its entry in the memories_by_source index larger than a btree entry may be.
    chars = random.Random(7)

    def wide_text(length: int) -> str:
        return "".join(chr(chars.randrange(0x10000, 0x10FFFF)) for _ in range(length))

    wide = f.proposed(wide_text(128), "bad_wide", source=(wide_text(128), wide_text(512)))
    # Its dead letter would be over a Kafka message in base64: it keeps the first 512 KiB.
    huge = f.proposed("t1", "bad_huge", value={"blob": "x" * 900_000})
    messages = [to_message(e) for e in (good[0], nul, good[1], wide, good[2], huge, good[3])]
    env.produce(env.topic(MEMORY_EVENTS), messages)
    worker = env.worker()
    env.wait_caught_up()

    raw_dead = {d["key"]: d for _, d in env.read(MEMORY_EVENTS, ".dlq")}
    assert raw_dead["t1:bad_nul"]["error_code"] == "invalid_event"
    assert raw_dead["t1:bad_huge"]["error_code"] == "value_too_large"
    assert raw_dead["t1:bad_huge"]["original_truncated"] is True
    assert raw_dead["t1:bad_huge"]["original_size"] == len(messages[5][1])
    # One stage seals and projects: what PostgreSQL cannot hold is a dead letter of
    # the raw topic, never sealed (its part of the batch rolled back), and nothing reaches the
    # sealed log's dead letters.
    assert raw_dead[messages[3][0].decode()]["error_code"] == "unstorable"
    [wide_view] = [
        v
        for v in open_topic_letters(env, MEMORY_EVENTS)
        if v.opened is not None and v.opened.key == messages[3][0]
    ]
    assert wide_view.opened is not None and "index row" in wide_view.opened.detail
    assert env.read(MEMORY_SEALED, ".dlq") == []
    sealed_ids = {value["payload"]["memory_id"] for _, value in env.read(MEMORY_SEALED)}
    assert sealed_ids == {f"ok_{i}" for i in range(4)}
    with env.connect() as conn:
        stored = {row[0] for row in conn.execute("SELECT memory_id FROM memories")}
    assert stored == {f"ok_{i}" for i in range(4)}
    assert worker.alive()


def test_redelivery_changes_nothing(env: Any) -> None:
    messages = [(m.key, m.value) for m in sample_memory_stream(300, tenants=3, seed=11)]
    env.produce(env.topic(MEMORY_EVENTS), messages)
    # The raw topic is kept (not trimmed), to be read again from offset 0 below.
    worker = env.worker(raw_input_trim_seconds=0)
    env.wait_caught_up()
    before = env.checksums()
    with env.connect() as conn:
        rejections_before = conn.execute("SELECT count(*) FROM rejections").fetchone()[0]

    # The same events produced again (new offsets, same event ids) ...
    env.produce(env.topic(MEMORY_EVENTS), messages)
    env.wait_caught_up()
    # ... and the whole topic consumed again from offset 0 by a fresh consumer group.
    worker.stop()
    again = env.worker(group_prefix=env.settings.group_prefix + "-again", raw_input_trim_seconds=0)
    env.wait_group_committed(again.settings.group_id("memory"), MEMORY_EVENTS)

    assert env.checksums() == before
    with env.connect() as conn:
        rejections_after = conn.execute("SELECT count(*) FROM rejections").fetchone()[0]
    # Re-produced events whose id is known with the same body are redeliveries, not news.
    assert rejections_after == rejections_before


def test_reused_event_id_with_another_body_is_refused(env: Any) -> None:
    f = EventFactory()
    original = f.proposed("t1", "m1", value={"text": "first"})
    reused = orjson.loads(orjson.dumps(original))
    reused["payload"]["value"] = {"text": "second"}
    env.produce_events([original, reused])
    env.worker()
    env.wait_caught_up()
    reasons = [value["reason"] for _, value in env.read(MEMORY_REJECTIONS)]
    assert reasons == ["duplicate_mismatch"]
    with env.connect() as conn:
        value = conn.execute("SELECT value FROM memories WHERE memory_id = 'm1'").fetchone()[0]
    assert value == {"text": "first"}


def test_sigkill_mid_stream_ends_with_the_same_projection(env: Any) -> None:
    messages = [(m.key, m.value) for m in sample_memory_stream(6000, tenants=4, seed=5)]
    env.produce(env.topic(MEMORY_EVENTS), messages)
    total = len(messages)

    # A second projection of the same topic, in its own schema and consumer group.
    steady = env.sibling("steady")
    steady.worker()

    victim = env.worker(batch_max_events=200)
    deadline = time.monotonic() + 90
    applied = 0
    while time.monotonic() < deadline:
        with env.connect() as conn:
            applied = conn.execute(
                "SELECT coalesce(sum(next_offset), 0) FROM projection_offsets"
            ).fetchone()[0]
        if applied > total * 0.3:
            break
        time.sleep(0.05)
    assert 0 < applied < total, f"kill point missed: {applied} of {total}"
    victim.kill()
    env.worker(batch_max_events=200)
    env.wait_caught_up()
    steady.wait_caught_up()

    killed, never_stopped = env.checksums(), steady.checksums()
    assert killed == never_stopped
    assert sum(c.versions for c in killed.values()) > 5000


def test_a_broken_database_stops_the_worker_and_loses_nothing(env: Any) -> None:
    f = EventFactory()
    env.produce_events([f.proposed("t1", f"m{i}") for i in range(3)])
    with env.connect() as conn:
        conn.execute("ALTER TABLE memory_versions RENAME COLUMN actor_id TO actor_ident")
    worker = env.worker()
    assert worker.process is not None
    # Not a transient failure: the worker exits (for its supervisor to see) instead of
    # retrying forever or carrying on without its agent.
    assert worker.process.wait(60) != 0
    with env.connect() as conn:
        conn.execute("ALTER TABLE memory_versions RENAME COLUMN actor_ident TO actor_id")
        assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 0
    env.worker()
    env.wait_caught_up()
    with env.connect() as conn:
        assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 3


def test_the_worker_exports_the_contract_metrics(env: Any) -> None:
    f = EventFactory(clock=datetime.now(UTC))
    env.produce_events([f.proposed("t1", "m1"), f.verified("t1", "m1", 9)])
    env.produce(env.topic(MEMORY_EVENTS), [(b"t1:x", b"not json")])
    port = free_port()
    env.worker(metrics_port=port)  # it seals too: the raw topic's dead letters are its own
    env.wait_caught_up()
    samples = {}
    for each in (port,):
        text = urllib.request.urlopen(f"http://127.0.0.1:{each}/metrics", timeout=10).read()
        samples.update(
            {
                line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.decode().splitlines()
                if line and not line.startswith("#")
            }
        )
    assert (
        samples['memproj_events_applied_total{event_type="memory.proposed",projection="memory"}']
        == 1
    )
    assert samples['memproj_events_rejected_total{reason="version_conflict"}'] == 1
    dlq = f'memproj_dead_letters_total{{error="malformed_json",topic="{env.topic(MEMORY_EVENTS)}"}}'
    assert samples[dlq] == 1
    staleness = samples['memproj_projection_staleness_seconds{projection="memory"}']
    assert 0 <= staleness < 120


def test_a_poison_pill_at_the_first_stage_is_a_dead_letter_and_the_stream_goes_on(
    env: Any,
) -> None:
    # 999 bytes whose ignored extra field nests 300 levels: it once stopped the sealer (the
    # first stage then) for good (the codec re-serialised it, and orjson writes at most 254
    # levels).
    f = EventFactory()
    key, value = to_message(f.proposed("t1", "poison"))
    poison = value[:-1] + b',"extra":' + b"[" * 300 + b"]" * 300 + b"}"
    env.produce(
        env.topic(MEMORY_EVENTS),
        [
            to_message(f.proposed("t1", "before")),
            (key, poison),
            to_message(f.proposed("t1", "after")),
        ],
    )
    worker = env.worker()
    env.wait_caught_up()
    (view,) = open_topic_letters(env, MEMORY_EVENTS)
    assert view.letter.error_code == "invalid_event"
    assert view.opened is not None and "deeper than 64 levels" in view.opened.detail
    with env.connect() as conn:
        memories = {row[0] for row in conn.execute("SELECT memory_id FROM memories")}
    assert memories == {"before", "after"}
    assert worker.alive()


def test_a_dropped_table_stops_the_worker_and_dead_letters_nothing(env: Any) -> None:
    f = EventFactory()
    env.produce_events([f.proposed("t1", "m0")])
    worker = env.worker()
    env.wait_caught_up()
    with env.connect() as conn:
        conn.execute("DROP TABLE memory_versions")
    env.produce_events([f.proposed("t1", f"m{i}") for i in range(1, 30)])
    assert worker.process is not None
    # Every event fails the same way, and not because of what it holds: the worker stops
    # with the error, for its supervisor, instead of dead-lettering the stream.
    assert worker.process.wait(60) != 0
    assert "UndefinedTable" in worker.log_tail(200)
    assert "stopping the worker" in worker.log_tail(200)
    assert env.read(MEMORY_SEALED, ".dlq") == []
    with env.connect() as conn:
        assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 1
