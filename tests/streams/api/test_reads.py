"""The read routes against the running server and the real stack."""

from __future__ import annotations

from typing import Any

import pytest

from streams.sample import EventFactory
from support.api_server import ApiServer
from support.deletion_scenario import ALICE

pytestmark = pytest.mark.integration


def recall(server: ApiServer, token: str, subject: tuple[str, str], **params: Any) -> Any:
    with server.client(token) as client:
        return client.get(f"/v1/subjects/{subject[0]}/{subject[1]}/memories", params=params)


def test_recall_returns_the_subjects_memories(api: ApiServer, events: EventFactory) -> None:
    tenant = api.tenant()
    api.set_purpose(tenant, "support")
    key = api.create_key(tenant, ["support"])
    api.produce_memories(
        [
            events.proposed(tenant, "mem_a", ALICE, {"text": "prefers email"}),
            events.proposed(tenant, "mem_b", ALICE, {"text": "lives in Lisbon"}, kind="fact"),
        ]
    )
    answer = recall(api, key.token, ALICE, purpose="support")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [m["memory_id"] for m in body["memories"]] == ["mem_b", "mem_a"]
    assert body["blocked"] == {"total": 0, "stores": {}}
    only_facts = recall(api, key.token, ALICE, purpose="support", kind="fact").json()
    assert [m["memory_id"] for m in only_facts["memories"]] == ["mem_b"]
