"""Write bounds against the running API server, the broker and the memory worker: a key
bounded to some kinds and scopes proposes those and is refused (403) any other, and is
refused a verification, correction or revocation of a memory outside them or unknown; a key
without bounds writes as before. Nothing refused reaches Kafka."""

from __future__ import annotations

import pytest

from projections.access.policy import WriteBounds
from projections.access.proposals import PROPOSE
from projections.memory import store as memory_store
from projections.sql import KeyLookups
from streams.sample import EventFactory
from support.api_server import ApiServer
from support.deletion_scenario import ALICE

from .test_proposals import ACTOR, MEMORY_ROUTE, post, produced

pytestmark = pytest.mark.integration

SUPPORT_BOT = WriteBounds(frozenset({"preference"}), frozenset({"user"}))


def test_a_bounded_key_writes_within_its_bounds_only(api: ApiServer, events: EventFactory) -> None:
    tenant = api.tenant()
    bot = api.create_key(tenant, [PROPOSE], actor=ACTOR, write_bounds=SUPPORT_BOT)
    unbounded = api.create_key(tenant, [PROPOSE], actor=ACTOR)
    # What the bot may write, and a risk memory written by an unbounded key.
    mine = events.proposed(tenant, "mem_pref", ALICE, {"text": "prefers email"})
    assert post(api, bot.token, MEMORY_ROUTE, mine).status_code == 202
    risk = events.proposed(tenant, "mem_risk", ALICE, {"text": "chargebacks"}, kind="risk")
    assert post(api, unbounded.token, MEMORY_ROUTE, risk).status_code == 202
    api.produce_memories([])  # waits for the memory worker to catch up

    before = produced(api)
    refused = [
        (events.proposed(tenant, "mem_r2", ALICE, kind="risk"), "kind_not_writable"),
        (events.proposed(tenant, "mem_s2", ALICE, scope="billing"), "scope_not_writable"),
        (events.proposed(tenant, "mem_risk", ALICE), "memory_not_writable"),
        (events.verified(tenant, "mem_risk", 1), "memory_not_writable"),
        (events.corrected(tenant, "mem_risk", 1, {"text": "none"}), "memory_not_writable"),
        (events.revoked(tenant, "mem_risk"), "memory_not_writable"),
        (events.revoked(tenant, "mem_unknown"), "memory_not_writable"),
    ]
    for event, code in refused:
        answer = post(api, bot.token, MEMORY_ROUTE, event)
        assert (answer.status_code, answer.json()["error"]["code"]) == (403, code), answer.text
    assert produced(api) == before

    # Within its bounds: verified, corrected, revoked.
    for event in (
        events.verified(tenant, "mem_pref", 1),
        events.corrected(tenant, "mem_pref", 2, {"text": "prefers post"}),
        events.revoked(tenant, "mem_pref"),
    ):
        answer = post(api, bot.token, MEMORY_ROUTE, event)
        assert answer.status_code == 202, answer.text
        api.produce_memories([])
    # A key without bounds keeps today's behaviour: it revokes the risk memory.
    revoke_risk = events.revoked(tenant, "mem_risk")
    assert post(api, unbounded.token, MEMORY_ROUTE, revoke_risk).status_code == 202
    api.produce_memories([])
    records = api.env.run(
        lambda conn: memory_store.load_records(
            conn, [(tenant, "mem_pref"), (tenant, "mem_risk")], KeyLookups()
        )
    )
    assert {m: (r.status, r.version) for (_, m), r in records.items()} == {
        "mem_pref": ("revoked", 4),
        "mem_risk": ("revoked", 2),
    }
