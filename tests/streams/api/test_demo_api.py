"""The end of the demo: ``memproj demo api`` creates a key and prints a curl of recall and of
search; the printed commands work against the demo's server."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from streams.cli.demo import DEMO_PURPOSE, curl_lines
from streams.sample import EventFactory
from support.api_server import ApiServer
from support.deletion_scenario import ALICE, BOB
from support.environment import REPO, Env, settings_environment
from topics.registry import MEMORY_EVENTS

pytestmark = pytest.mark.integration


def test_the_curl_lines_quote_what_a_shell_would_split() -> None:
    recall, search = curl_lines(
        "http://127.0.0.1:8080/", "mpk_k_s", ("user", "a b"), "demo", "what's up?"
    )
    assert recall == (
        "curl -s -H 'Authorization: Bearer mpk_k_s'"
        " 'http://127.0.0.1:8080/v1/subjects/user/a%20b/memories?purpose=demo'"
    )
    assert search.endswith("/v1/subjects/user/a%20b/search?purpose=demo&text=what%27s+up%3F'")


def run_curl(line: str) -> Any:
    assert line.startswith("curl "), line
    shown = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def test_the_demos_printed_curls_answer_with_its_key(
    env: Env, serve_api: Callable[..., ApiServer], events: EventFactory
) -> None:
    env.start("memory", "embeddings")
    env.produce_events(
        [
            events.proposed("acme", "m_email", ALICE, {"text": "prefers email receipts"}),
            events.proposed("acme", "m_tea", ALICE, {"text": "drinks tea"}, kind="fact"),
            events.proposed("acme", "m_bob", BOB, {"text": "plays tennis"}),
        ],
        MEMORY_EVENTS,
    )
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    api = serve_api(env)
    api.wait_indexed("acme", ALICE, 2)
    shown = subprocess.run(
        [sys.executable, "-m", "streams", "demo", "api", "--url", api.url],
        env={**settings_environment(env.settings), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=True,
    )
    *_, recall_line, search_line = shown.stdout.strip().splitlines()
    assert f"purpose={DEMO_PURPOSE}" in recall_line
    recalled = run_curl(recall_line)
    assert sorted(m["memory_id"] for m in recalled["memories"]) == ["m_email", "m_tea"]
    searched = run_curl(search_line)
    assert {m["memory_id"] for m in searched["memories"]} <= {"m_email", "m_tea"}
    assert searched["memories"], searched
