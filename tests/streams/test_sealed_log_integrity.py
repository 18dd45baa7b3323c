"""Integrity of the seal against the real stack: edited sealed events are dead
letters, and deletion probes are stored sealed and deleted by verification or at the deadline."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from projections.deletion.verify import verify
from projections.embeddings.embedder import memory_text
from projections.embeddings.vectors import memory_entry_id
from projections.sealing.fields import SEAL_FORMAT, SEAL_FORMAT_SOURCE_KEY, entity_of
from projections.sealing.sealer import Sealer
from streams.sample import EventFactory, to_message
from streams.worker import key_store, probe_sealer
from support.deletion_scenario import (
    detail,
    ready,
    recent_factory,
    request,
    seed,
    stores_of,
    wait_verified,
)
from support.embedders import embedder_of
from topics.registry import MEMORY_EVENTS, MEMORY_SEALED
from topics.schemas import default_schemas

pytestmark = pytest.mark.integration

ALL_KINDS = ("memory", "conversation", "deletion", "embeddings", "summaries", "cache", "context")


def sealed_by_the_sealer(env: Any, raws: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``raws`` as the sealer writes them to the sealed log, with data keys created in this
    test's schema: what a sealed topic holds, before anyone edits it."""
    sealer = Sealer(default_schemas(), env.settings.topics, key_store(env.settings), 65536)
    events = [sealer.codec.decode(*to_message(raw), env.topic(MEMORY_EVENTS)) for raw in raws]

    async def seal(conn: Any) -> list[dict[str, Any]]:
        state = await sealer.load(conn, events)
        await conn.commit()
        out = sealer.reduce(events, state, {})
        assert {m.topic for m in out.messages} == {env.topic(MEMORY_SEALED)}
        return [orjson.loads(m.value or b"") for m in out.messages]

    return env.run(seal)  # type: ignore[no-any-return]


def test_edited_sealed_events_are_unreadable_seal_dead_letters_and_the_rest_applied(
    env: Any,
) -> None:
    f = EventFactory()
    alice = ("user", "alice")
    raws = [
        f.proposed("acme", "ok_1", alice, {"text": "likes tea"}),
        f.proposed("acme", "edited_subject", alice, {"text": "lives in Oslo"}),
        f.proposed("acme", "ok_2", alice, {"text": "plays chess"}),
        f.proposed("acme", "edited_to_verified", alice, {"text": "speaks Norwegian"}),
        f.proposed("acme", "edited_to_corrected", alice, {"text": "owns a cat"}),
        f.proposed("acme", "edited_time", alice, {"text": "works nights", "score": 0.1}),
        f.proposed("acme", "ok_3", alice, {"text": "reads sci-fi", "score": 0.30000000000000004}),
    ]
    sealed = sealed_by_the_sealer(env, raws)
    by_id = {event["payload"]["memory_id"]: event for event in sealed}
    by_id["edited_subject"]["payload"]["subject"]["id"] = "mallory"
    # From a proposal (personal fields) to an event type without any: never applied.
    verified = by_id["edited_to_verified"]
    verified["event_type"] = "memory.verified"
    verified["payload"]["expected_version"] = 1
    by_id["edited_to_corrected"]["event_type"] = "memory.corrected"
    by_id["edited_to_corrected"]["payload"]["expected_version"] = 1
    by_id["edited_time"]["occurred_at"] = "2020-01-01T00:00:00Z"
    messages = [to_message(event) for event in sealed]
    env.produce(env.topic(MEMORY_SEALED), messages)

    # The projection reading the sealed log, as a rebuild does (the live memory worker reads
    # the raw topic since the one-hop stages).
    worker = env.worker("memory", projection_source="sealed")
    env.wait_caught_up(MEMORY_SEALED)

    dead = [letter for _, letter in env.read(MEMORY_SEALED, ".dlq")]
    assert sorted((d["key"], d["error_code"]) for d in dead) == [
        ("acme:edited_subject", "unreadable_seal"),
        ("acme:edited_time", "unreadable_seal"),
        ("acme:edited_to_corrected", "unreadable_seal"),
        ("acme:edited_to_verified", "unreadable_seal"),
    ]
    with env.connect() as conn:
        stored = dict(conn.execute("SELECT memory_id, value FROM memories").fetchall())
    assert stored == {
        "ok_1": {"text": "likes tea"},
        "ok_2": {"text": "plays chess"},
        "ok_3": {"text": "reads sci-fi", "score": 0.30000000000000004},
    }
    assert worker.alive()


