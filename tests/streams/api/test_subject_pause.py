"""Subject pause against the running API server, the workers and the real stack: while a
subject is paused no read path serves it (the API's recall, search, memory, conversation and
context routes answer 423 ``subject_paused``; the CLI's recall and context view refuse; a
cached answer is not served), its new events are still applied, the refusals are audited,
and a resume serves everything again, the events applied meanwhile included."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from projections.access import pauses
from projections.cache.store import RedisCache
from projections.cache.store import connect as connect_redis
from projections.memory import store as memory_store
from streams.cli import cli
from streams.sample import EventFactory
from support.api_server import ApiServer
from support.deletion_scenario import ALICE, BOB

pytestmark = pytest.mark.integration

PURPOSE = "support"


def get(server: ApiServer, token: str, path: str, **params: Any) -> httpx.Response:
    with server.client(token) as client:
        return client.get(path, params={"purpose": PURPOSE, **params})


def subject_path(subject: tuple[str, str], what: str = "memories") -> str:
    return f"/v1/subjects/{subject[0]}/{subject[1]}/{what}"


def ids(answer: httpx.Response) -> list[str]:
    assert answer.status_code == 200, answer.text
    return sorted(memory["memory_id"] for memory in answer.json()["memories"])


def memproj(server: ApiServer, *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env=server.settings.as_environment())


def cached_entries(server: ApiServer, tenant: str) -> list[tuple[str, dict[str, Any]]]:
    async def read() -> list[tuple[str, dict[str, Any]]]:
        redis = connect_redis(server.settings.redis_url)
        try:
            cache = RedisCache(redis, 300, server.settings.cache_namespace)
            return await cache.entries(tenant)
        finally:
            await redis.aclose()

    return asyncio.run(read())


def read_paths(server: ApiServer, token: str) -> dict[str, httpx.Response]:
    """Every API read of Alice's memories and of the conversation she owns."""
    return {
        "recall": get(server, token, subject_path(ALICE)),
        "search": get(server, token, subject_path(ALICE, "search"), text="invoices by email"),
        "memory": get(server, token, "/v1/memories/mem_mail"),
        "conversation": get(server, token, "/v1/conversations/c_alice"),
        "context": get(server, token, "/v1/conversations/c_alice/context"),
    }


def test_a_paused_subject_is_served_by_no_read_path_until_resumed(
    api: ApiServer, events: EventFactory
) -> None:
    tenant = api.tenant()
    api.set_purpose(tenant, PURPOSE, conversations=True)
    key = api.create_key(tenant, [PURPOSE])
    api.produce_memories(
        [
            events.proposed(tenant, "mem_mail", ALICE, {"text": "wants invoices by email"}),
            events.proposed(tenant, "mem_city", ALICE, {"text": "lives in Lisbon"}, kind="fact"),
            events.proposed(tenant, "mem_bob", BOB, {"text": "plays tennis"}),
        ]
    )
    api.produce_conversation(
        [
            events.started(tenant, "c_alice", ALICE),
            events.message(tenant, "c_alice", "m1", "user", "send my invoices by email"),
        ]
    )
    api.wait_indexed(tenant, ALICE, 2)
    api.wait_for(
        lambda: get(api, key.token, "/v1/conversations/c_alice/context").status_code == 200,
        "the context view of c_alice",
    )
    before = read_paths(api, key.token)
    assert {name: answer.status_code for name, answer in before.items()} == dict.fromkeys(
        before, 200
    )
    assert ids(before["recall"]) == ["mem_city", "mem_mail"]
    # The reads filled the cache: the recall and the context view are held there.
    assert len(cached_entries(api, tenant)) >= 2

    paused = memproj(
        api, "subject", "pause", "--tenant", tenant, "--subject-type", "user",
        "--subject-id", "alice", "--reason", "suspected poisoned memory", "--operator", "ops:ana",
    )  # fmt: skip
    assert paused.exit_code == 0, paused.output

    during = read_paths(api, key.token)
    for name, answer in during.items():
        assert answer.status_code == 423, (name, answer.text)
        assert answer.json()["error"]["code"] == "subject_paused", name
    # The cached answers are still there, and not served.
    assert len(cached_entries(api, tenant)) >= 2
    # Another subject of the tenant is served as before.
    assert ids(get(api, key.token, subject_path(BOB))) == ["mem_bob"]
    # The operator's commands that serve refuse too.
    recalled = memproj(api, "recall", "--tenant", tenant, "--subject", "user:alice")
    assert recalled.exit_code == 1 and "subject_paused" in recalled.output
    context = memproj(
        api, "conversation", "show", "--tenant", tenant, "--conversation", "c_alice", "--context"
    )
    assert context.exit_code == 1 and "subject_paused" in context.output

    # Events about the paused subject are applied, just not served.
    api.produce_memories(
        [events.proposed(tenant, "mem_new", ALICE, {"text": "moved to Porto"}, kind="fact")]
    )
    applied = api.env.run(lambda conn: memory_store.load_memory(conn, tenant, "mem_new"))
    assert applied is not None and applied.status == "proposed"
    assert get(api, key.token, "/v1/memories/mem_new").status_code == 423

    # Audited: each 423 is a denied read; the pause is listed and logged.
    denied = [row for row in api.audit_rows(tenant) if row["decision"] == "denied"]
    assert len(denied) == len(during) + 1
    listed = memproj(api, "subject", "list", "--tenant", tenant, "--json")
    assert listed.exit_code == 0, listed.output
    assert '"paused_by": "ops:ana"' in listed.output

    resumed = memproj(
        api, "subject", "resume", "--tenant", tenant, "--subject", "user:alice",
        "--reason", "memory corrected", "--operator", "ops:ana",
    )  # fmt: skip
    assert resumed.exit_code == 0, resumed.output

    after = read_paths(api, key.token)
    assert {name: answer.status_code for name, answer in after.items()} == dict.fromkeys(after, 200)
    assert ids(get(api, key.token, subject_path(ALICE), kind="fact")) == ["mem_city", "mem_new"]
    log = api.env.run(lambda conn: pauses.log_of(conn, tenant, ALICE))
    assert [(e.action, e.operator, e.reason) for e in log] == [
        ("pause", "ops:ana", "suspected poisoned memory"),
        ("resume", "ops:ana", "memory corrected"),
    ]
    assert memproj(api, "subject", "list", "--tenant", tenant, "--json").output.strip() == "[]"
