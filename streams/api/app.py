"""``create_app(services)``: the HTTP API as a FastAPI application.

The services are built once at the entry point (``streams.cli.serve``) and passed in; the
application opens them in its lifespan and closes them after. Middleware, outermost first:
routing on the path as received (ids are percent-encoded segments, ``streams.api.paths``), the
request metrics (every answer counted, refusals included), the head bound (414, 431), then the
body bound (413).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from streams.api import errors
from streams.api.auth import Services
from streams.api.heads import BoundedHeadProtocol, HeadLimit
from streams.api.limits import BodyLimit
from streams.api.metrics import RequestMetrics
from streams.api.paths import RawPathRouting
from streams.api.routes import conversations, deletions, memories, proposals, retention, reviews
from streams.api.services import ApiServices
from streams.settings import Settings
from topics.api.models import Health

API_VERSION = "1.0.0"
TITLE = "memproj API"
DESCRIPTION = (
    "Agents read and propose memory. Every request carries an API key (Authorization: Bearer "
    "mpk_...) bound to one tenant, an actor and purposes; reads name their purpose, and the "
    "purpose policy decides which memories they may see. Errors share one body: "
    '{"error": {"code", "message"}}.'
)


def create_app(services: ApiServices) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await services.start()
        try:
            yield
        finally:
            await services.aclose()

    app = FastAPI(
        title=TITLE,
        version=API_VERSION,
        description=DESCRIPTION,
        lifespan=lifespan,
        openapi_url="/v1/openapi.json",
        docs_url=None,
        redoc_url=None,
    )
    app.state.services = services
    errors.install(app)
    app.include_router(memories.router)
    app.include_router(conversations.router)
    app.include_router(proposals.router)
    app.include_router(deletions.router)
    app.include_router(retention.router)
    app.include_router(reviews.router)
    proposals.install_schemas(app)
    _add_probes(app)
    # add_middleware wraps what is already there: the last added runs first.
    app.add_middleware(BodyLimit, max_bytes=services.settings.api_max_body_bytes)
    app.add_middleware(HeadLimit, max_bytes=services.settings.api_max_head_bytes)
    app.add_middleware(RequestMetrics, metrics=services.metrics, routes=app)
    app.add_middleware(RawPathRouting)
    return app


def http_server(app: FastAPI, settings: Settings, host: str, port: int | None) -> uvicorn.Server:
    """The uvicorn server ``memproj serve`` runs ``app`` under (on ``settings.api_port``
    unless ``port`` is given)."""
    config = uvicorn.Config(
        app,
        host=host,
        port=settings.api_port if port is None else port,
        log_level=settings.log_level.lower(),
        access_log=False,
        # The head's bound, answered 414 or 431 however the head arrives (streams.api.heads);
        # the body's is the application's (413).
        http=BoundedHeadProtocol,
        h11_max_incomplete_event_size=settings.api_max_head_bytes,
    )
    return uvicorn.Server(config)


def _add_probes(app: FastAPI) -> None:
    @app.get("/healthz", response_model=Health, tags=["probes"], operation_id="healthz")
    async def healthz() -> Health:
        """The process answers."""
        return Health(status="ok")

    @app.get(
        "/readyz",
        response_model=Health,
        responses={503: {"model": Health, "description": "a dependency is unreachable"}},
        tags=["probes"],
        operation_id="readyz",
    )
    async def readyz(services: Services) -> Any:
        """PostgreSQL and Kafka answer."""
        problems = {
            "postgres": await services.database_ready(),
            "kafka": await services.kafka_ready(),
        }
        checks = {name: problem or "ok" for name, problem in problems.items()}
        ready = not any(problems.values())
        body = Health(status="ready" if ready else "not_ready", checks=checks)
        return JSONResponse(body.model_dump(), status_code=200 if ready else 503)

    @app.get("/metrics", include_in_schema=False)
    async def metrics(services: Services) -> Response:
        return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)
