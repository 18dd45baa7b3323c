"""``memproj keys api`` and ``memproj keys purpose`` against the real PostgreSQL."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from projections.access import keys
from streams.cli import cli
from support.environment import Env

pytestmark = pytest.mark.integration


def run(env: Env, *args: str) -> Any:
    result = CliRunner().invoke(cli, list(args), env=env.settings.as_environment())
    assert result.exit_code == 0, result.output
    return orjson.loads(result.stdout) if "--json" in args else result.stdout


def test_create_list_revoke_a_key_and_set_purposes(env: Env) -> None:
    created = run(
        env, "keys", "api", "create", "--tenant", "acme", "--actor", "agent:bot",
        "--purposes", "support, billing", "--json",
    )  # fmt: skip
    token = created["key"]
    assert keys.parse_key(token) is not None
    assert created["purposes"] == ["support", "billing"]
    listed = run(env, "keys", "api", "list", "--tenant", "acme", "--json")
    assert [k["key_id"] for k in listed] == [created["key_id"]]
    assert token not in orjson.dumps(listed).decode()  # the secret is shown once only
    assert "revoked" in run(env, "keys", "api", "revoke", created["key_id"])
    (shown,) = run(env, "keys", "api", "list", "--json")
    assert shown["revoked_at"] is not None
    missing = CliRunner().invoke(
        cli, ["keys", "api", "revoke", "0" * 16], env=env.settings.as_environment()
    )
    assert missing.exit_code == 1

    policy = run(
        env, "keys", "purpose", "set", "--tenant", "acme", "--purpose", "support",
        "--kinds", "preference,fact", "--conversations", "--json",
    )  # fmt: skip
    assert policy == {
        "tenant_id": "acme",
        "purpose": "support",
        "kinds": ["fact", "preference"],
        "scopes": ["*"],
        "conversations": True,
    }
    assert [p["purpose"] for p in run(env, "keys", "purpose", "list", "--json")] == ["support"]
    run(env, "keys", "purpose", "remove", "--tenant", "acme", "--purpose", "support")
    assert run(env, "keys", "purpose", "list", "--json") == []
