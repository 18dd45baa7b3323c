"""The read routes against the running server and the real stack: recall, search, a memory
with its history, a conversation with its summaries' sources, its context view; the tenant
canary; the purpose policy; the audit."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from streams.sample import EventFactory
from support.api_server import ApiServer
from support.deletion_scenario import ALICE, BOB

pytestmark = pytest.mark.integration


def get(server: ApiServer, token: str, path: str, **params: Any) -> httpx.Response:
    with server.client(token) as client:
        return client.get(path, params=params)


def memories_path(subject: tuple[str, str], what: str = "memories") -> str:
    return f"/v1/subjects/{subject[0]}/{subject[1]}/{what}"


def ids(answer: httpx.Response) -> list[str]:
    assert answer.status_code == 200, answer.text
    return [memory["memory_id"] for memory in answer.json()["memories"]]


def test_recall_by_exact_filters(api: ApiServer, events: EventFactory) -> None:
    tenant = api.tenant()
    api.set_purpose(tenant, "support")
    key = api.create_key(tenant, ["support"])
    api.produce_memories(
        [
            events.proposed(tenant, "mem_a", ALICE, {"text": "prefers email"}),
            events.proposed(tenant, "mem_b", ALICE, {"text": "lives in Lisbon"}, kind="fact"),
            events.proposed(tenant, "mem_c", ALICE, {"text": "team lunch"}, scope="team"),
            events.proposed(tenant, "mem_bob", BOB, {"text": "plays tennis"}),
        ]
    )
    api.produce_memories([events.verified(tenant, "mem_a", 1)])
    path = memories_path(ALICE)
    answer = get(api, key.token, path, purpose="support")
    assert ids(answer) == ["mem_c", "mem_b", "mem_a"]  # newest observation first
    assert answer.json()["blocked"] == {"total": 0, "stores": {}}
    assert ids(get(api, key.token, path, purpose="support", kind="fact")) == ["mem_b"]
    assert ids(get(api, key.token, path, purpose="support", scope="team")) == ["mem_c"]
    assert ids(get(api, key.token, path, purpose="support", status="verified")) == ["mem_a"]
    assert ids(get(api, key.token, path, purpose="support", limit=1)) == ["mem_c"]
    # Observed ten minutes ago (the factory's clock): older than a minute.
    assert ids(get(api, key.token, path, purpose="support", max_age_seconds=60)) == []
    assert ids(get(api, key.token, memories_path(BOB), purpose="support")) == ["mem_bob"]


def test_semantic_search_hydrates_and_filters(api: ApiServer, events: EventFactory) -> None:
    tenant = api.tenant()
    api.set_purpose(tenant, "support")
    key = api.create_key(tenant, ["support"])
    api.produce_memories(
        [
            events.proposed(tenant, "mem_mail", ALICE, {"text": "wants invoices by email"}),
            events.proposed(tenant, "mem_city", ALICE, {"text": "lives in Lisbon"}, kind="fact"),
            events.proposed(tenant, "mem_bob_mail", BOB, {"text": "wants invoices by email"}),
        ]
    )
    api.wait_indexed(tenant, ALICE, 2)
    path = memories_path(ALICE, "search")
    found = get(api, key.token, path, purpose="support", text="invoices by email")
    assert ids(found)[0] == "mem_mail"
    assert "mem_bob_mail" not in ids(found)  # the subject's only, before ranking
    assert found.json()["blocked"]["total"] == 0
    facts = get(api, key.token, path, purpose="support", text="invoices by email", kind="fact")
    assert ids(facts) == ["mem_city"]


def test_a_purpose_of_a_rare_kind_gets_its_limit_of_that_kind_ranked(
    api: ApiServer, events: EventFactory
) -> None:
    """The purpose's kinds and scopes confine the ranking itself: many nearer memories of
    other kinds (or scopes) never push the allowed ones out of the candidates."""
    tenant = api.tenant()
    api.set_purpose(tenant, "support")
    api.set_purpose(tenant, "billing", kinds=["billing"])
    api.set_purpose(tenant, "accounts", scopes=["account"])
    key = api.create_key(tenant, ["support", "billing", "accounts"])
    text = "wants invoices by email"
    crowd = [
        events.proposed(tenant, f"mem_pref_{n}", ALICE, {"text": f"{text}, note {n}"})
        for n in range(40)
    ]
    rare = [
        events.proposed(tenant, "mem_bill_mail", ALICE, {"text": text}, kind="billing"),
        events.proposed(
            tenant, "mem_bill_post", ALICE, {"text": "invoices by post"}, kind="billing"
        ),
        events.proposed(tenant, "mem_bill_card", ALICE, {"text": "pays by card"}, kind="billing"),
        events.proposed(tenant, "mem_bill_plan", ALICE, {"text": "annual plan"}, kind="billing"),
    ]
    accounts = [
        events.proposed(tenant, "mem_acc_mail", ALICE, {"text": text}, scope="account"),
        events.proposed(
            tenant, "mem_acc_city", ALICE, {"text": "office in Porto"}, scope="account"
        ),
        events.proposed(tenant, "mem_acc_owner", ALICE, {"text": "owner is Dana"}, scope="account"),
    ]
    api.produce_memories([*crowd, *rare, *accounts])
    api.wait_indexed(tenant, ALICE, len(crowd) + len(rare) + len(accounts))
    path = memories_path(ALICE, "search")

    billing = get(api, key.token, path, purpose="billing", text=text, limit=3)
    found = ids(billing)
    assert len(found) == 3 and set(found) <= {m["payload"]["memory_id"] for m in rare}, found
    assert found[0] == "mem_bill_mail"  # ranked: the nearest first
    assert {memory["kind"] for memory in billing.json()["memories"]} == {"billing"}
    assert billing.json()["blocked"]["total"] == 0
    assert len(ids(get(api, key.token, path, purpose="billing", text=text, limit=10))) == 4

    by_scope = get(api, key.token, path, purpose="accounts", text=text, limit=3)
    assert set(ids(by_scope)) == {"mem_acc_mail", "mem_acc_city", "mem_acc_owner"}
    assert ids(by_scope)[0] == "mem_acc_mail"
    # The request's own filters confine the ranking as the purpose's do.
    asked = get(api, key.token, path, purpose="support", text=text, limit=3, scope="account")
    assert ids(asked) == ids(by_scope)
    asked = get(api, key.token, path, purpose="support", text=text, limit=2, kind="billing")
    assert ids(asked) == found[:2]


def test_a_memory_with_its_provenance_and_history(api: ApiServer, events: EventFactory) -> None:
    tenant = api.tenant()
    api.set_purpose(tenant, "support")
    key = api.create_key(tenant, ["support"])
    api.produce_memories(
        [events.proposed(tenant, "mem_h", ALICE, {"text": "v1"}, source=("crm", "contact/1"))]
    )
    api.produce_memories([events.corrected(tenant, "mem_h", 1, {"text": "v2"})])
    answer = get(api, key.token, "/v1/memories/mem_h", purpose="support")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["memory"]["version"] == 2 and body["memory"]["value"] == {"text": "v2"}
    assert body["eligible"] is True
    history = body["history"]
    assert [(v["version"], v["event_type"]) for v in history] == [
        (1, "memory.proposed"),
        (2, "memory.corrected"),
    ]
    assert history[0]["source"] == {"type": "crm", "ref": "contact/1"}
    assert history[0]["superseded_at"] is not None and history[1]["superseded_at"] is None
    missing = get(api, key.token, "/v1/memories/mem_nothing", purpose="support")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"


def seed_conversation(api: ApiServer, events: EventFactory, tenant: str) -> None:
    api.produce_conversation(
        [
            events.started(tenant, "c_1", ALICE),
            events.message(tenant, "c_1", "m1", "user", "I am allergic to peanuts"),
            events.message(tenant, "c_1", "m2", "assistant", "Noted: no peanuts."),
            events.summary(tenant, "c_1", 1, "Alice is allergic to peanuts.", ["m1", "m2"]),
        ]
    )


def wait_context(api: ApiServer, token: str, conversation: str) -> dict[str, Any]:
    def built() -> dict[str, Any] | None:
        answer = get(api, token, f"/v1/conversations/{conversation}/context", purpose="support")
        return answer.json() if answer.status_code == 200 else None

    found: dict[str, Any] = api.wait_for(built, f"the context view of {conversation}")
    return found


def test_a_conversation_and_its_context_view(api: ApiServer, events: EventFactory) -> None:
    tenant = api.tenant()
    api.set_purpose(tenant, "support", conversations=True)
    key = api.create_key(tenant, ["support"])
    seed_conversation(api, events, tenant)
    answer = get(api, key.token, "/v1/conversations/c_1", purpose="support")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [m["message_id"] for m in body["messages"]] == ["m1", "m2"]
    (summary,) = body["summaries"]
    assert [s["message_id"] for s in summary["sources"]] == ["m1", "m2"]
    view = wait_context(api, key.token, "c_1")
    assert view["conversation_id"] == "c_1"
    assert view["view"]["items"], view
    assert get(api, key.token, "/v1/conversations/c_none", purpose="support").status_code == 404


def test_tenant_canary(api: ApiServer, events: EventFactory) -> None:
    """Tenant B's key never sees tenant A's memory, message, summary or context, whatever the
    request says."""
    tenant_a, tenant_b = api.tenant(), api.tenant()
    for tenant in (tenant_a, tenant_b):
        api.set_purpose(tenant, "support", conversations=True)
    key_a = api.create_key(tenant_a, ["support"])
    key_b = api.create_key(tenant_b, ["support"])
    api.produce_memories(
        [events.proposed(tenant_a, "mem_secret", ALICE, {"text": "A hidden fact"})]
    )
    seed_conversation(api, events, tenant_a)
    api.wait_indexed(tenant_a, ALICE, 2)  # the memory and a message
    wait_context(api, key_a.token, "c_1")
    assert ids(get(api, key_a.token, memories_path(ALICE), purpose="support")) == ["mem_secret"]

    # Whatever B's request names: another tenant as a parameter, a header, a path.
    tries: list[dict[str, Any]] = [
        {"purpose": "support"},
        {"purpose": "support", "tenant_id": tenant_a},
        {"purpose": "support", "tenant": tenant_a},
    ]
    headers = {"X-Tenant-Id": tenant_a, "X-Memproj-Tenant": tenant_a}
    with api.client(key_b.token) as client:
        client.headers.update(headers)
        for params in tries:
            recall = client.get(memories_path(ALICE), params=params)
            assert ids(recall) == []
            search = client.get(memories_path(ALICE, "search"), params={**params, "text": "secret"})
            assert ids(search) == []
            for path in (
                "/v1/memories/mem_secret",
                "/v1/conversations/c_1",
                "/v1/conversations/c_1/context",
            ):
                answer = client.get(path, params=params)
                assert answer.status_code == 404, (path, answer.text)
                assert "hidden" not in answer.text.lower()
                assert "peanut" not in answer.text.lower()
    # A's key with B's tenant named reads A's own, never B's (the key decides).
    named_b = get(api, key_a.token, memories_path(ALICE), purpose="support", tenant_id=tenant_b)
    assert ids(named_b) == ["mem_secret"]


def test_two_purposes_of_one_key_see_different_memories(
    api: ApiServer, events: EventFactory
) -> None:
    """'Drafting an internal note' and 'messaging the customer' read the same subject."""
    tenant = api.tenant()
    api.set_purpose(tenant, "internal_note", kinds=["preference", "risk"], scopes=["*"])
    api.set_purpose(tenant, "message_customer", kinds=["preference"], scopes=["user"])
    key = api.create_key(tenant, ["internal_note", "message_customer"])
    api.produce_memories(
        [
            events.proposed(tenant, "mem_pref", ALICE, {"text": "prefers email"}),
            events.proposed(tenant, "mem_risk", ALICE, {"text": "fraud flag"}, kind="risk"),
            events.proposed(
                tenant, "mem_team", ALICE, {"text": "escalate to tier 2"}, scope="team"
            ),
        ]
    )
    api.wait_indexed(tenant, ALICE, 3)
    path = memories_path(ALICE)
    assert ids(get(api, key.token, path, purpose="internal_note")) == [
        "mem_team",
        "mem_risk",
        "mem_pref",
    ]
    assert ids(get(api, key.token, path, purpose="message_customer")) == ["mem_pref"]
    search = memories_path(ALICE, "search")
    assert "mem_risk" in ids(get(api, key.token, search, purpose="internal_note", text="fraud"))
    assert ids(get(api, key.token, search, purpose="message_customer", text="fraud flag")) == [
        "mem_pref"
    ]
    # Naming what the purpose may not read is refused, not answered with less.
    refused = get(api, key.token, path, purpose="message_customer", kind="risk")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "kind_not_allowed"
    assert get(api, key.token, path, purpose="message_customer", scope="team").status_code == 403
    hidden = get(api, key.token, "/v1/memories/mem_risk", purpose="message_customer")
    assert hidden.status_code == 403
    assert get(api, key.token, "/v1/memories/mem_risk", purpose="internal_note").status_code == 200
    # Neither purpose reads conversations.
    assert get(api, key.token, "/v1/conversations/c_1", purpose="internal_note").status_code == 403


def test_purposes_outside_the_key_or_without_a_policy(api: ApiServer, events: EventFactory) -> None:
    tenant = api.tenant()
    api.set_purpose(tenant, "support")
    api.set_purpose(tenant, "billing")
    key = api.create_key(tenant, ["support", "unconfigured"])
    path = memories_path(ALICE)
    unknown = get(api, key.token, path, purpose="marketing")
    assert unknown.status_code == 403
    assert unknown.json() == {
        "error": {"code": "purpose_not_granted", "message": "this key has no purpose 'marketing'"}
    }
    # Another purpose of the tenant, not of this key.
    assert get(api, key.token, path, purpose="billing").status_code == 403
    no_policy = get(api, key.token, path, purpose="unconfigured")
    assert no_policy.status_code == 403
    assert no_policy.json()["error"]["code"] == "purpose_without_policy"
    with api.client(key.token) as client:
        missing = client.get(path)
    assert missing.status_code == 422
    assert missing.json()["error"]["code"] == "invalid_request"


def test_keys_missing_malformed_unknown_or_revoked_are_refused(api: ApiServer) -> None:
    tenant = api.tenant()
    api.set_purpose(tenant, "support")
    key = api.create_key(tenant, ["support"])
    path = memories_path(ALICE)
    assert get(api, key.token, path, purpose="support").status_code == 200
    forged = key.token[:-4] + ("AAAA" if not key.token.endswith("AAAA") else "BBBB")
    for header in (None, "Bearer", "Bearer mpk_nothing", f"Bearer {forged}", "Basic abc"):
        with api.client() as client:
            headers = {"Authorization": header} if header is not None else {}
            answer = client.get(path, params={"purpose": "support"}, headers=headers)
        assert answer.status_code == 401, (header, answer.text)
        assert answer.json()["error"]["code"] == "unauthenticated"
        assert answer.headers["WWW-Authenticate"] == "Bearer"
    api.revoke(key.key.key_id)
    revoked = get(api, key.token, path, purpose="support")
    assert revoked.status_code == 401
    assert revoked.json()["error"]["message"] == "invalid or revoked API key"


def test_every_read_is_audited_by_ids_never_content(api: ApiServer, events: EventFactory) -> None:
    tenant = api.tenant()
    api.set_purpose(tenant, "message_customer", kinds=["preference"])
    key = api.create_key(tenant, ["message_customer"], actor="agent:mailer")
    marker = "zebra-crossing-7731"
    api.produce_memories(
        [
            events.proposed(tenant, "mem_ok", ALICE, {"text": f"prefers email {marker}"}),
            events.proposed(tenant, "mem_no", ALICE, {"text": f"risky {marker}"}, kind="risk"),
        ]
    )
    api.wait_indexed(tenant, ALICE, 2)
    assert ids(get(api, key.token, memories_path(ALICE), purpose="message_customer")) == ["mem_ok"]
    search = get(
        api, key.token, memories_path(ALICE, "search"), purpose="message_customer", text=marker
    )
    assert ids(search) == ["mem_ok"]
    refused = get(api, key.token, memories_path(ALICE), purpose="message_customer", kind="risk")
    assert refused.status_code == 403
    rows = api.audit_rows(tenant)
    assert [(r["route"], r["decision"]) for r in rows] == [
        ("/v1/subjects/{subject_type}/{subject_id}/memories", "allowed"),
        ("/v1/subjects/{subject_type}/{subject_id}/search", "allowed"),
        ("/v1/subjects/{subject_type}/{subject_id}/memories", "denied"),
    ]
    recall_row, search_row, denied_row = rows
    assert recall_row["key_id"] == key.key.key_id
    assert recall_row["actor"] == "agent:mailer"
    assert recall_row["purpose"] == "message_customer"
    assert recall_row["subject"] == "user:alice"
    assert recall_row["returned_ids"] == ["mem_ok"]
    assert search_row["returned_ids"] == ["mem_ok"]
    # Never a candidate: the purpose confines the ranking itself, so nothing was filtered.
    assert search_row["filtered_ids"] == []
    assert denied_row["returned_ids"] == [] and denied_row["filtered_ids"] == []
    for row in rows:
        assert marker not in repr(row) and "prefers" not in repr(row)


def test_hostile_parameters_are_refused_not_failed(api: ApiServer) -> None:
    """What PostgreSQL cannot store (NUL), no purpose holds (control characters) or no id
    holds (past 128 characters) is a 422, never a 500. (A control character is a valid memory
    scope or kind: the contract allows it, tests/streams/api/test_ids.py.)"""
    tenant = api.tenant()
    api.set_purpose(tenant, "support")
    key = api.create_key(tenant, ["support"])
    path = memories_path(ALICE)
    for params in (
        {"purpose": "sup\x00port"},
        {"purpose": "support", "kind": "a\x00"},
        {"purpose": "sup\x1b[31mport"},
        {"purpose": "support", "scope": "s" * 129},
        {"purpose": "support", "limit": 0},
        {"purpose": "support", "limit": 10_000},
        {"purpose": "support", "max_age_seconds": "nan"},
        {"purpose": "support", "status": "revoked"},
    ):
        answer = get(api, key.token, path, **params)
        assert answer.status_code == 422, (params, answer.text)
        assert answer.json()["error"]["code"] == "invalid_request"
    assert get(api, key.token, "/v1/memories/m%00x", purpose="support").status_code == 422
    assert get(api, key.token, "/v1/nothing", purpose="support").status_code == 404
