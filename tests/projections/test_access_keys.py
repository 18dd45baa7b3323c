"""API keys: their form, and the store against the real PostgreSQL (only hashes stored)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import pytest

from projections.access import keys
from projections.sql import Conn
from support.environment import Env


def test_a_token_parses_into_its_id_and_secret() -> None:
    token, key_id, secret = keys.new_token()
    assert token == f"mpk_{key_id}_{secret}"
    assert keys.parse_key(token) == keys.PresentedKey(key_id, secret)
    for malformed in ("", "mpk_", f"mpk_{key_id}", f"xpk_{key_id}_{secret}", f"mpk_{key_id}_x"):
        assert keys.parse_key(malformed) is None
    assert keys.parse_key(f"mpk_{key_id.upper()}_{secret}") is None


@pytest.mark.integration
def test_keys_are_stored_as_hashes_and_revocation_refuses_them(env: Env) -> None:
    now = datetime.now(UTC)

    async def work(conn: Conn) -> None:
        created = await keys.create_key(conn, "acme", "agent:bot", ["support", "support"], now)
        assert created.key.purposes == ("support",)
        assert await keys.authenticate(conn, created.token) == created.key
        secret = keys.parse_key(created.token)
        assert secret is not None
        cursor = await conn.execute(
            "SELECT secret_sha256 FROM api_keys WHERE key_id = %s", (created.key.key_id,)
        )
        (stored,) = await cursor.fetchone() or (None,)
        assert bytes(stored) == hashlib.sha256(secret.secret.encode()).digest()
        forged = created.token[:-1] + ("A" if created.token[-1] != "A" else "B")
        assert await keys.authenticate(conn, forged) is None
        other = await keys.create_key(conn, "globex", "agent:bot", ["support"], now)
        assert [k.key_id for k in await keys.list_keys(conn, "acme")] == [created.key.key_id]
        assert len(await keys.list_keys(conn)) == 2
        revoked = await keys.revoke_key(conn, created.key.key_id, now)
        assert revoked is not None and revoked.revoked
        assert await keys.authenticate(conn, created.token) is None
        assert await keys.authenticate(conn, other.token) == other.key
        assert await keys.revoke_key(conn, "0" * 16, now) is None
        with pytest.raises(ValueError):
            await keys.create_key(conn, "acme", "agent:bot", [], now)

    env.run(work)
