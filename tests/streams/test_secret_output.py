"""No secret in what memproj prints: the CLI's output and a worker's log, against the
real stack, hold neither the PostgreSQL password nor any master key."""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import SecretStr

from streams.cli import cli
from streams.sample import sample_memory_stream
from topics.registry import MEMORY_EVENTS

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# The local stack trusts local connections, so any password connects; this one is only looked
# for in the output.
PASSWORD = "pg-password-marker-7c1e9a"
KEY_RAW = b"secret-output-test-master-key-00"
KEY = base64.b64encode(KEY_RAW).decode()
OLD_KEY = base64.b64encode(b"secret-output-test-master-key-01").decode()
COMMANDS = (
    ["deletion", "list", "--json"],
    ["top", "--once", "--interval", "0.2"],
    ["demo", "report", "--no-wait"],
    ["demo", "report", "--no-wait", "--json"],
    ["keys", "status"],
    ["keys", "rotate", "--json"],
    ["dlq", "list", "--json"],
    ["offsets", "show", "memory"],
)


def leaked(text: str) -> list[str]:
    return [secret for secret in (PASSWORD, KEY, OLD_KEY, KEY[:16]) if secret in text]


def test_cli_output_and_worker_logs_hold_no_secret(env: Any) -> None:
    settings = env.settings.model_copy(
        update={
            "postgres_password": SecretStr(PASSWORD),
            "master_keys": SecretStr(f"k2:{KEY},k1:{OLD_KEY}"),
            "metrics_port": 0,
        }
    )
    env.settings = settings
    env.produce(
        env.topic(MEMORY_EVENTS), [(m.key, m.value) for m in sample_memory_stream(60, 2, 5)]
    )
    env.worker("memory")
    env.worker("deletion")
    env.wait_caught_up()

    environment = settings.as_environment()
    assert environment["MEMPROJ_POSTGRES_PASSWORD"] == PASSWORD  # the child gets it
    for command in COMMANDS:
        result = CliRunner().invoke(cli, command, env=environment)
        assert result.exit_code in (0, 1), (command, result.output, result.exception)
        assert leaked(result.output) == [], command
    # A failing command (a wrong schema) says what failed, not with what.
    failing = CliRunner().invoke(
        cli, ["dlq", "list"], env={**environment, "MEMPROJ_MASTER_KEYS": f"k2:{KEY[:-4]}"}
    )
    assert failing.exit_code != 0 and leaked(failing.output) == []
    for worker in env.workers:
        assert leaked(worker.log_path.read_text(errors="replace")) == [], worker.kind


def test_the_demo_script_prints_no_dsn_password() -> None:
    """The end of ops/demo (how to query the run), run with a DSN that holds a password."""
    script = (REPO / "ops" / "demo").read_text()
    ending = script[
        script.index('echo "To query this run yourself') : script.index("# -- the HTTP API")
    ]
    shown = subprocess.run(
        ["bash", "-c", ending],
        env={
            "PATH": os.environ["PATH"],
            "run": "demo1",
            "MEMPROJ_POSTGRES_DSN": f"postgresql://memproj:{PASSWORD}@127.0.0.1:55432/memproj",
            "MEMPROJ_TOPIC_PREFIX": "demo1.",
        },
        capture_output=True,
        text=True,
        check=True,
    )
    assert "search_path%3Ddemo1" in shown.stdout and PASSWORD not in shown.stdout
