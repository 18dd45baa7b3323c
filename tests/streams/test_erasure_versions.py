"""An erasure closes every version it covers and no other, and leaves no free text behind.

Bob's memory was first learned in Alice's conversation (whose id holds a ``/``), then corrected
from Bob's own. Erasing Alice makes the first version unreadable everywhere (the sealed log
included: it was sealed under the conversation's key too), while the memory, its current
version and its own key stay; a rebuild then gives the live projection, checksum for
checksum. A revocation's reason and the reads about Alice go with her. Against the real Kafka,
PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from projections.access import audit as read_audit
from projections.access.policy import allowed
from projections.memory import store as memory_store
from streams.replay import replay_projection
from streams.sample import EventFactory
from streams.worker import memory_projection
from support import deletion_scenario
from support.deletion_scenario import compact_quickly, detail
from topics.envelope import message_ref
from topics.registry import CONVERSATION_EVENTS, DELETION_REQUESTS, MEMORY_CURRENT, MEMORY_EVENTS

pytestmark = pytest.mark.integration
ALICE = ("user", "alice")
BOB = ("user", "bob")
ALICE_CONVERSATION = "support/alice:1"  # a '/' and a ':' in a conversation id


def audit(env: Any, marker: str) -> dict[str, Any]:
    return deletion_scenario.audit(env, marker)[1]


def readable_outside_windows(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if not f.get("within_window")]


def test_an_erasure_closes_the_versions_it_covers_and_keeps_the_others(env: Any) -> None:
    learned, reason = f"LEARNED-{uuid.uuid4().hex}", f"REASON-{uuid.uuid4().hex}"
    f = EventFactory(id_prefix="versions", clock=datetime.now(UTC) - timedelta(minutes=5))
    env.produce_events(
        [
            f.started("acme", ALICE_CONVERSATION, ALICE),
            f.message("acme", ALICE_CONVERSATION, "m1", "user", "Bob cooks on Sundays"),
            f.started("acme", "c_bob", BOB),
            f.message("acme", "c_bob", "m1", "user", "I cook on Saturdays now"),
        ],
        CONVERSATION_EVENTS,
    )
    env.produce_events(
        [
            f.proposed(
                "acme",
                "mem_bob",
                BOB,
                {"text": f"{learned} cooks on Sundays"},
                source=("message", message_ref(ALICE_CONVERSATION, "m1")),
            ),
            f.corrected(
                "acme",
                "mem_bob",
                1,
                {"text": "cooks on Saturdays"},
                source=("message", message_ref("c_bob", "m1")),
            ),
            f.proposed("acme", "mem_alice", ALICE, {"text": "likes tea"}, source=("crm", "c/1")),
            f.revoked("acme", "mem_alice", reason=f"{reason} asked by phone"),
        ]
    )
    compact_quickly(env.settings.kafka_bootstrap, env.topic(MEMORY_CURRENT))
    env.start("memory", "conversation", "embeddings", "summaries", "cache", "context")
    env.start("deletion", compaction_roll_check_seconds=0.5, deletion_purge_check_seconds=1.0)
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")

    # The conversation is found from the memory learned in it, '/' and all.
    with env.connect() as conn:
        (found,) = conn.execute(
            "SELECT DISTINCT source_conversation_id FROM memory_versions"
            " WHERE memory_id = 'mem_bob' AND version = 1"
        ).fetchone()
    assert found == ALICE_CONVERSATION

    async def read_about_alice(conn: Any) -> None:
        entry = read_audit.AuditEntry(
            datetime.now(UTC),
            "k1",
            "acme",
            "support_bot",
            "support",
            "/v1/subjects/{subject_type}/{subject_id}/memories",
            read_audit.subject_read(*ALICE),
            allowed(["mem_alice"]),
        )
        await read_audit.record(conn, entry)
        await conn.commit()

    env.run(read_about_alice)
    # Before the erasure, both are readable: the learned value on the sealed log, the reason
    # on the sealed log and in the projection.
    assert readable_outside_windows(audit(env, learned))
    assert readable_outside_windows(audit(env, reason))

    e = EventFactory(id_prefix="erase", clock=datetime.now(UTC))
    env.produce_events(
        [e.deletion("acme", "d1", {"type": "subject", "id": "alice", "subject_type": "user"})],
        DELETION_REQUESTS,
    )

    def purged() -> dict[str, Any] | None:
        found = detail(env, "acme", "d1")
        return found if found and found["purged_at"] is not None else None

    # Purged: no copy left anywhere memproj writes, dead tuples and memory.current included.
    assert env.wait_until(purged, "the erasure to be purged", seconds=240)["verification"]["clean"]
    assert readable_outside_windows(audit(env, learned)) == []
    assert readable_outside_windows(audit(env, reason)) == []
    with env.connect() as conn:
        (reads_left,) = conn.execute("SELECT count(*) FROM api_read_audit").fetchone()
        (keys_of_bob,) = conn.execute(
            "SELECT count(*) FROM entity_keys WHERE entity_type = 'memory'"
            " AND entity_id = 'mem_bob'"
        ).fetchone()
    assert reads_left == 0
    assert keys_of_bob == 1  # Bob's memory is not erased: its key and current version stay

    async def bob(conn: Any) -> tuple[Any, list[int]]:
        record = await memory_store.load_memory(conn, "acme", "mem_bob")
        history = await memory_store.load_history(conn, "acme", "mem_bob")
        return record, [entry.record.version for entry in history]

    record, versions = env.run(bob)
    assert (record.version, record.value, record.status) == (
        2,
        {"text": "cooks on Saturdays"},
        "proposed",
    )
    assert versions == [2]  # the version learned in Alice's conversation is gone
    before = env.checksums()

    # A rebuild from the sealed log decides the first version as erased, keeps its place in
    # the history without its content, applies the correction, and destroys no live key.
    report = asyncio.run(replay_projection(env.settings, memory_projection(env.settings)))
    assert report.differences == {} and report.swapped, report.to_json()
    assert env.checksums() == before
    with env.connect() as conn:
        (keys_of_bob,) = conn.execute(
            "SELECT count(*) FROM entity_keys WHERE entity_type = 'memory'"
            " AND entity_id = 'mem_bob'"
        ).fetchone()
    assert keys_of_bob == 1
