"""The check that keeps services out of the unit suite (tests/support/service_guard.py): an
unmarked test that connects to the stack fails, and one that asks for its fixtures is an error
at collection."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

import psycopg
import pytest
import redis

from streams.settings import Settings
from support.service_guard import ServiceOutsideIntegration, unmarked_service_users

STACK = Settings()


def test_an_unmarked_test_cannot_reach_postgresql_or_redis() -> None:
    with pytest.raises(ServiceOutsideIntegration, match=r"integration"):
        psycopg.connect(STACK.postgres_dsn, connect_timeout=1)
    with pytest.raises(ServiceOutsideIntegration):
        asyncio.run(psycopg.AsyncConnection.connect(STACK.postgres_dsn, connect_timeout=1))
    with pytest.raises(ServiceOutsideIntegration):
        redis.Redis.from_url(STACK.redis_url, socket_connect_timeout=1).ping()
    # Another address is not the stack's: the guard lets it be (it is refused on its own).
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect("postgresql://nobody@127.0.0.1:1/none", connect_timeout=1)


@dataclass
class Collected:
    nodeid: str
    fixturenames: list[str]
    markers: set[str] = field(default_factory=set)

    def get_closest_marker(self, name: str) -> Any:
        return name if name in self.markers else None


def test_a_test_using_the_stack_without_the_marker_is_named_at_collection() -> None:
    items = [
        Collected("unit", ["tmp_path"]),
        Collected("marked", ["env", "stack", "tmp_path"], {"integration"}),
        Collected("unmarked", ["redis_namespace", "stack"]),
    ]
    assert unmarked_service_users(cast(list[pytest.Item], items)) == ["unmarked"]
