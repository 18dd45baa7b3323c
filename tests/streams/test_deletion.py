"""Deletion end to end: ledger, tombstones to every derived store, acknowledgements,
verification, the hydration guard and no resurrection, against the real Kafka, PostgreSQL,
Redis and LanceDB."""

from __future__ import annotations

import urllib.request
from datetime import timedelta
from typing import Any

import orjson
import pytest

from projections.deletion import lifecycle as ledger
from projections.deletion import queries as blocked
from projections.deletion.verify import verify
from projections.embeddings.vectors import Match
from projections.memory import store as memory_store
from streams import reads
from support.deletion_scenario import (
    ALICE,
    BOB,
    cache_of,
    detail,
    prime_cache,
    ready,
    recent_factory,
    request,
    seed,
    semantic_recall,
    stores_of,
    vectors,
    wait_verified,
)
from support.ports import free_port
from topics.registry import (
    DELETION_ACKS,
    DELETION_REQUESTS,
    DELETION_STATUS,
    DELETION_TOMBSTONES,
    MEMORY_CURRENT,
    MEMORY_EVENTS,
    MEMORY_REJECTIONS,
)

pytestmark = pytest.mark.integration


def test_each_target_type_is_erased_everywhere_and_verified(env: Any) -> None:
    f = recent_factory()
    seed(env, f, "acme")
    seed(env, f, "other")  # the same ids in another tenant: none of it may be touched
    env.start(*ALL_KINDS)
    ready(env, "acme")
    ready(env, "other")
    prime_cache(env, "acme")
    prime_cache(env, "other")
    other_before = env.checksums()["other"]
    other_vectors = len(vectors(env).find(Match(tenant_id="other", subject=ALICE)))

    request(env, f, "acme", "d_subject", {"type": "subject", "id": "alice", "subject_type": "user"})
    request(env, f, "acme", "d_conversation", {"type": "conversation", "id": "c_bob"})
    request(env, f, "acme", "d_memory", {"type": "memory", "id": "mem_sport"})

    for deletion_id in ("d_subject", "d_conversation", "d_memory"):
        found = wait_verified(env, "acme", deletion_id)
        assert found["status"] == "completed", found
        assert found["verification"]["clean"], found["verification"]
        assert {s["status"] for s in found["stores"].values()} == {"done"}
    subject = detail(env, "acme", "d_subject")
    assert subject is not None
    assert set(subject["stores"]) == {"embeddings", "summaries", "cache", "context"}
    assert subject["items"] == {
        "context": 1,
        "conversation": 1,
        "memory": 3,
        "message": 2,
        "summary": 1,
    }
    # The cache entries may already have gone with the memory.current nulls (cache freshness);
    # either way, the verification above found none.
    assert set(detail(env, "acme", "d_memory")["stores"]) == {"embeddings", "cache"}  # type: ignore[index]

    with env.connect() as conn:
        assert (
            conn.execute("SELECT memory_id FROM memories WHERE tenant_id = 'acme'").fetchall() == []
        )  # all five: alice's two, the derived one, c_bob's, the erased one
        assert conn.execute(
            "SELECT count(*) FROM conversation_messages WHERE tenant_id = 'acme'"
        ).fetchone() == (0,)
    assert vectors(env).find(Match(tenant_id="acme", subject=ALICE)) == []
    assert vectors(env).find(Match(tenant_id="acme", subject=BOB)) == []
    current = {key: value for key, value in env.read(MEMORY_CURRENT)}
    assert current[b"acme:mem_allergy"] is None and current[b"acme:mem_from_alice"] is None
    # Tenant B is untouched.
    assert env.checksums()["other"] == other_before
    assert len(vectors(env).find(Match(tenant_id="other", subject=ALICE))) == other_vectors

    async def other_cache_alive(conn: Any) -> list[str]:
        return await cache_of(env).reachable("other", subject=ALICE)

    assert env.run(other_cache_alive)


