"""Master-key rotation against the real stack: data written under key A, rotated to
key B while the workers apply events, A removed, the workers restarted: everything opens, an
erasure still shreds, and a shredded key stays shredded."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from pydantic import SecretStr

from projections.sealing.fields import Shredded, sealing_keys, unseal
from projections.sealing.keys import KeyStore
from projections.sealing.probes import ProbeSealer
from projections.sql import KeyLookups
from streams.cli import cli
from streams.replay import replay_projection
from streams.sample import sample_conversation_stream, sample_memory_stream
from streams.settings import Settings
from streams.worker import memory_projection
from support.deletion_scenario import ALICE, recent_factory, request, seed
from support.environment import stop_all
from topics.outputs import DeadLetter
from topics.registry import CONVERSATION_EVENTS, CONVERSATION_SEALED, MEMORY_EVENTS, MEMORY_SEALED

pytestmark = pytest.mark.integration

KEY_A = base64.b64encode(b"rotation-test-master-key-A------").decode()
KEY_B = base64.b64encode(b"rotation-test-master-key-B------").decode()
KINDS = ("memory", "conversation", "deletion")


def with_keys(settings: Settings, keys: str) -> Settings:
    # Its settings are the test's own (support.environment.isolated_settings): the sample streams'
    # expiring memories are not erased mid-test, so that the shredded events counted are the
    # test's erasures alone.
    return settings.model_copy(update={"master_keys": SecretStr(keys)})


def restart(env: Any, settings: Settings) -> None:
    """Every worker stopped, and started again with ``settings``."""
    stop_all(env.workers)
    env.workers.clear()
    env.settings = settings
    for kind in KINDS:
        env.worker(kind)


def run_cli(settings: Settings, *args: str) -> Any:
    result = CliRunner().invoke(cli, [*args, "--json"], env=settings.as_environment())
    assert result.exit_code == 0, result.output
    return orjson.loads(result.output)


def produce_streams(env: Any, seed_number: int) -> None:
    env.produce(
        env.topic(MEMORY_EVENTS),
        [(m.key, m.value) for m in sample_memory_stream(150, 2, seed_number)],
    )
    env.produce(
        env.topic(CONVERSATION_EVENTS),
        [(m.key, m.value) for m in sample_conversation_stream(15, 2, seed_number)],
    )


def caught_up(env: Any) -> None:
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")


def master_key_ids(env: Any) -> dict[str, dict[str, int]]:
    with env.connect() as conn:
        found: dict[str, dict[str, int]] = {}
        for table, live in (
            ("entity_keys", "true"),
            ("dead_letter_keys", "wrapped_key IS NOT NULL"),
        ):
            rows = conn.execute(
                f"SELECT master_key_id, count(*) FROM {table} WHERE {live} GROUP BY 1"
            ).fetchall()
            found[table] = dict(rows)
        return found


def open_sealed_log(env: Any, settings: Settings) -> tuple[int, int]:
    """(events that open, events whose key is shredded) of both sealed logs, with the data keys
    unwrapped by ``settings``' master keys only."""
    keys = KeyStore(settings.worker_master_keys(), KeyLookups())
    events = [raw for spec in (MEMORY_SEALED, CONVERSATION_SEALED) for _, raw in env.read(spec)]
    refs = [ref for raw in events if raw for ref in sealing_keys(raw)]
    available = env.run(lambda conn: keys.keys(conn, refs))
    opened = shredded = 0
    for raw in events:
        if not raw or not sealing_keys(raw):
            continue
        try:
            unseal(raw, available.get)
            opened += 1
        except Shredded:
            shredded += 1
    return opened, shredded


