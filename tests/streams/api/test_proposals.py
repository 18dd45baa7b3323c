"""Proposals through the API against the running server, the real broker and the workers:
applied as any producer's event, accepted once, refused outside the key's tenant, actor or
purpose, and validated by the contract's codec."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson
import psycopg
import pytest

from projections.access.proposals import PROPOSE
from streams.progress import end_offsets
from streams.sample import EventFactory
from support.api_server import ApiServer
from support.deletion_scenario import ALICE
from topics.registry import CONVERSATION_EVENTS, MEMORY_EVENTS, TopicSpec

pytestmark = pytest.mark.integration

# The actor of EventFactory's events, as a key names it.
ACTOR = "agent:support_agent"
MEMORY_ROUTE = "/v1/memory-events"
CONVERSATION_ROUTE = "/v1/conversation-events"


def post(server: ApiServer, token: str | None, route: str, event: Any) -> httpx.Response:
    body = event if isinstance(event, bytes) else orjson.dumps(event)
    with server.client(token) as client:
        return client.post(route, content=body, headers={"Content-Type": "application/json"})


def produced(server: ApiServer, spec: TopicSpec = MEMORY_EVENTS) -> int:
    """How many messages the topic has ever had (its end offsets: trimming keeps them)."""
    return sum(end_offsets(server.settings.kafka_bootstrap, server.env.topic(spec)).values())


def recall(server: ApiServer, token: str, subject: tuple[str, str]) -> list[dict[str, Any]]:
    with server.client(token) as client:
        answer = client.get(
            f"/v1/subjects/{subject[0]}/{subject[1]}/memories", params={"purpose": "support"}
        )
    assert answer.status_code == 200, answer.text
    memories: list[dict[str, Any]] = answer.json()["memories"]
    return memories


def test_a_proposal_through_the_api_is_applied_by_the_memory_worker(
    api: ApiServer, events: EventFactory
) -> None:
    tenant = api.tenant()
    api.set_purpose(tenant, "support")
    key = api.create_key(tenant, [PROPOSE, "support"], actor=ACTOR)
    proposal = events.proposed(tenant, "mem_api", ALICE, {"text": "wants invoices by mail"})
    answer = post(api, key.token, MEMORY_ROUTE, proposal)
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert (body["event_id"], body["status"]) == (proposal["event_id"], "accepted")
    assert body["event_type"] == "memory.proposed"
    api.env.wait_caught_up(MEMORY_EVENTS, "memory")
    [memory] = recall(api, key.token, ALICE)
    assert memory["memory_id"] == "mem_api"
    assert memory["value"] == {"text": "wants invoices by mail"}
    # A verification through the API, of the version the projection holds, is applied too.
    verified = post(api, key.token, MEMORY_ROUTE, events.verified(tenant, "mem_api", 1))
    assert verified.status_code == 202, verified.text
    api.env.wait_caught_up(MEMORY_EVENTS, "memory")
    # (Recall's cached answer waits for the cache worker, which this env does not run.)
    with api.client(key.token) as client:
        detail = client.get("/v1/memories/mem_api", params={"purpose": "support"}).json()
    assert (detail["memory"]["status"], detail["memory"]["version"]) == ("verified", 2)
    assert [entry["actor"] for entry in detail["history"]] == [
        {"type": "agent", "id": "support_agent"}
    ] * 2


def test_the_same_event_id_is_accepted_once_and_produced_once(
    api: ApiServer, events: EventFactory
) -> None:
    tenant = api.tenant()
    key = api.create_key(tenant, [PROPOSE], actor=ACTOR)
    proposal = events.proposed(tenant, "mem_once", ALICE)
    before = produced(api)
    first = post(api, key.token, MEMORY_ROUTE, proposal)
    assert first.status_code == 202, first.text
    again = post(api, key.token, MEMORY_ROUTE, proposal)
    assert again.status_code == 200, again.text
    assert again.json()["status"] == "duplicate"
    assert again.json()["accepted_at"] == first.json()["accepted_at"]
    # Another body under an accepted id is the same event id: not produced either.
    reused = {**proposal, "payload": {**proposal["payload"], "value": {"text": "other"}}}
    assert post(api, key.token, MEMORY_ROUTE, reused).json()["status"] == "duplicate"
    assert produced(api) == before + 1


def test_concurrent_requests_with_one_event_id_produce_it_once(
    api: ApiServer, events: EventFactory
) -> None:
    tenant = api.tenant()
    key = api.create_key(tenant, [PROPOSE], actor=ACTOR)
    proposal = events.proposed(tenant, "mem_race", ALICE)
    before = produced(api)
    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(lambda _: post(api, key.token, MEMORY_ROUTE, proposal).json(), range(8))
        )
    assert sorted(answer["status"] for answer in answers) == ["accepted"] + ["duplicate"] * 7
    assert produced(api) == before + 1


def test_a_conversation_event_through_the_api_is_applied(
    api: ApiServer, events: EventFactory
) -> None:
    tenant = api.tenant()
    api.set_purpose(tenant, "support", conversations=True)
    key = api.create_key(tenant, [PROPOSE, "support"], actor=ACTOR)
    for event in (
        events.started(tenant, "c_api", ALICE),
        events.message(tenant, "c_api", "m1", "user", "send my invoices by mail, please"),
    ):
        answer = post(api, key.token, CONVERSATION_ROUTE, event)
        assert answer.status_code == 202, answer.text
    api.env.wait_caught_up(CONVERSATION_EVENTS, "conversation")
    with api.client(key.token) as client:
        shown = client.get("/v1/conversations/c_api", params={"purpose": "support"})
    assert shown.status_code == 200, shown.text
    [message] = shown.json()["messages"]
    assert message["content"] == [{"type": "text", "text": "send my invoices by mail, please"}]

    def context() -> dict[str, Any] | None:
        with api.client(key.token) as client:
            answer = client.get("/v1/conversations/c_api/context", params={"purpose": "support"})
        assert answer.status_code in (200, 404), answer.text
        return answer.json() if answer.status_code == 200 else None

    built = api.wait_for(context, "the context view of c_api")
    # The second read is answered from the cache (the first one filled it): the same view.
    assert context() == built


def test_writes_outside_the_keys_tenant_actor_or_purpose_are_refused(
    api: ApiServer, events: EventFactory
) -> None:
    tenant, other = api.tenant(), api.tenant()
    key = api.create_key(tenant, [PROPOSE], actor=ACTOR)
    reader = api.create_key(tenant, ["support"], actor=ACTOR)
    before = produced(api)
    cases = [
        (key.token, events.proposed(other, "m1", ALICE), 403, "tenant_mismatch"),
        (reader.token, events.proposed(tenant, "m1", ALICE), 403, "purpose_not_granted"),
        (
            key.token,
            {**events.proposed(tenant, "m1", ALICE), "actor": {"type": "agent", "id": "x"}},
            403,
            "actor_mismatch",
        ),
        (None, events.proposed(tenant, "m1", ALICE), 401, "unauthenticated"),
    ]
    for token, event, status, code in cases:
        answer = post(api, token, MEMORY_ROUTE, event)
        assert (answer.status_code, answer.json()["error"]["code"]) == (status, code), answer.text
    assert produced(api) == before
    # Nothing was recorded either: the event, sent right, is accepted.
    assert post(api, key.token, MEMORY_ROUTE, cases[1][1]).status_code == 202


def test_bodies_the_codec_refuses_are_422_with_its_reason(
    api: ApiServer, events: EventFactory
) -> None:
    tenant = api.tenant()
    key = api.create_key(tenant, [PROPOSE], actor=ACTOR)
    proposal = events.proposed(tenant, "m1", ALICE)
    cases = [
        (MEMORY_ROUTE, b"{not json", "malformed_json"),
        (MEMORY_ROUTE, b"[1, 2]", "malformed_json"),
        (MEMORY_ROUTE, {**proposal, "schema_version": "1"}, "invalid_event"),
        (MEMORY_ROUTE, {**proposal, "schema_version": 9}, "unknown_schema_version"),
        (MEMORY_ROUTE, events.started(tenant, "c1", ALICE), "unknown_event_type"),
        (CONVERSATION_ROUTE, proposal, "unknown_event_type"),
        (
            MEMORY_ROUTE,
            {**proposal, "payload": {**proposal["payload"], "value": {"t": "x" * 70_000}}},
            "value_too_large",
        ),
        (
            MEMORY_ROUTE,
            {**proposal, "payload": {**proposal["payload"], "value": {"t": "a\x00b"}}},
            "invalid_event",
        ),
    ]
    before = produced(api)
    for route, body, code in cases:
        answer = post(api, key.token, route, body)
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"]["code"] == code, answer.text
    assert produced(api) == before


def test_an_undelivered_proposal_is_a_503_and_records_nothing(
    api: ApiServer, serve_api: Callable[..., ApiServer], events: EventFactory
) -> None:
    tenant = api.tenant()
    key = api.create_key(tenant, [PROPOSE], actor=ACTOR)
    cut_off = serve_api(api.env, kafka_bootstrap="127.0.0.1:1", api_delivery_timeout_seconds=1.0)
    proposal = events.proposed(tenant, "mem_lost", ALICE)
    refused = post(cut_off, key.token, MEMORY_ROUTE, proposal)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "not_delivered"
    with psycopg.connect(api.settings.postgres_dsn) as conn:
        recorded = conn.execute(
            "SELECT count(*) FROM api_proposals WHERE tenant_id = %s", (tenant,)
        ).fetchone()
    assert recorded == (0,)
    # The client's retry, to a server that reaches Kafka, is a first try.
    retried = post(api, key.token, MEMORY_ROUTE, proposal)
    assert (retried.status_code, retried.json()["status"]) == (202, "accepted"), retried.text
