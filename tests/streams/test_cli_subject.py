"""``memproj subject`` and the pause tables against the real PostgreSQL (and, for the
erasure, the deletion worker on Kafka): pause, resume, list and log; a repeated pause or a
resume of a subject not paused changes nothing; the reason's credentials are masked; an
erasure of the subject replaces its reasons and leaves the pause in force."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result

from projections.access import pauses
from streams.cli import cli
from streams.sample import EventFactory
from support.deletion_scenario import ALICE, BOB, detail
from support.environment import Env
from topics.registry import DELETION_REQUESTS

pytestmark = pytest.mark.integration


def memproj(env: Env, *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env=env.settings.as_environment())


def ok(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return result.stdout


def pause(env: Env, subject: str, reason: str) -> Result:
    return memproj(
        env, "subject", "pause", "--tenant", "acme", "--subject", subject, "--reason", reason,
        "--operator", "ops:ana",
    )  # fmt: skip


def test_pause_resume_list_and_log(env: Env) -> None:
    assert "paused user:alice" in ok(pause(env, "user:alice", "suspected poisoning"))
    # A second pause changes nothing and logs nothing: the first one stands.
    assert "paused already" in ok(pause(env, "user:alice", "again"))
    ok(pause(env, "user:bob", "token=abcdef0123456789abcdef0123456789 leaked in a memory"))
    listed = orjson.loads(ok(memproj(env, "subject", "list", "--tenant", "acme", "--json")))
    assert [(p["subject_id"], p["paused_by"]) for p in listed] == [
        ("alice", "ops:ana"),
        ("bob", "ops:ana"),
    ]
    resumed = memproj(
        env, "subject", "resume", "--tenant", "acme", "--subject-type", "user",
        "--subject-id", "alice", "--reason", "cleaned", "--operator", "ops:ben",
    )  # fmt: skip
    assert "resumed user:alice" in ok(resumed)
    not_paused = memproj(
        env, "subject", "resume", "--tenant", "acme", "--subject", "user:alice", "--reason", "x"
    )
    assert not_paused.exit_code == 1 and "is not paused" in not_paused.output
    log = orjson.loads(
        ok(memproj(env, "subject", "log", "--tenant", "acme", "--subject", "user:alice", "--json"))
    )
    assert [(e["action"], e["operator"], e["reason"]) for e in log] == [
        ("pause", "ops:ana", "suspected poisoning"),
        ("resume", "ops:ben", "cleaned"),
    ]
    [bob] = env.run(lambda conn: pauses.log_of(conn, "acme", BOB))
    assert "abcdef0123456789" not in bob.reason and "[REDACTED:" in bob.reason
    assert "user:bob" in ok(memproj(env, "subject", "list"))


def test_an_erasure_replaces_the_reasons_and_leaves_the_pause(env: Env) -> None:
    ok(pause(env, "user:alice", "Alice Martins complained about a wrong memory"))
    ok(pause(env, "user:bob", "Bob's memories look poisoned"))
    env.start("deletion")
    f = EventFactory(id_prefix="erase", clock=datetime.now(UTC))
    target = {"type": "subject", "id": "alice", "subject_type": "user"}
    env.produce_events([f.deletion("acme", "d_alice", target)], DELETION_REQUESTS)
    env.wait_until(lambda: detail(env, "acme", "d_alice"), "the erasure to be recorded")
    [alice] = env.run(lambda conn: pauses.log_of(conn, "acme", ALICE))
    assert (alice.action, alice.operator) == ("pause", "ops:ana")
    assert alice.reason == pauses.ERASED_REASON
    assert alice.reason_erased_at is not None
    # The pause holds ids only and stays in force; another subject's log is untouched.
    assert env.run(lambda conn: pauses.is_paused(conn, "acme", *ALICE))
    [bob] = env.run(lambda conn: pauses.log_of(conn, "acme", BOB))
    assert bob.reason == "Bob's memories look poisoned"


def test_keys_api_write_bounds(env: Env) -> None:
    creating = memproj(
        env, "keys", "api", "create", "--tenant", "acme", "--actor", "agent:bot",
        "--purposes", "propose,support", "--write-kinds", "preference,fact", "--json",
    )  # fmt: skip
    created = orjson.loads(ok(creating))
    assert created["write_bounds"] == {"kinds": ["fact", "preference"], "scopes": ["*"]}
    key_id = created["key_id"]
    ok(memproj(env, "keys", "api", "bound", key_id, "--write-scopes", "support"))
    [listed] = orjson.loads(ok(memproj(env, "keys", "api", "list", "--json")))
    assert listed["write_bounds"] == {"kinds": ["*"], "scopes": ["support"]}
    assert "writes kinds *, scopes support" in ok(memproj(env, "keys", "api", "list"))
    ok(memproj(env, "keys", "api", "bound", key_id, "--unbounded"))
    [listed] = orjson.loads(ok(memproj(env, "keys", "api", "list", "--json")))
    assert listed["write_bounds"] is None
    neither = memproj(env, "keys", "api", "bound", key_id)
    assert neither.exit_code == 2 and "--unbounded" in neither.output
    missing = memproj(env, "keys", "api", "bound", "0" * 16, "--unbounded")
    assert missing.exit_code == 1