def test_a_rotation_moves_every_key_to_the_new_master_key_while_workers_run(env: Any) -> None:
    under_a = with_keys(env.settings, f"ka:{KEY_A}")
    both = with_keys(env.settings, f"kb:{KEY_B},ka:{KEY_A}")
    under_b = with_keys(env.settings, f"kb:{KEY_B}")
    f = recent_factory()

    # 1. Data under key A: memories, conversations, the sealed logs and a dead letter.
    seed(env, f)
    produce_streams(env, 11)
    env.produce(env.topic(MEMORY_EVENTS), [(b"acme:m_broken", b'{"value": "no end')])
    env.settings = under_a
    for kind in KINDS:
        env.worker(kind)
    caught_up(env)
    before = master_key_ids(env)
    assert set(before["entity_keys"]) == {"ka"} and set(before["dead_letter_keys"]) == {"ka"}
    letter_keys = before["dead_letter_keys"]["ka"]  # the broken one and the samples' own

    # 2. Every worker gets key B as the newest, then the rotation runs while they apply events.
    restart(env, both)
    produce_streams(env, 12)
    report = run_cli(both, "keys", "rotate", "--batch", "7")
    assert report["complete"], report
    assert report["rewrapped_from"]["entity_keys"] == {"ka": sum(before["entity_keys"].values())}
    assert report["rewrapped_from"]["dead_letter_keys"] == {"ka": letter_keys}
    caught_up(env)
    assert run_cli(both, "keys", "status")["complete"]
    again = run_cli(both, "keys", "rotate")  # idempotent: nothing left to move
    assert again["complete"] and again["rewrapped"]["entity_keys"] == 0

    # 3. Key A removed, the workers restarted: new events for the old memories apply.
    restart(env, under_b)
    produce_streams(env, 11)  # the same ids again: their data keys must unwrap under B
    caught_up(env)
    after = master_key_ids(env)
    assert set(after["entity_keys"]) == {"kb"} and set(after["dead_letter_keys"]) == {"kb"}
    assert all(w.alive() for w in env.workers), [w.log_tail() for w in env.workers]

    # Every sealed event opens with B alone, and a rebuild from the sealed log matches.
    opened, shredded = open_sealed_log(env, under_b)
    assert opened > 300 and shredded == 0
    rebuilt = asyncio.run(replay_projection(under_b, memory_projection(under_b), swap="never"))
    assert rebuilt.events > 0 and rebuilt.differences == {}, rebuilt.to_json()

    # The dead letter opens with B alone.
    letters = [
        DeadLetter.model_validate_json(m.value or b"")
        for m in env.read_messages(MEMORY_EVENTS, ".dlq")
    ]
    [letter] = [lt for lt in letters if lt.key == "acme:m_broken"]
    shown = run_cli(
        under_b, "dlq", "show", env.topic(MEMORY_EVENTS), str(letter.partition), str(letter.offset)
    )
    assert [s["state"] for s in shown] == ["open"] and "no end" in shown[0]["original"]["text"]

    # 4. An erasure after the rotation shreds; another rotation brings nothing back.
    target = {"type": "subject", "id": ALICE[1], "subject_type": ALICE[0]}
    request(env, f, "acme", "del-after-rotation", target)

    def shredded_rows() -> int | None:
        with env.connect() as conn:
            (count,) = conn.execute(
                "SELECT count(*) FROM shredded_keys WHERE deletion_id = 'del-after-rotation'"
            ).fetchone()
        return count or None

    shredded_count = env.wait_until(shredded_rows, "the erasure to shred Alice's keys")
    assert run_cli(under_b, "keys", "rotate")["complete"]
    with env.connect() as conn:
        back = conn.execute(
            "SELECT count(*) FROM entity_keys e JOIN shredded_keys s USING"
            " (tenant_id, entity_type, entity_id) WHERE s.deletion_id = 'del-after-rotation'"
            " AND e.created_at < s.shredded_at"
        ).fetchone()
    assert back == (0,)
    opened_after, shredded_after = open_sealed_log(env, under_b)
    assert shredded_after > 0 and shredded_count > 0
    assert opened_after + shredded_after == opened + shredded
    for log_path in env.tmp_path.glob("worker-*.log"):  # no worker logged a master key
        log = log_path.read_text(errors="replace")
        assert KEY_A not in log and KEY_B not in log, log_path.name


def test_a_rotation_reseals_deletion_probes_in_batches(env: Any) -> None:
    old, rotating = (
        with_keys(env.settings, f"ka:{KEY_A}"),
        with_keys(env.settings, f"kb:{KEY_B},ka:{KEY_A}"),
    )
    sealer = ProbeSealer(old.worker_master_keys())
    rows = [("acme", "d1", "memory", f"m{i}") for i in range(5)]
    with env.connect() as conn:
        for where in rows:
            conn.execute(
                "INSERT INTO deletion_probes (tenant_id, deletion_id, item_type, item_id,"
                " sealed_vector) VALUES (%s, %s, %s, %s, %s)",
                (*where, sealer.seal(*where, [float(len(where[3]))])),
            )
    report = run_cli(rotating, "keys", "rotate", "--batch", "2")
    assert report["rewrapped"]["probes"] == 5 and report["complete"], report
    new_only = ProbeSealer(with_keys(env.settings, f"kb:{KEY_B}").worker_master_keys())
    with env.connect() as conn:
        stored = conn.execute(
            "SELECT tenant_id, deletion_id, item_type, item_id, sealed_vector FROM deletion_probes"
        ).fetchall()
    opened = [new_only.open(t, d, kind, i, bytes(sealed)) for t, d, kind, i, sealed in stored]
    assert opened == [[2.0]] * 5
    assert run_cli(rotating, "keys", "rotate")["rewrapped"]["probes"] == 0