def probe_rows(env: Any, deletion_id: str) -> list[tuple[Any, ...]]:
    with env.connect() as conn:
        rows: list[tuple[Any, ...]] = conn.execute(
            "SELECT item_type, item_id, vector, sealed_vector FROM deletion_probes"
            " WHERE tenant_id = 'acme' AND deletion_id = %s ORDER BY 1, 2",
            (deletion_id,),
        ).fetchall()
    return rows


def test_probes_are_sealed_searchable_and_gone_at_the_deadline_when_a_store_never_acks(
    env: Any,
) -> None:
    f = recent_factory()
    seed(env, f)
    workers = env.start(*ALL_KINDS)
    ready(env)
    workers["embeddings"].stop()  # it never acknowledges: its vectors stay, as ghosts
    request(env, f, "acme", "d_alice", {"type": "subject", "id": "alice", "subject_type": "user"})

    rows = env.wait_until(lambda: probe_rows(env, "d_alice"), "the probes of d_alice")
    assert [(t, i) for t, i, _, _ in rows] == [
        ("memory", "mem_allergy"),
        ("memory", "mem_city"),
        ("memory", "mem_from_alice"),
        ("message", "c_alice/m1"),
        ("message", "c_alice/m2"),
    ]
    # Stored sealed: no plaintext vector, nothing a guess can be compared with.
    assert all(vector is None and sealed is not None for _, _, vector, sealed in rows)
    embedder, probes = embedder_of(env.settings), probe_sealer(env.settings)
    (allergy,) = embedder.embed([memory_text({"text": "allergic to peanuts"}, "preference")])
    sealed_allergy = bytes(rows[0][3])
    assert probes.open("acme", "d_alice", "memory", "mem_allergy", sealed_allergy) == allergy

    # The verification still searches the vector store with them: the ghosts are found.
    async def verified_now(conn: Any) -> dict[str, Any]:
        return await verify(conn, stores_of(env), "acme", "d_alice")

    found = env.run(verified_now)["found"]
    assert f"content:{memory_entry_id('acme', 'mem_allergy')}" in found["embeddings"], found

    # The deadline passes with the store still silent: the probes go anyway.
    with env.connect() as conn:
        conn.execute(
            "UPDATE deletion_requests SET deadline_at = now() - interval '1 second'"
            " WHERE tenant_id = 'acme' AND deletion_id = 'd_alice'"
        )
    env.wait_until(lambda: not probe_rows(env, "d_alice"), "the probes to go at the deadline")
    pending = detail(env, "acme", "d_alice")
    assert pending is not None and pending["status"] == "pending"
    assert pending["verified_at"] is None


def test_probes_are_gone_once_the_deletion_is_verified_clean(env: Any) -> None:
    f = recent_factory()
    seed(env, f)
    env.start(*ALL_KINDS)
    ready(env)
    request(env, f, "acme", "d_alice", {"type": "subject", "id": "alice", "subject_type": "user"})
    found = wait_verified(env, "acme", "d_alice")
    assert found["verification"]["clean"], found["verification"]
    assert probe_rows(env, "d_alice") == []
    with env.connect() as conn:
        formats = conn.execute("SELECT DISTINCT wrap_format FROM entity_keys").fetchall()
    assert formats == [(2,)]  # every key this test created is wrapped in format 2
    sealed = [value for _, value in env.read(MEMORY_SEALED) if value and entity_of(value)]
    current = (SEAL_FORMAT, SEAL_FORMAT_SOURCE_KEY)
    assert sealed and all(v["payload"]["sealed"].get("v") in current for v in sealed)
