"""/readyz says which dependency is unreachable (503), while /healthz still answers; search
without a vector store is a 503 too."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest
from conftest import Env

from streams.api.app import create_app
from streams.api.services import build_services
from streams.settings import Settings
from support.api_server import ApiServer


def test_readyz_names_the_unreachable_dependencies() -> None:
    settings = Settings(
        postgres_dsn="postgresql://nobody@127.0.0.1:1/none?connect_timeout=2",
        kafka_bootstrap="127.0.0.1:1",
        environment="local",
    )
    services = build_services(settings)
    app = create_app(services)

    async def probe() -> tuple[httpx.Response, httpx.Response]:
        await services.pool.open(wait=False)  # the lifespan would wait for the database
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
                return await client.get("/healthz"), await client.get("/readyz")
        finally:
            await services.aclose()

    health, ready = asyncio.run(probe())
    assert health.status_code == 200
    assert ready.status_code == 503
    body = ready.json()
    assert body["status"] == "not_ready"
    assert body["checks"]["postgres"].startswith("unreachable (")
    assert body["checks"]["kafka"].startswith("unreachable (")
    assert "127.0.0.1" not in ready.text  # the class of the error only, never a host


@pytest.mark.integration
def test_search_before_the_vector_store_exists_is_a_503_and_recall_still_answers(
    env: Env, serve_api: Callable[..., ApiServer]
) -> None:
    # No embeddings worker has run on this env's data directory: there is no vector table,
    # and the API (which never writes the store) does not create one.
    server = serve_api(env)
    tenant = server.tenant()
    server.set_purpose(tenant, "support")
    key = server.create_key(tenant, ["support"])
    with server.client(key.token) as client:
        search = client.get(
            "/v1/subjects/user/alice/search", params={"purpose": "support", "text": "email"}
        )
        recall = client.get("/v1/subjects/user/alice/memories", params={"purpose": "support"})
    assert search.status_code == 503, search.text
    assert search.json()["error"]["code"] == "vector_store_unavailable"
    assert str(env.settings.data_dir) not in search.text  # the detail is the operator's log
    assert recall.status_code == 200, recall.text
    assert not (env.settings.vector_store_path / "embeddings.lance").exists()
