"""Deletions through the API, end to end: a request published to deletion.requests, carried
out by the deletion worker and every store worker, followed per store through the API, and
invisible to another tenant's key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from projections.access.proposals import DELETE, PROPOSE
from streams.progress import end_offsets
from streams.sample import EventFactory
from support.api_server import ApiServer
from support.deletion_scenario import ALICE, BOB
from support.environment import Env
from topics.registry import DELETION_REQUESTS, MEMORY_EVENTS

pytestmark = pytest.mark.integration

ALL_KINDS = ("memory", "conversation", "deletion", "embeddings", "summaries", "cache", "context")
ACTOR = "agent:support_agent"


def recall(server: ApiServer, token: str, subject: tuple[str, str]) -> list[str]:
    with server.client(token) as client:
        answer = client.get(
            f"/v1/subjects/{subject[0]}/{subject[1]}/memories", params={"purpose": "support"}
        )
    assert answer.status_code == 200, answer.text
    return [memory["memory_id"] for memory in answer.json()["memories"]]


def test_a_subject_erased_through_the_api_is_erased_everywhere_and_followed_per_store(
    env: Env, serve_api: Callable[..., ApiServer], events: EventFactory
) -> None:
    env.start(*ALL_KINDS)
    api = serve_api(env)
    tenant, other = api.tenant(), api.tenant()
    api.set_purpose(tenant, "support")
    key = api.create_key(tenant, [PROPOSE, DELETE, "support"], actor=ACTOR)
    stranger = api.create_key(other, [DELETE], actor=ACTOR)
    with api.client(key.token) as client:
        for event in (
            events.proposed(tenant, "mem_alice", ALICE, {"text": "allergic to peanuts"}),
            events.proposed(tenant, "mem_bob", BOB, {"text": "plays tennis"}),
        ):
            assert client.post("/v1/memory-events", json=event).status_code == 202
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    assert recall(api, key.token, ALICE) == ["mem_alice"]

    with api.client(key.token) as client:
        answer = client.post(
            "/v1/deletions",
            json={
                "target": {"type": "subject", "id": ALICE[1], "subject_type": ALICE[0]},
                "reason": "right to be forgotten",
                "deadline_seconds": 600,
            },
        )
    assert answer.status_code == 202, answer.text
    accepted = answer.json()
    assert accepted["tenant_id"] == tenant
    status_url = accepted["status_url"]
    assert status_url == f"/v1/deletions/{accepted['deletion_id']}"

    def verified() -> dict[str, Any] | None:
        with api.client(key.token) as client:
            found = client.get(status_url)
        if found.status_code == 404:
            return None  # not recorded by the deletion worker yet
        assert found.status_code == 200, found.text
        detail: dict[str, Any] = found.json()
        return detail if detail["verified_at"] is not None else None

    detail = api.wait_for(verified, "the deletion's verification", seconds=120)
    assert (detail["target_type"], detail["target_id"]) == ("subject", "alice")
    assert detail["kind"] == "erasure" and detail["status"] == "completed"
    assert detail["reason"] == "right to be forgotten"
    assert set(detail["stores"]) == set(detail["required_stores"])
    assert all(state["status"] == "done" for state in detail["stores"].values())
    assert detail["verification"]["clean"] is True
    assert detail["items"] == {"memory": 1}
    assert recall(api, key.token, ALICE) == []
    assert recall(api, key.token, BOB) == ["mem_bob"]

    # Another tenant's key: the same id is not there for it.
    with api.client(stranger.token) as client:
        hidden = client.get(status_url)
    assert hidden.status_code == 404, hidden.text
    assert hidden.json()["error"]["code"] == "not_found"


def test_deletion_requests_need_the_delete_purpose_and_a_valid_target(
    api: ApiServer,
) -> None:
    tenant = api.tenant()
    reader = api.create_key(tenant, ["support"], actor=ACTOR)
    deleter = api.create_key(tenant, [DELETE], actor=ACTOR)
    topic = api.env.topic(DELETION_REQUESTS)
    before = end_offsets(api.settings.kafka_bootstrap, topic)
    target = {"type": "memory", "id": "m1"}
    cases: list[tuple[str | None, dict[str, Any], int, str]] = [
        (None, {"target": target}, 401, "unauthenticated"),
        (reader.token, {"target": target}, 403, "purpose_not_granted"),
        (deleter.token, {"target": {"type": "subject", "id": "u1"}}, 422, "invalid_request"),
        (deleter.token, {"target": {"type": "tenant", "id": "x"}}, 422, "invalid_request"),
        (deleter.token, {"target": target, "deadline_seconds": 0}, 422, "invalid_request"),
        (deleter.token, {"target": target, "tenant_id": "other"}, 422, "invalid_request"),
    ]
    for token, body, status, code in cases:
        with api.client(token) as client:
            answer = client.post("/v1/deletions", json=body)
        assert (answer.status_code, answer.json()["error"]["code"]) == (status, code), answer.text
    with api.client(reader.token) as client:
        refused = client.get("/v1/deletions/del-x")
    assert refused.status_code == 403
    assert end_offsets(api.settings.kafka_bootstrap, topic) == before


def test_a_retried_deletion_with_an_idempotency_key_is_published_once(api: ApiServer) -> None:
    tenant = api.tenant()
    deleter = api.create_key(tenant, [DELETE], actor=ACTOR)
    other_key = api.create_key(tenant, [DELETE], actor=ACTOR)
    topic = api.env.topic(DELETION_REQUESTS)
    before = end_offsets(api.settings.kafka_bootstrap, topic)
    body = {"target": {"type": "memory", "id": "m1"}, "reason": "user asked"}
    retry = {"Idempotency-Key": "req-7f3a"}

    def post(token: str, json: dict[str, Any], headers: dict[str, str]) -> Any:
        with api.client(token) as client:
            return client.post("/v1/deletions", json=json, headers=headers)

    first = post(deleter.token, body, retry)
    assert first.status_code == 202, first.text
    # The same body with its keys in another order is the same request.
    again = post(deleter.token, {"reason": "user asked", "target": body["target"]}, retry)
    assert again.status_code == 202, again.text
    assert again.json() == first.json()
    published = sum(end_offsets(api.settings.kafka_bootstrap, topic).values())
    assert published - sum(before.values()) == 1

    reused = post(deleter.token, {**body, "reason": "something else"}, retry)
    assert (reused.status_code, reused.json()["error"]["code"]) == (422, "idempotency_key_reused")
    # Another key's idempotency keys are its own; no key, a new deletion each time.
    separate = post(other_key.token, body, retry)
    unkeyed = [post(deleter.token, body, {}) for _ in range(2)]
    ids = {answer.json()["deletion_id"] for answer in (first, separate, *unkeyed)}
    assert len(ids) == 4
    published = sum(end_offsets(api.settings.kafka_bootstrap, topic).values())
    assert published - sum(before.values()) == 4
