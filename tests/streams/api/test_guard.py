"""An erased memory is never returned by recall or search, even while the embeddings worker
and the cache lag behind the erasure: the vector and the cached answer are still there, the
projection and the ledger say erased, and the guard blocks them and says so."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from projections.memory import store as memory_store
from streams.sample import EventFactory
from support.api_server import ApiServer
from support.deletion_scenario import ALICE
from support.environment import Env
from topics.registry import DELETION_REQUESTS

pytestmark = pytest.mark.integration


def test_an_erased_memory_is_blocked_while_the_stores_lag(env: Env, serve_api: Any) -> None:
    events = EventFactory(id_prefix="g", clock=datetime.now(UTC) - timedelta(minutes=10))
    workers = env.start("memory", "embeddings", "deletion")
    server: ApiServer = serve_api(env)
    tenant = "acme"
    server.set_purpose(tenant, "support")
    key = server.create_key(tenant, ["support"])
    server.produce_memories(
        [
            events.proposed(tenant, "mem_keep", ALICE, {"text": "wants invoices by email"}),
            events.proposed(tenant, "mem_gone", ALICE, {"text": "wants invoices by fax"}),
        ]
    )
    server.wait_indexed(tenant, ALICE, 2)
    recall_path = f"/v1/subjects/{ALICE[0]}/{ALICE[1]}/memories"
    search_path = f"/v1/subjects/{ALICE[0]}/{ALICE[1]}/search"
    with server.client(key.token) as client:
        params = {"purpose": "support"}
        before = client.get(recall_path, params=params).json()  # cached from here on
        assert {m["memory_id"] for m in before["memories"]} == {"mem_keep", "mem_gone"}

        workers["embeddings"].stop()  # the vector of mem_gone stays
        env.produce_events(
            [events.deletion(tenant, "d_gone", {"type": "memory", "id": "mem_gone"})],
            DELETION_REQUESTS,
        )
        env.wait_until(
            lambda: (
                env.run(lambda c: memory_store.load_memory(c, tenant, "mem_gone")) is None or None
            ),
            "the ledger's erasure of mem_gone",
        )

        search = client.get(search_path, params={**params, "text": "invoices by fax"})
        assert search.status_code == 200, search.text
        body = search.json()
        assert [m["memory_id"] for m in body["memories"]] == ["mem_keep"]
        assert body["blocked"]["total"] == 1
        assert body["blocked"]["stores"] == {"embeddings": {"erased": 1}}

        recall = client.get(recall_path, params=params).json()
        assert [m["memory_id"] for m in recall["memories"]] == ["mem_keep"]
        assert recall["blocked"]["stores"] == {"cache": {"erased": 1}}

        assert client.get("/v1/memories/mem_gone", params=params).status_code == 404
        metrics = client.get("/metrics").text
    assert (
        'memproj_api_blocked_reads_total{route="/v1/subjects/{subject_type}/{subject_id}/search",'
        'store="embeddings"} 1.0' in metrics
    )
    audit = server.audit_rows(tenant)
    search_row = next(r for r in audit if r["route"].endswith("/search"))
    assert search_row["returned_ids"] == ["mem_keep"]
    assert search_row["filtered_ids"] == ["mem_gone"]
