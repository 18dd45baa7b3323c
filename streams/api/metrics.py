"""The API's Prometheus metrics, on the injected registry: requests and their latency per
route template, method and status, and the hydration guard's blocked reads per route. Every
label takes a bounded set of values, whatever a client sends: templates, never paths; the
methods of HTTP, and ``other``."""

from __future__ import annotations

import time
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED = "unmatched"
# The methods of HTTP (RFC 9110, and PATCH): the server accepts any token as a method, and a
# label per invented one would grow without bound; every other method is one label value.
METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}
)
OTHER_METHOD = "other"


def method_label(method: str) -> str:
    return method if method in METHODS else OTHER_METHOD


class ApiMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "memproj_api_requests",
            "HTTP API requests answered, per route template, method (other: not an HTTP method) "
            "and status",
            ["route", "method", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "memproj_api_request_seconds",
            "HTTP API request latency, from the request to the end of the response",
            ["route", "method", "status"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.blocked = Counter(
            "memproj_api_blocked_reads",
            "candidates the hydration guard dropped from an API read, per route and store",
            ["route", "store"],
            registry=registry,
        )

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        labels = (route, method, str(status))
        self.requests.labels(*labels).inc()
        self.latency.labels(*labels).observe(seconds)

    def blocked_reads(self, route: str, blocked: Mapping[str, Mapping[str, int]]) -> None:
        for store, reasons in blocked.items():
            count = sum(reasons.values())
            if count:
                self.blocked.labels(route, store).inc(count)


def template_of(route: object) -> str:
    """A route's template as clients read it (``/v1/memories/{memory_id}``: without the
    parameters' convertors)."""
    return str(getattr(route, "path_format", UNMATCHED))


def route_template(app: ASGIApp, scope: Scope) -> str:
    """The template of the route that answered (``/v1/memories/{memory_id}``), never the
    path itself: paths carry ids, and a label per id would grow without bound. The router
    names the route it chose in the scope; a refusal before routing (413) is matched here."""
    chosen = scope.get("route")
    if chosen is not None:
        return template_of(chosen)
    for route in getattr(getattr(app, "router", None), "routes", ()):
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return template_of(route)
    return UNMATCHED


class RequestMetrics:
    """ASGI middleware: times every request and counts it by route template and status."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics, routes: ASGIApp) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def observing_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, observing_send)
        finally:
            self.metrics.observe(
                route_template(self.routes, scope),
                method_label(scope["method"]),
                status,
                time.perf_counter() - started,
            )
