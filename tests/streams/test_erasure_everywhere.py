"""After an erasure, no readable copy anywhere memproj writes: a unique marker planted in every
personal field of every event type, read through every read path, copied by a rebuild that is
not swapped in, then erased; ``memproj audit plaintext`` finds it nowhere but in a raw input
topic inside its window. Against the real Kafka, PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from streams.metrics import Metrics
from streams.replay import replay_projection
from streams.sample import EventFactory
from streams.worker import conversation_projection, memory_projection
from support.deletion_scenario import (
    audit,
    compact_quickly,
    prime_cache,
    semantic_recall,
    wait_indexed,
)
from topics.registry import (
    CONVERSATION_EVENTS,
    CONVERSATION_MESSAGES,
    CONVERSATION_SEALED,
    DELETION_REQUESTS,
    DLQ_SUFFIX,
    MEMORY_CURRENT,
    MEMORY_EVENTS,
    MEMORY_SEALED,
)

pytestmark = pytest.mark.integration
ALICE = ("user", "alice")


def plant(env: Any, marker: str) -> None:
    f = EventFactory(id_prefix="everywhere", clock=datetime.now(UTC) - timedelta(minutes=5))
    source = ("message", "c_alice/m1")
    env.produce_events(
        [
            f.started("acme", "c_alice", ALICE),
            f.message("acme", "c_alice", "m1", "user", f"{marker} in a message"),
            f.message(
                "acme",
                "c_alice",
                "m2",
                "assistant",
                [{"type": "tool_use", "id": "tu1", "name": "lookup", "input": {"q": marker}}],
            ),
            f.message(
                "acme",
                "c_alice",
                "m3",
                "user",
                [{"type": "tool_result", "tool_use_id": "tu1", "content": f"{marker} found"}],
            ),
            f.summary("acme", "c_alice", 1, f"{marker} in a summary", ["m1", "m3"]),
            # A conflicting copy (a summary version that is not newer) is rejected.
            f.summary("acme", "c_alice", 1, f"{marker} in a stale summary", ["m1"]),
        ],
        CONVERSATION_EVENTS,
    )
    malformed = f.proposed("acme", "mem_bad", ALICE, {"text": f"{marker} malformed"})
    malformed["payload"]["observed_at"] = "not a time"
    env.produce_events(
        [
            f.proposed("acme", "mem_alice", ALICE, {"text": f"{marker} value"}, source=source),
            f.corrected("acme", "mem_alice", 1, {"text": f"{marker} corrected"}),
            # A conflicting copy: version 1 is not the current version any more.
            f.corrected("acme", "mem_alice", 1, {"text": f"{marker} conflicting"}),
            # A malformed copy that still names its subject: a dead letter.
            malformed,
        ]
    )


def test_after_an_erasure_the_marker_is_readable_nowhere(env: Any) -> None:
    marker = f"MARKER-{uuid.uuid4().hex}"
    plant(env, marker)
    # memory.current with test-sized segments: the erased values are compacted away in
    # seconds instead of the registry's minutes (the deletion worker rolls quiet segments).
    compact_quickly(env.settings.kafka_bootstrap, env.topic(MEMORY_CURRENT))
    env.start("memory", "conversation", "embeddings", "summaries", "cache", "context")
    # The audit reads dead tuples: the purge duty vacuums them once the erasure completed.
    env.start("deletion", compaction_roll_check_seconds=0.5, deletion_purge_check_seconds=1.0)
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")
    wait_indexed(env, "acme", 4)  # the memory and three messages

    assert semantic_recall(env, "acme", ALICE, marker).records
    # A rebuild that is not swapped in: a full copy in a shadow schema.
    for projection in (
        memory_projection(env.settings),
        conversation_projection(env.settings, Metrics(CollectorRegistry())),
    ):
        report = asyncio.run(replay_projection(env.settings, projection, swap="never"))
        assert report.events and not report.swapped

    # Every read path, so that the cache holds copies too, and the audit that finds one there
    # is the one checked: the cache worker, still catching up on memory.current, may drop a
    # copy made before it did.
    audits: list[tuple[int, Any]] = []

    def cached() -> bool:
        prime_cache(env, "acme")
        audits.append(audit(env, marker))
        return "redis" in {finding["kind"] for finding in audits[-1][1]["findings"]}

    env.wait_until(cached, "a copy of the marker in the cache")
    before, found = audits[-1]
    assert before == 1, found
    places = {finding["kind"] for finding in found["findings"]}
    assert {"table", "topic", "redis"} <= places, found
    # Sealed copies count while memproj can open them: the sealed log, the messages topic,
    # the dead letter of the malformed copy.
    topics = {f["name"] for f in found["findings"] if f["kind"] == "topic"}
    for spec in (MEMORY_SEALED, CONVERSATION_SEALED, CONVERSATION_MESSAGES, MEMORY_CURRENT):
        assert env.topic(spec) in topics, (spec.base_name, topics)
    assert env.topic(MEMORY_EVENTS) + DLQ_SUFFIX in topics, topics

    f = EventFactory(id_prefix="erase")
    env.produce_events(
        [f.deletion("acme", "d1", {"type": "subject", "id": "alice", "subject_type": "user"})],
        DELETION_REQUESTS,
    )

    def verified() -> dict[str, Any] | None:
        with env.connect() as conn:
            row = conn.execute("SELECT verified_at, verification FROM deletion_requests").fetchone()
        return row[1] if row and row[0] else None

    verification = env.wait_until(verified, "the erasure to be verified")
    assert verification["clean"], verification

    def nowhere() -> dict[str, Any] | None:
        status, report = audit(env, marker)
        return report if status == 0 else None

    report = env.wait_until(nowhere, "the marker to be readable nowhere", seconds=120)
    outside = [f for f in report["findings"] if not f.get("within_window")]
    assert outside == [], report