def test_a_stopped_store_keeps_the_request_pending_and_the_guard_blocks_ghosts(env: Any) -> None:
    f = recent_factory()
    seed(env, f)
    workers = env.start(*(kind for kind in ALL_KINDS if kind != "deletion"))
    deletion_port = free_port()
    env.worker("deletion", metrics_port=deletion_port)
    ready(env)
    before = semantic_recall(env, "acme", ALICE, "peanuts allergy")
    assert "mem_allergy" in [r.memory_id for r in before.records]

    workers["embeddings"].stop()
    request(
        env,
        f,
        "acme",
        "d_alice",
        {"type": "subject", "id": "alice", "subject_type": "user"},
        deadline=timedelta(seconds=3),
    )

    def others_done() -> bool:
        found = detail(env, "acme", "d_alice")
        stores = found["stores"] if found else {}
        return bool(stores) and all(
            state["status"] == "done" for name, state in stores.items() if name != "embeddings"
        )

    env.wait_until(others_done, "the stores that are running to acknowledge")
    pending = detail(env, "acme", "d_alice")
    assert pending is not None and pending["status"] == "pending"
    assert pending["stores"]["embeddings"]["status"] == "pending"

    # The vector is still in the store (its worker is down), but recall never serves it.
    ghosts = semantic_recall(env, "acme", ALICE, "peanuts allergy")
    assert ghosts.records == []
    assert ghosts.blocked["embeddings"]["erased"] >= 1
    assert vectors(env).find(Match(tenant_id="acme", subject=ALICE))  # the ghost is there
    assert env.run(blocked.blocked_reads)["embeddings"] >= 1

    def redelivered() -> dict[str, Any] | None:
        found = detail(env, "acme", "d_alice")
        return found if found and found["stores"]["embeddings"]["redeliveries"] >= 1 else None

    env.wait_until(redelivered, "the overdue tombstone to be redelivered", 30)
    statuses = [value for key, value in env.read(DELETION_STATUS) if key == b"acme:d_alice"]
    assert any(s["event_type"] == "deletion.overdue" for s in statuses)
    overdue = next(s for s in statuses if s["event_type"] == "deletion.overdue")
    assert overdue["stores"]["embeddings"]["status"] == "overdue"
    redeliveries = [
        value
        for key, value in env.read(DELETION_TOMBSTONES)
        if key == b"acme:d_alice" and value["for_stores"] == ["embeddings"]
    ]
    assert redeliveries

    def exported() -> str | None:
        text = (
            urllib.request.urlopen(f"http://127.0.0.1:{deletion_port}/metrics", timeout=5)
            .read()
            .decode()
        )
        wanted = 'memproj_deletions_pending{store="embeddings"} 1.0'
        return text if wanted in text and "memproj_ghost_reads_blocked_total" in text else None

    metrics = env.wait_until(exported, "the deletion metrics")
    assert 'memproj_ghost_reads_blocked_total{store="embeddings"}' in metrics

    env.worker("embeddings")
    found = wait_verified(env, "acme", "d_alice")
    assert found["status"] == "completed" and found["verification"]["clean"], found
    assert vectors(env).find(Match(tenant_id="acme", subject=ALICE)) == []
    assert vectors(env).history_versions() == 0


def test_a_lagging_context_store_never_serves_or_recaches_the_deleted_view(env: Any) -> None:
    f = recent_factory()
    seed(env, f)
    workers = env.start(*ALL_KINDS)
    ready(env)
    assert env.run(lambda conn: reads.context_view(conn, cache_of(env), "acme", "c_alice"))

    workers["context"].stop()
    request(env, f, "acme", "d_c_alice", {"type": "conversation", "id": "c_alice"})

    def others_done() -> bool:
        found = detail(env, "acme", "d_c_alice")
        stores = found["stores"] if found else {}
        return bool(stores) and all(
            state["status"] == "done" for name, state in stores.items() if name != "context"
        )

    env.wait_until(others_done, "the stores that are running to acknowledge")
    with env.connect() as conn:  # the view is still there: its worker is down
        assert conn.execute(
            "SELECT count(*) FROM conversation_context WHERE conversation_id = 'c_alice'"
        ).fetchone() == (1,)
    blocked_before = env.run(blocked.blocked_reads).get("context", 0)

    async def read_view(conn: Any) -> Any:
        return await reads.context_view(conn, cache_of(env), "acme", "c_alice")

    assert env.run(read_view) is None
    assert env.run(blocked.blocked_reads)["context"] == blocked_before + 1
    assert env.run(lambda conn: cache_of(env).get_context("acme", "c_alice")) is None

    env.worker("context")
    found = wait_verified(env, "acme", "d_c_alice")
    assert found["status"] == "completed" and found["verification"]["clean"], found


def test_nothing_erased_comes_back(env: Any) -> None:
    f = recent_factory()
    seed(env, f)
    env.start(*ALL_KINDS)
    ready(env)
    current = {key: value for key, value in env.read(MEMORY_CURRENT)}
    old_record = current[b"acme:mem_allergy"]
    late_correction = f.corrected("acme", "mem_allergy", 1, {"text": "allergic to cashews"})
    # A memory about Alice the deletion never knew: the sealer gives it a data key, since
    # nothing in the event says its subject is erased; the projection refuses it and
    # destroys that key.
    late_unknown = f.proposed("acme", "mem_late", ALICE, {"text": "LATE-SECRET"})

    request(env, f, "acme", "d_alice", {"type": "subject", "id": "alice", "subject_type": "user"})
    completed = wait_verified(env, "acme", "d_alice")
    assert completed["verification"]["clean"]

    # A late event that occurred before the cut-off, an index update arriving after the
    # tombstone, and the tombstone and an acknowledgement delivered twice.
    env.produce_events([late_correction, late_unknown])
    env.produce(env.topic(MEMORY_CURRENT), [(b"acme:mem_allergy", orjson.dumps(old_record))])
    tombstone = next(
        (key, value) for key, value in env.read(DELETION_TOMBSTONES) if key == b"acme:d_alice"
    )
    env.produce(env.topic(DELETION_TOMBSTONES), [(tombstone[0], orjson.dumps(tombstone[1]))])
    ack = next(value for key, value in env.read(DELETION_ACKS) if key == b"acme:d_alice")
    env.produce(env.topic(DELETION_ACKS), [(b"acme:d_alice", orjson.dumps(ack))])
    # New data after the cut-off is accepted: a new memory about Alice.
    env.produce_events([f.proposed("acme", "mem_new", ALICE, {"text": "started learning piano"})])

    def refused() -> list[dict[str, Any]] | None:
        erased = [v for _, v in env.read(MEMORY_REJECTIONS) if v["reason"] == "erased"]
        return erased if len(erased) >= 3 else None

    erased = env.wait_until(refused, "the late event and the late index update to be refused")
    assert {(r["entity_id"], r["event_type"]) for r in erased} == {
        ("mem_allergy", "memory.corrected"),
        ("mem_allergy", "memory.current"),
        ("mem_late", "memory.proposed"),
    }
    with env.connect() as conn:
        assert conn.execute(
            "SELECT count(*) FROM entity_keys WHERE entity_id = 'mem_late'"
        ).fetchone() == (0,)
        assert conn.execute(
            "SELECT deletion_id FROM shredded_keys WHERE entity_id = 'mem_late'"
        ).fetchall() == [("d_alice",)]
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    env.wait_caught_up(DELETION_REQUESTS, "deletion")
    wait_indexed_memory(env, "mem_new")
    assert env.run(lambda c: memory_store.load_memory(c, "acme", "mem_allergy")) is None
    assert env.run(lambda c: memory_store.load_memory(c, "acme", "mem_new")) is not None
    assert vectors(env).find(Match(tenant_id="acme", memory_ids=("mem_allergy",))) == []
    assert detail(env, "acme", "d_alice") == completed  # the duplicates changed nothing


