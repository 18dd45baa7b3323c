"""Dead letters against the real stack: no plaintext on the DLQ topics, ``memproj dlq`` opens
and replays them while their keys live, an erasure of their owner (even of a malformed copy)
shuts them, and the deletion worker destroys expired keys."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from projections.deadletters.keys import save_keys
from projections.deadletters.sealing import DEAD_LETTER_RETENTION, LetterSealer, Position
from projections.sealing.crypto import parse_master_key
from projections.sql import Conn, KeyLookups
from streams.cli.dlq import dlq
from streams.sample import to_message
from support.deadletters import open_topic_letters
from support.deletion_scenario import recent_factory, request
from topics.codec import encode
from topics.outputs import DeadLetter, DeadLetterReason
from topics.registry import DLQ_SUFFIX, MEMORY_EVENTS, MEMORY_SEALED

pytestmark = pytest.mark.integration

ALICE_MARKER = "alice-dlq-marker-4f1c"
BOB_MARKER = "bob-dlq-marker-93ad"


def run_dlq(env: Any, *args: str) -> Any:
    result = CliRunner().invoke(dlq, [*args, "--json"], obj=env.settings, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return orjson.loads(result.output)


def key_rows(env: Any) -> dict[tuple[str, int], tuple[bool, str | None]]:
    """(source topic, offset) -> (the key is stored, the deletion that erased it)."""
    with env.connect() as conn:
        rows = conn.execute(
            'SELECT topic, "offset", wrapped_key IS NOT NULL, erased_by FROM dead_letter_keys'
        ).fetchall()
    return {(topic, offset): (stored, erased_by) for topic, offset, stored, erased_by in rows}


def test_dead_letters_hold_no_plaintext_open_replay_and_are_erased_with_their_owner(
    env: Any,
) -> None:
    f = recent_factory()
    good = f.proposed("acme", "m_good", subject=("user", "alice"))
    # Malformed copies that still name their subject: an invalid field, the marker in the value.
    alice_bad = f.proposed("acme", "m_alice", subject=("user", "alice"), value={"s": ALICE_MARKER})
    alice_bad["payload"]["observed_at"] = "not a time"
    bob_bad = f.proposed("acme", "m_bob", subject=("user", "bob"), value={"s": BOB_MARKER})
    bob_bad["payload"]["observed_at"] = "not a time"
    # Not JSON at all: only its key names the memory.
    broken = (b"acme:m_broken", b'{"value": "' + ALICE_MARKER.encode() + b" and no end")
    env.produce(
        env.topic(MEMORY_EVENTS),
        [to_message(good), to_message(alice_bad), to_message(bob_bad), broken],
    )
    # The test reads the raw topic back to see the replayed copy: the memory worker (which
    # seals it) keeps it.
    env.worker("memory", raw_input_trim_seconds=0)
    env.worker("deletion")
    env.wait_caught_up()

    # 1. Nothing on the DLQ topics reads as the message: no marker in any value or key.
    raw = env.read_messages(MEMORY_EVENTS, DLQ_SUFFIX) + env.read_messages(
        MEMORY_SEALED, DLQ_SUFFIX
    )
    assert len(raw) == 3
    for message in raw:
        for marker in (ALICE_MARKER, BOB_MARKER):
            assert marker.encode() not in (message.value or b"") + (message.key or b"")
        letter = DeadLetter.model_validate_json(message.value or b"")
        assert letter.original == "" and letter.sealed_original is not None
        assert letter.error.endswith("(detail sealed)")

    # 2. `memproj dlq list` counts them; `show` opens one while its key lives.
    summary = run_dlq(env, "list")
    rows = {
        r["error_code"]: (r["count"], r["states"])
        for r in summary
        if r["topic"] == env.topic(MEMORY_EVENTS) + DLQ_SUFFIX
    }
    assert rows == {"invalid_event": (2, {"open": 2}), "malformed_json": (1, {"open": 1})}
    by_key = {v.letter.key: v for v in open_topic_letters(env, MEMORY_EVENTS)}
    alice = by_key["acme:m_alice"].letter
    shown = run_dlq(env, "show", env.topic(MEMORY_EVENTS), str(alice.partition), str(alice.offset))
    [shown] = shown
    assert shown["state"] == "open"
    assert ALICE_MARKER in shown["original"]["text"]
    assert shown["original_key"] == {"text": "acme:m_alice"}
    assert "observed_at" in shown["detail"]

    # 3. `replay` produces the opened original again, to its topic, with its key.
    replayed = run_dlq(
        env, "replay", "--topic", env.topic(MEMORY_EVENTS), "--offset", str(alice.offset),
        "--partition", str(alice.partition),
    )  # fmt: skip
    assert replayed["replayed"] == 1 and replayed["skipped"] == {}
    copies = [
        m
        for m in env.read_messages(MEMORY_EVENTS)
        if (m.key, m.value) == (to_message(alice_bad)[0], to_message(alice_bad)[1])
    ]
    assert len(copies) == 2

    # 4. Erasing Alice shuts her letters (the replayed copy's too, once dead-lettered again),
    # erasing a memory shuts the letter keyed by it; Bob's still opens.
    env.wait_until(
        lambda: len(env.read_messages(MEMORY_EVENTS, DLQ_SUFFIX)) == 4 or None,
        "the replayed copy's dead letter",
    )
    # Occurs before the erasure (the factory's clock advances), arrives after it (step 5).
    late = f.proposed("acme", "m_late", subject=("user", "alice"), value={"s": ALICE_MARKER})
    late["payload"]["observed_at"] = "not a time"
    request(env, f, "acme", "d_alice", {"type": "subject", "id": "alice", "subject_type": "user"})
    request(env, f, "acme", "d_broken", {"type": "memory", "id": "m_broken"})

    def erased() -> bool | None:
        states = [v.state for v in open_topic_letters(env, MEMORY_EVENTS)]
        return sorted(states) == ["erased"] * 3 + ["open"] or None

    env.wait_until(erased, "the erasures to reach the dead letters")
    views = open_topic_letters(env, MEMORY_EVENTS)
    assert {(v.letter.key, v.state) for v in views} == {
        ("acme:m_alice", "erased"),
        ("acme:m_broken", "erased"),
        ("acme:m_bob", "open"),
    }
    assert {v.erased_by for v in views if v.state == "erased"} == {"d_alice", "d_broken"}
    [shown] = run_dlq(
        env, "show", env.topic(MEMORY_EVENTS), str(alice.partition), str(alice.offset)
    )
    assert shown["state"] == "erased" and "original" not in shown
    # The erased row keeps no owner: only that it was erased, until it expires.
    with env.connect() as conn:
        owners = conn.execute(
            "SELECT subject_id, memory_id, message_key FROM dead_letter_keys"
            " WHERE erased_by IS NOT NULL"
        ).fetchall()
    assert owners and all(row == (None, None, None) for row in owners)

    # 5. A malformed copy about Alice that occurred before her erasure and arrives after it is
    # born erased.
    env.produce(env.topic(MEMORY_EVENTS), [to_message(late)])
    env.wait_until(
        lambda: (
            any(v.letter.key == "acme:m_late" for v in open_topic_letters(env, MEMORY_EVENTS))
            or None
        ),
        "the late copy's dead letter",
    )
    [late_view] = [
        v for v in open_topic_letters(env, MEMORY_EVENTS) if v.letter.key == "acme:m_late"
    ]
    assert late_view.state == "erased" and late_view.erased_by == "d_alice"

    # 6. A replay skips what no longer opens, and says why.
    report = run_dlq(env, "replay", "--topic", env.topic(MEMORY_EVENTS), "--dry-run")
    assert report["would_replay"] == 1 and report["skipped"] == {"erased": 4}


def test_the_deletion_worker_destroys_expired_letter_keys(env: Any) -> None:
    sealer = LetterSealer(parse_master_key(env.settings.master_key))
    topic = env.topic(MEMORY_EVENTS)
    now = datetime.now(UTC)
    letters = []
    for offset, failed_at in ((1, now - DEAD_LETTER_RETENTION - timedelta(minutes=1)), (2, now)):
        sealed, row = sealer.seal(Position(topic, 0, offset), b"acme:m", b"{}", "d", failed_at)
        letters.append((row, sealed))

    async def save(conn: Conn) -> None:
        async with conn.transaction():
            await save_keys(conn, [row for row, _ in letters], KeyLookups())

    env.run(save)

    def letter(row: Any, sealed: Any) -> bytes:
        return encode(
            DeadLetter(
                original="", topic=topic, partition=0, offset=row.offset, error="e",
                error_code=DeadLetterReason.INVALID_EVENT, key="acme:m",
                failed_at=row.failed_at, sealed_original=sealed,
            )
        )  # fmt: skip

    env.produce(topic + DLQ_SUFFIX, [(b"acme:m", letter(row, sealed)) for row, sealed in letters])
    assert set(key_rows(env)) == {(topic, 1), (topic, 2)}
    env.worker("deletion")
    env.wait_until(lambda: set(key_rows(env)) == {(topic, 2)} or None, "the expired key to go")
    states = {v.letter.offset: v.state for v in open_topic_letters(env, MEMORY_EVENTS)}
    assert states == {1: "expired", 2: "open"}
