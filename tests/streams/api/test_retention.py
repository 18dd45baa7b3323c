"""Legal holds and the retention receipt through the API: an erasure of a held subject is a
409 naming the hold, recorded by the ledger as refused; the receipt needs the admin purpose."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner

from projections.access.proposals import DELETE
from projections.retention import holds
from streams.api.routes.retention import ADMIN
from streams.cli import cli
from support.api_server import ApiServer
from support.deletion_scenario import ALICE
from support.environment import Env, settings_environment

pytestmark = pytest.mark.integration


def test_a_held_subject_is_refused_by_name_and_the_receipt_is_for_admins(
    env: Env, serve_api: Callable[..., ApiServer]
) -> None:
    env.start("deletion")
    api = serve_api(env)
    tenant = api.tenant()
    key = api.create_key(tenant, [DELETE], actor="agent:a")
    admin = api.create_key(tenant, [ADMIN], actor="operator:o")

    async def hold(conn: object) -> holds.Hold:
        added = await holds.add(
            conn,  # type: ignore[arg-type]
            tenant, "subject", ALICE[1], ALICE[0], "litigation 14", "ops", datetime.now(UTC),
        )  # fmt: skip
        await conn.commit()  # type: ignore[attr-defined]
        return added

    held = env.run(hold)
    with api.client(key.token) as client:
        answer = client.post(
            "/v1/deletions",
            json={
                "target": {"type": "subject", "id": ALICE[1], "subject_type": ALICE[0]},
                "reason": "right to be forgotten",
            },
        )
    assert answer.status_code == 409, answer.text
    assert held.hold_id in answer.text and "litigation 14" in answer.text
    deletion_id = answer.text.split("recorded as deletion ")[1].split('"')[0]

    def refused() -> str | None:
        with api.client(key.token) as client:
            found = client.get(f"/v1/deletions/{deletion_id}")
        return found.text if found.status_code == 409 else None

    assert held.hold_id in api.wait_for(refused, "the ledger's refusal", seconds=60)
    # The command line says the same.
    result = CliRunner().invoke(
        cli,
        ["delete", "subject", "--tenant", tenant, "--subject", "user:alice"],
        env=settings_environment(env.settings),
    )
    assert result.exit_code == 1 and held.hold_id in result.output, result.output

    with api.client(key.token) as client:
        assert client.get("/v1/retention/report").status_code == 403
    with api.client(admin.token) as client:
        receipt = client.get("/v1/retention/report")
    assert receipt.status_code == 200, receipt.text
    assert receipt.json()["classes"] == []
