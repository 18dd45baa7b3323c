"""A deletion's second milestone, ``purged``, end to end against the real Kafka, PostgreSQL and
Redis: a marker in a memory value and in conversation content is erased; right after
``completed`` the plaintext audit still reads it (PostgreSQL's dead tuples, memory.current);
once ``purged``, it reads it nowhere, and the ledger, the CLI and ``deletion.status`` say when
each place was purged."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from projections.deletion.purge import (
    MEMORY_CURRENT_PLACE,
    PROJECTION_TABLES_PLACE,
    RAW_INPUT_PLACE,
    REBUILD_COPIES_PLACE,
)
from projections.stores import STORES
from streams.cli import cli
from streams.sample import EventFactory
from support.deletion_scenario import audit, compact_quickly, detail, wait_indexed
from support.environment import settings_environment
from topics.registry import (
    CONVERSATION_EVENTS,
    DELETION_REQUESTS,
    DELETION_STATUS,
    MEMORY_CURRENT,
    MEMORY_EVENTS,
)

pytestmark = pytest.mark.integration
ALICE = ("user", "alice")
PLACES = {
    MEMORY_CURRENT_PLACE,
    RAW_INPUT_PLACE,
    PROJECTION_TABLES_PLACE,
    REBUILD_COPIES_PLACE,
    *STORES.names,
}


def plant(env: Any, marker: str) -> None:
    f = EventFactory(id_prefix="purge", clock=datetime.now(UTC) - timedelta(minutes=5))
    env.produce_events(
        [
            f.started("acme", "c_alice", ALICE),
            f.message("acme", "c_alice", "m1", "user", f"{marker} in a message"),
            f.summary("acme", "c_alice", 1, f"{marker} in a summary", ["m1"]),
        ],
        CONVERSATION_EVENTS,
    )
    env.produce_events(
        [
            f.proposed(
                "acme",
                "mem_alice",
                ALICE,
                {"text": f"{marker} value"},
                source=("message", "c_alice/m1"),
            ),
            f.corrected("acme", "mem_alice", 1, {"text": f"{marker} corrected"}),
        ]
    )


def test_purged_means_no_copy_left_and_completed_does_not(env: Any) -> None:
    marker = f"PURGE-{uuid.uuid4().hex}"
    plant(env, marker)
    compact_quickly(env.settings.kafka_bootstrap, env.topic(MEMORY_CURRENT))
    env.start("memory", "conversation", "embeddings", "summaries", "cache", "context")
    # First without the purge duty: the state right after completion stays to be looked at.
    (first,) = env.start(
        "deletion", compaction_roll_check_seconds=0.5, deletion_purge_check_seconds=0
    ).values()
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")
    wait_indexed(env, "acme", 2)  # the memory and the message

    f = EventFactory(id_prefix="erase")
    env.produce_events(
        [f.deletion("acme", "d1", {"type": "subject", "id": "alice", "subject_type": "user"})],
        DELETION_REQUESTS,
    )

    def completed() -> dict[str, Any] | None:
        found = detail(env, "acme", "d1")
        return found if found and found["completed_at"] is not None else None

    env.wait_until(completed, "the erasure to complete")
    status, report = audit(env, marker)
    assert status == 1, report
    kinds = {(f["kind"], f["name"]) for f in report["findings"]}
    # The erased rows are dead tuples until a vacuum past the erasure's transaction.
    assert ("dead_tuples", f"{env.schema}.memories") in kinds, kinds
    assert ("dead_tuples", f"{env.schema}.conversation_messages") in kinds, kinds
    assert detail(env, "acme", "d1")["purged_at"] is None  # type: ignore[index]

    first.stop()
    env.start("deletion", compaction_roll_check_seconds=0.5, deletion_purge_check_seconds=1.0)

    def purged() -> dict[str, Any] | None:
        found = detail(env, "acme", "d1")
        return found if found and found["purged_at"] is not None else None

    found = env.wait_until(purged, "the erasure to be purged", seconds=240)
    assert set(found["purge"]) == PLACES, found["purge"]
    assert all(p["purged_at"] is not None for p in found["purge"].values()), found["purge"]
    assert found["seconds_to_purge"] >= found["seconds_to_complete"]
    for store in found["stores"].values():
        assert store["purged_at"] is not None and store["purged_at"] >= store["acked_at"]

    # Nowhere at all: not in a dead tuple, not on memory.current, not even in raw input.
    status, report = audit(env, marker)
    assert (status, report["findings"], report["errors"]) == (0, [], []), report

    # The CLI and the compacted deletion.status say so too.
    result = CliRunner().invoke(
        cli, ["deletion", "status", "d1", "--json"], env=settings_environment(env.settings)
    )
    assert result.exit_code == 0, result.output
    shown = orjson.loads(result.output)
    assert shown["purged_at"] is not None and set(shown["purge"]) == PLACES
    result = CliRunner().invoke(
        cli, ["deletion", "status", "d1"], env=settings_environment(env.settings)
    )
    assert "purged after" in result.output, result.output

    def purged_status() -> dict[str, Any] | None:
        statuses = [v for k, v in env.read(DELETION_STATUS) if k == b"acme:d1" and v]
        return (
            statuses[-1] if statuses and statuses[-1]["event_type"] == "deletion.purged" else None
        )

    event = env.wait_until(purged_status, "deletion.purged on deletion.status")
    assert set(event["purged"]) == PLACES and event["purged_at"] is not None
    assert all(store["purged_at"] for store in event["stores"].values()), event
