"""Every ``memproj`` command that talks to Kafka goes through the workers' startup check: with
a wrong password, an untrusted CA or a principal without ACLs it ends within seconds, non-zero,
with one line naming the cause and the broker, never a traceback. Run as an operator runs
them (``python -m streams``), against the local broker's SASL_SSL listener."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from streams.cli import cli
from support.environment import REPO
from support.kafka_users import secure_environment

pytestmark = pytest.mark.integration

# Each command that talks to Kafka, with arguments that would make it work; what it needs
# besides Kafka (a schema, a topic) is never reached. Exit 2: the audit's "could not look".
COMMANDS: dict[str, tuple[list[str], int]] = {
    "topics create": (["topics", "create"], 1),
    "delete subject": (["delete", "subject", "--subject", "user:alice", "--tenant", "acme"], 1),
    "delete conversation": (["delete", "conversation", "--conversation", "c", "--tenant", "a"], 1),
    "delete memory": (["delete", "memory", "--memory-id", "m", "--tenant", "acme"], 1),
    "review approve": (
        [
            "review",
            "approve",
            "--tenant",
            "acme",
            "m",
            "--version",
            "1",
            "--reviewer-type",
            "operator",
            "--reviewer-id",
            "ana",
        ],
        1,
    ),
    "review reject": (
        [
            "review",
            "reject",
            "--tenant",
            "acme",
            "m",
            "--version",
            "1",
            "--reviewer-type",
            "user",
            "--reviewer-id",
            "owner",
        ],
        1,
    ),
    "top": (["top", "--once"], 1),
    "offsets show": (["offsets", "show", "memory"], 1),
    "offsets reset": (["offsets", "reset", "memory", "--to", "earliest"], 1),
    "replay": (["replay", "memory"], 1),
    "demo produce": (["demo", "produce"], 1),
    "demo clean": (["demo", "clean", "--before", "demo1"], 1),
    "demo report": (["demo", "report", "--no-wait"], 1),
    "demo review": (["demo", "review"], 1),
    "dlq list": (["dlq", "list"], 1),
    "dlq show": (["dlq", "show", "memory.events.dlq", "0", "0"], 1),
    "dlq replay": (["dlq", "replay", "--topic", "memory.events.dlq", "--dry-run"], 1),
    "audit plaintext": (["audit", "plaintext", "--source", "kafka", "a-marker"], 2),
    "worker": (["worker", "memory"], 1),
}
# Commands that check Kafka inside their own error handling, or at the worker's start.
CHECKED_INSIDE = {"audit plaintext", "worker"}
WRONG_PASSWORD = "not-the-password"


def commands_of(group: click.Group, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from commands_of(command, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", command


def test_every_command_marked_as_talking_to_kafka_is_tested_here() -> None:
    marked = {
        name
        for name, command in commands_of(cli)
        if getattr(command.callback, "talks_to_kafka", False)
    }
    assert marked | CHECKED_INSIDE == set(COMMANDS)


@pytest.fixture(scope="module")
def untrusted_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA that did not sign the broker's certificate."""
    folder = tmp_path_factory.mktemp("ca")
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=not the stack CA", "-keyout", str(folder / "k.pem")),
            *("-out", str(folder / "ca.pem")),
        ],
        check=True,
        capture_output=True,
    )
    return folder / "ca.pem"


def run(arguments: list[str], changes: dict[str, str], tmp_path: Path) -> tuple[int, str]:
    environment = {
        name: value for name, value in os.environ.items() if not name.startswith("MEMPROJ_")
    }
    environment.update(secure_environment("memproj"))
    environment |= {"MEMPROJ_ENVIRONMENT": "local", "MEMPROJ_DATA_DIR": str(tmp_path)}
    environment |= {"MEMPROJ_POSTGRES_DSN": "postgresql://nobody@127.0.0.1:1/none"}
    environment.update(changes)
    done = subprocess.run(
        [sys.executable, "-m", "streams", *arguments],
        env=environment,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,  # generous: the check names a refusal within seconds
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("credentials", ["wrong password", "untrusted CA"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_refused_by_kafka_ends_with_one_line_naming_the_cause_and_the_broker(
    command: str, credentials: str, untrusted_ca: Path, tmp_path: Path
) -> None:
    if credentials == "wrong password":
        (tmp_path / "wrong.password").write_text(WRONG_PASSWORD + "\n")
        changes = {"MEMPROJ_KAFKA_PASSWORD_FILE": str(tmp_path / "wrong.password")}
        cause = "authentication failed (wrong username or password?)"
    else:
        changes = {"MEMPROJ_KAFKA_CA_FILE": str(untrusted_ca)}
        cause = "TLS handshake failed (untrusted or mismatched certificate?)"
    arguments, status = COMMANDS[command]
    exit_status, output = run(arguments, changes, tmp_path)
    assert exit_status == status, output
    assert "Traceback" not in output, output
    [line] = output.strip().splitlines()
    assert cause in line, line
    assert secure_environment("memproj")["MEMPROJ_KAFKA_BOOTSTRAP"] in line, line
    assert WRONG_PASSWORD not in line


@pytest.mark.parametrize(
    "command", ["topics create", "delete subject", "review approve", "offsets show"]
)
def test_a_command_without_acls_ends_with_one_line_naming_them(
    command: str, tmp_path: Path
) -> None:
    arguments, status = COMMANDS[command]
    exit_status, output = run(arguments, secure_environment("intruder"), tmp_path)
    assert exit_status == status, output
    assert "Traceback" not in output, output
    [line] = output.strip().splitlines()
    assert "ACLs" in line and "'intruder'" in line, line
