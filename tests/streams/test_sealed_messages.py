"""``conversation.messages`` sealed with the conversation's data key, against the real Kafka
and PostgreSQL: the topic holds no content readable without the key, the embeddings worker
still indexes it, and after an erasure neither the topic nor a replay of it brings anything
back."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from projections.conversation.published import PublishedMessage, parse_record
from projections.embeddings.vectors import Match, VectorStore, message_entry_id
from projections.sealing.crypto import parse_master_key
from projections.sealing.fields import EntityRef, Shredded
from projections.sealing.keys import KeyStore
from projections.sql import KeyLookups
from streams.replay_embeddings import replay_embeddings
from streams.sample import EventFactory
from support.embedders import embedder_of, vectors_of
from topics.registry import CONVERSATION_EVENTS, CONVERSATION_MESSAGES, DELETION_REQUESTS

pytestmark = pytest.mark.integration
ALICE_SAYS = "ALICE-SEALED-7f3c: I always take the night train to Vienna"
BOB_SAYS = "BOB-SEALED-2a9e: the ferry to Helsinki is my favourite"
LEGACY_SAYS = "BOB-LEGACY-5d1b: written before the topic was sealed"


def vectors(env: Any) -> VectorStore:
    return vectors_of(env.settings)


def found_by_text(env: Any, text: str) -> str | None:
    """The id of the nearest entry of acme to ``text``, when it is that text."""
    (vector,) = embedder_of(env.settings).embed([text])
    hits = vectors(env).search("acme", vector, 1)
    return hits[0].entry.id if hits and hits[0].entry.text == text else None


def published(env: Any) -> list[PublishedMessage]:
    return [parse_record(m.value or b"") for m in env.read_messages(CONVERSATION_MESSAGES)]


def data_keys(env: Any, refs: list[EntityRef]) -> dict[EntityRef, bytes]:
    keys = KeyStore(parse_master_key(env.settings.master_key), KeyLookups())

    async def load(conn: Any) -> dict[EntityRef, bytes]:
        return await keys.keys(conn, refs)

    return env.run(load)  # type: ignore[no-any-return]


def test_the_messages_topic_is_sealed_indexed_and_erased_with_the_conversation(env: Any) -> None:
    f = EventFactory(id_prefix="sm", clock=datetime.now(UTC) - timedelta(minutes=5))
    env.produce_events(
        [
            f.started("acme", "c_alice", ("user", "alice")),
            f.message("acme", "c_alice", "m1", "user", ALICE_SAYS),
            f.started("acme", "c_bob", ("user", "bob")),
            f.message("acme", "c_bob", "m1", "user", BOB_SAYS),
            f.message("acme", "c_bob", "m2", "user", "a message the legacy record replaces"),
        ],
        CONVERSATION_EVENTS,
    )
    env.start("conversation", "deletion", "summaries", "cache", "context")
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")
    env.wait_until(lambda: len(published(env)) == 3, "three records on conversation.messages")

    # The topic's bytes hold no content; its records open with the conversation's key.
    raw = b" ".join(m.value or b"" for m in env.read_messages(CONVERSATION_MESSAGES))
    assert b"ALICE-SEALED" not in raw and b"BOB-SEALED" not in raw and b"Vienna" not in raw
    records = published(env)
    assert all(r.sealed is not None and r.content is None for r in records)
    keys = data_keys(env, [r.entity for r in records])
    opened = [r.opened(keys.get(r.entity)) for r in records]
    assert {r.content[0]["text"] for r in opened if r.content} >= {ALICE_SAYS, BOB_SAYS}

    # A plaintext record as memproj wrote them before: still indexed (it comes last, so its
    # text is what the entry holds).
    legacy = {
        "tenant_id": "acme",
        "conversation_id": "c_bob",
        "message_id": "m2",
        "seq": 2,
        "role": "user",
        "content": [{"type": "text", "text": LEGACY_SAYS}],
        "occurred_at": records[-1].occurred_at.isoformat(),
        "event_id": "sm-legacy",
        "redactions": {},
        "owner_type": "user",
        "owner_id": "bob",
    }
    env.produce(env.topic(CONVERSATION_MESSAGES), [(b"acme:c_bob", orjson.dumps(legacy))])
    embeddings = env.worker("embeddings")

    alice_entry = message_entry_id("acme", "c_alice", "m1")
    assert env.wait_until(lambda: found_by_text(env, ALICE_SAYS), "alice's message indexed") == (
        alice_entry
    )
    assert found_by_text(env, BOB_SAYS) == message_entry_id("acme", "c_bob", "m1")
    env.wait_until(lambda: found_by_text(env, LEGACY_SAYS), "the legacy record indexed")

    env.produce_events(
        [f.deletion("acme", "d1", {"type": "subject", "id": "alice", "subject_type": "user"})],
        DELETION_REQUESTS,
    )

    def verified() -> bool:
        with env.connect() as conn:
            row = conn.execute("SELECT verified_at FROM deletion_requests").fetchone()
        return bool(row and row[0])

    env.wait_until(verified, "the erasure to complete")
    assert vectors(env).get("acme", [alice_entry]) == []

    # Every record of Alice's conversation on the topic is shut for good; Bob's still open.
    records = published(env)
    keys = data_keys(env, [r.entity for r in records])
    alices = [r for r in records if r.conversation_id == "c_alice"]
    assert alices
    for record in alices:
        with pytest.raises(Shredded):
            record.opened(keys.get(record.entity))
    bobs = [r.opened(keys.get(r.entity)) for r in records if r.conversation_id == "c_bob"]
    assert BOB_SAYS in {r.content[0]["text"] for r in bobs if r.content}

    # A rebuild of the vector store from the topics does not bring Alice's message back.
    embeddings.stop()
    report = asyncio.run(replay_embeddings(env.settings))
    assert report.differences == {} and report.swapped, report.to_json()
    entries = vectors(env).entries("acme")
    assert alice_entry not in {e.id for e in entries}
    assert all("ALICE-SEALED" not in e.text for e in entries)
    assert found_by_text(env, BOB_SAYS) and found_by_text(env, LEGACY_SAYS)
    # Shredded records are skipped, never dead letters.
    assert env.read_messages(CONVERSATION_MESSAGES, ".dlq") == []


def test_an_edited_record_is_dead_lettered_and_an_erased_conversation_is_skipped(
    env: Any,
) -> None:
    f = EventFactory(id_prefix="se", clock=datetime.now(UTC) - timedelta(minutes=5))
    env.produce_events(
        [
            f.started("acme", "c_gone", ("user", "carol")),
            f.message("acme", "c_gone", "m1", "user", "CAROL-SEALED-91e0: erased with it"),
            f.started("acme", "c_kept", ("user", "carol")),
            f.message("acme", "c_kept", "m1", "user", "CAROL-SEALED-44b2: kept"),
        ],
        CONVERSATION_EVENTS,
    )
    env.start("conversation", "deletion", "summaries", "cache", "context")
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")
    env.wait_until(lambda: len(published(env)) == 2, "two records on conversation.messages")
    env.produce_events(
        [f.deletion("acme", "d1", {"type": "conversation", "id": "c_gone"})], DELETION_REQUESTS
    )
    env.wait_until(lambda: env.run(_shredded_count) == 1, "the conversation's key to be shredded")
    # A sealed record edited outside its seal (another owner): it does not open.
    kept = next(
        orjson.loads(m.value or b"")
        for m in env.read_messages(CONVERSATION_MESSAGES)
        if b"c_kept" in (m.key or b"")
    )
    kept["owner_id"] = "mallory"
    env.produce(env.topic(CONVERSATION_MESSAGES), [(b"acme:c_kept", orjson.dumps(kept))])
    env.worker("embeddings")

    env.wait_until(
        lambda: found_by_text(env, "CAROL-SEALED-44b2: kept"), "the kept message indexed"
    )
    letters = env.wait_until(
        lambda: [value for _, value in env.read(CONVERSATION_MESSAGES, ".dlq")],
        "the edited record dead-lettered",
    )
    assert [letter["error_code"] for letter in letters] == ["unreadable_seal"]
    assert letters[0]["key"] == "acme:c_kept"
    # The erased conversation's record was skipped (its key is gone), not a dead letter.
    assert vectors(env).find(Match("acme", conversation_ids=("c_gone",))) == []


async def _shredded_count(conn: Any) -> int:
    # The conversation's own key (its source key is shredded with it: seal format 4).
    cursor = await conn.execute(
        "SELECT count(*) FROM shredded_keys WHERE entity_type = 'conversation'"
    )
    row = await cursor.fetchone()
    return int(row[0])