def wait_indexed_memory(env: Any, memory_id: str) -> None:
    store = vectors(env)
    env.wait_until(
        lambda: store.find(Match(tenant_id="acme", memory_ids=(memory_id,))),
        f"{memory_id} to be indexed",
    )


def test_revocation_leaves_every_derived_store(env: Any) -> None:
    f = recent_factory()
    seed(env, f)
    env.start(*ALL_KINDS)
    ready(env)
    prime_cache(env, "acme")
    env.produce_events([f.revoked("acme", "mem_city", "user said it is wrong")])

    def revocation() -> list[dict[str, Any]] | None:
        rows = env.run(lambda conn: ledger.list_requests(conn, "acme", False))
        done = [r for r in rows if r["kind"] == "revocation" and r["verified_at"] is not None]
        return done or None

    (row,) = env.wait_until(revocation, "the revocation to fan out and be verified")
    found = detail(env, "acme", row["deletion_id"])
    assert found is not None and found["verification"]["clean"], found
    assert vectors(env).find(Match(tenant_id="acme", memory_ids=("mem_city",))) == []
    # A revocation keeps the authoritative row and its history; an erasure would not.
    record = env.run(lambda c: memory_store.load_memory(c, "acme", "mem_city"))
    assert record is not None and record.status == "revoked"


def test_a_crash_between_the_ledger_and_publishing_still_publishes_the_tombstone(env: Any) -> None:
    f = recent_factory()
    seed(env, f)
    env.start("memory", "conversation", "embeddings", "summaries", "cache", "context")
    ready(env)
    victim = env.worker("deletion", failpoint="deletion:after_commit")
    request(env, f, "acme", "d_alice", {"type": "subject", "id": "alice", "subject_type": "user"})
    assert victim.process is not None
    assert victim.process.wait(60) == -9  # killed right after the ledger transaction committed
    recorded = detail(env, "acme", "d_alice")
    assert recorded is not None and recorded["status"] == "pending"
    assert not [key for key, _ in env.read(DELETION_TOMBSTONES)]  # not published yet

    env.worker("deletion")
    found = wait_verified(env, "acme", "d_alice")
    assert found["verification"]["clean"]
    tombstones = [v for key, v in env.read(DELETION_TOMBSTONES) if key == b"acme:d_alice"]
    assert tombstones and all(t == tombstones[0] for t in tombstones)
    assert tombstones[0]["items"] and tombstones[0]["required_stores"] == [
        "embeddings",
        "summaries",
        "cache",
        "context",
    ]


def test_a_recall_after_the_erasure_leaves_the_verification_clean(env: Any) -> None:
    f = recent_factory()
    seed(env, f, "acme")
    env.start(*ALL_KINDS)
    ready(env, "acme")
    prime_cache(env, "acme")
    request(env, f, "acme", "d_alice", {"type": "subject", "id": "alice", "subject_type": "user"})
    assert wait_verified(env, "acme", "d_alice")["verification"]["clean"]

    # Recall for Alice after her erasure: the (empty) entry is cached under her subject.
    prime_cache(env, "acme")

    async def under_alice(conn: Any) -> list[str]:
        return await cache_of(env).reachable("acme", subject=ALICE)

    assert env.run(under_alice)

    async def verified_again(conn: Any) -> dict[str, Any]:
        return await verify(conn, stores_of(env), "acme", "d_alice")

    found = env.run(verified_again)
    assert found["found"]["cache"] == [], found
    assert found["clean"], found


ALL_KINDS = ("memory", "conversation", "deletion", "embeddings", "summaries", "cache", "context")
