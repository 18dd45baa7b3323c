"""Fixtures of the HTTP API tests: ``memproj serve`` against the real stack
(``support.api_server``).

``api`` is shared by every API test (tests keep apart by tenant: each names its own with
``api.tenant()``); ``serve_api`` starts another server over any env with other settings (a
tight rate limit, say)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from streams.sample import EventFactory
from streams.settings import Settings
from support.api_server import READ_WORKERS, ApiServer, serving
from support.environment import Env, isolated_env


@pytest.fixture(scope="package")
def api_env(stack: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """One slice of the stack for every API test, with the workers the reads need; stopped
    once the API tests are done (not kept polling through the rest of the session)."""
    with isolated_env(stack, tmp_path_factory.mktemp("api")) as env:
        env.start(*READ_WORKERS)
        yield env


@pytest.fixture(scope="package")
def api(api_env: Env) -> Iterator[ApiServer]:
    """The API server every test shares (tests keep apart by tenant)."""
    with serving(api_env) as server:
        yield server


@pytest.fixture
def serve_api() -> Iterator[Callable[..., ApiServer]]:
    """Starts another server over an env with overridden settings; stopped after the test."""
    with contextlib.ExitStack() as stack:

        def start(env: Env, **overrides: Any) -> ApiServer:
            return stack.enter_context(serving(env, **overrides))

        yield start


@pytest.fixture
def events() -> EventFactory:
    """Unique event ids per test, observed recently (recall's max age sees them)."""
    return EventFactory(
        id_prefix=f"e{uuid.uuid4().hex[:8]}", clock=datetime.now(UTC) - timedelta(minutes=10)
    )
