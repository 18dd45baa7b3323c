"""/readyz says which dependency is unreachable (503), while /healthz still answers."""

from __future__ import annotations

import asyncio

import httpx

from streams.api.app import create_app
from streams.api.services import build_services
from streams.settings import Settings


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
