"""No service outside the integration tests: a test that needs Kafka, PostgreSQL, Redis or
Prometheus must carry ``@pytest.mark.integration``, so that ``pytest -m "not integration"``
runs anywhere, without ops/stack.

Two checks, wired in tests/conftest.py:

- at collection, a test without the marker that uses a fixture of the stack (``stack``, and
  so ``env``, ``redis_namespace`` and everything built on them) is an error
  (``unmarked_service_users``);
- while a test without the marker runs, a connection to an address of the stack (PostgreSQL
  through psycopg, and anything through a Python socket: Redis, Prometheus, the API's HTTP)
  raises ``ServiceOutsideIntegration`` (``ServiceGuard``). Kafka's clients connect from
  librdkafka's own threads, out of Python's reach: the fixture check is what catches them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from streams.settings import Settings

# Every fixture that reaches a service depends on this one.
SERVICE_FIXTURES = frozenset({"stack"})
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


class ServiceOutsideIntegration(RuntimeError):
    def __init__(self, what: str) -> None:
        super().__init__(
            f"a test without @pytest.mark.integration connected to {what}: mark it (it needs"
            " ops/stack) or give it a fake (tests/support/fakes)"
        )


def unmarked_service_users(items: Iterable[pytest.Item]) -> list[str]:
    """The tests that use a fixture of the stack without the integration marker."""
    return [
        item.nodeid
        for item in items
        if item.get_closest_marker("integration") is None
        and SERVICE_FIXTURES & set(getattr(item, "fixturenames", ()))
    ]


def _host(host: str) -> frozenset[str]:
    return LOOPBACK if host in LOOPBACK else frozenset({host})


class ServiceGuard:
    """The stack's addresses (host, port) of ``settings``, refused while installed."""

    def __init__(self, settings: Settings) -> None:
        pg = conninfo_to_dict(settings.postgres_dsn)
        addresses = {(str(pg.get("host") or "127.0.0.1"), int(pg.get("port") or 5432))}
        # ops/stack's Prometheus (``ops/stack env`` exports its address).
        prometheus = os.environ.get("MEMPROJ_PROMETHEUS_URL", "http://127.0.0.1:9090")
        for url in (settings.redis_url, prometheus):
            parts = urlsplit(url)
            addresses.add((parts.hostname or "127.0.0.1", parts.port or 0))
        for server in settings.kafka_bootstrap.split(","):
            host, _, port = server.rpartition(":")
            addresses.add((host, int(port)))
        self.refused = frozenset(
            (host, port) for address, port in addresses for host in _host(address)
        )

    def check(self, host: str, port: int) -> None:
        if (host, port) in self.refused:
            raise ServiceOutsideIntegration(f"{host}:{port}")

    def check_conninfo(self, conninfo: str, **kwargs: Any) -> None:
        params = conninfo_to_dict(conninfo, **kwargs)
        host = str(params.get("host") or "127.0.0.1")
        self.check(host, int(params.get("port") or 5432))

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        guard = self

        def guarded(connect: Callable[..., Any]) -> Callable[..., Any]:
            def connect_checked(sock: socket.socket, address: Any) -> Any:
                if sock.family in (socket.AF_INET, socket.AF_INET6):
                    guard.check(str(address[0]), int(address[1]))
                return connect(sock, address)

            return connect_checked

        monkeypatch.setattr(socket.socket, "connect", guarded(socket.socket.connect))
        monkeypatch.setattr(socket.socket, "connect_ex", guarded(socket.socket.connect_ex))
        sync_connect = psycopg.Connection.connect
        async_connect = psycopg.AsyncConnection.connect

        def connect(cls: Any, /, conninfo: str = "", **kwargs: Any) -> Any:
            guard.check_conninfo(conninfo, **kwargs)
            return sync_connect(conninfo, **kwargs)

        async def connect_async(cls: Any, /, conninfo: str = "", **kwargs: Any) -> Any:
            guard.check_conninfo(conninfo, **kwargs)
            return await async_connect(conninfo, **kwargs)

        monkeypatch.setattr(psycopg.Connection, "connect", classmethod(connect))
        # ``psycopg.connect`` is the class's method, bound when psycopg was imported.
        monkeypatch.setattr(psycopg, "connect", psycopg.Connection.connect)
        monkeypatch.setattr(psycopg.AsyncConnection, "connect", classmethod(connect_async))
