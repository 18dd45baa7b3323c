"""The HTTP API server the API tests run: ``memproj serve`` as a process on a free port over
one isolated slice of the stack, and the helpers a test uses with it (clients, keys, purposes,
data, the audit). Fixtures: tests/streams/api/conftest.py."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg

from projections.access import keys, purposes
from projections.access.policy import WriteBounds
from projections.embeddings.vectors import Match
from projections.migrate import migrate
from streams.api.app import create_app, http_server
from streams.api.services import ApiServices
from streams.settings import Settings
from support.embedders import vectors_of
from support.environment import REPO, Env, child_environment, settings_environment
from support.ports import free_port
from topics.registry import CONVERSATION_EVENTS, MEMORY_EVENTS

T = TypeVar("T")

# The workers whose output the read routes serve.
READ_WORKERS = ("memory", "conversation", "embeddings", "context")


@dataclass
class ApiServer:
    """One ``memproj serve`` process and the env it serves."""

    env: Env
    settings: Settings
    log_path: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, seconds: float = 60) -> ApiServer:
        environment = child_environment()
        environment.update(settings_environment(self.settings))
        environment["MEMPROJ_API_PORT"] = str(self.port)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "streams", "serve"],
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        deadline = time.monotonic() + seconds
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"memproj serve did not start:\n{self.log_tail()}")
            time.sleep(0.1)
        return self

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    # -- clients, keys and purposes

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def tenant(self) -> str:
        """A tenant of this test's own."""
        return f"tn_{uuid.uuid4().hex[:10]}"

    def create_key(
        self,
        tenant: str,
        purposes_: Sequence[str],
        actor: str = "agent:test",
        write_bounds: WriteBounds | None = None,
    ) -> keys.CreatedKey:
        return self.env.run(
            lambda conn: _committed(
                conn,
                keys.create_key(conn, tenant, actor, purposes_, datetime.now(UTC), write_bounds),
            )
        )

    def revoke(self, key_id: str) -> None:
        self.env.run(
            lambda conn: _committed(conn, keys.revoke_key(conn, key_id, datetime.now(UTC)))
        )

    def set_purpose(
        self,
        tenant: str,
        purpose: str,
        kinds: Sequence[str] = ("*",),
        scopes: Sequence[str] = ("*",),
        conversations: bool = False,
    ) -> None:
        self.env.run(
            lambda conn: _committed(
                conn,
                purposes.set_policy(
                    conn, tenant, purpose, kinds, scopes, conversations, datetime.now(UTC)
                ),
            )
        )

    def audit_rows(self, tenant: str) -> list[dict[str, Any]]:
        with psycopg.connect(self.settings.postgres_dsn, autocommit=True) as conn:
            cursor = conn.execute(
                "SELECT * FROM api_read_audit WHERE tenant_id = %s ORDER BY id", (tenant,)
            )
            names = [column.name for column in cursor.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    # -- data

    def produce_memories(self, events: Sequence[dict[str, Any]]) -> None:
        self.env.produce_events(events, MEMORY_EVENTS)
        self.env.wait_caught_up(MEMORY_EVENTS, "memory")

    def produce_conversation(self, events: Sequence[dict[str, Any]]) -> None:
        self.env.produce_events(events, CONVERSATION_EVENTS)
        self.env.wait_caught_up(CONVERSATION_EVENTS, "conversation")

    def wait_indexed(self, tenant: str, subject: tuple[str, str], count: int) -> None:
        store = vectors_of(self.settings)
        self.env.wait_until(
            lambda: len(store.find(Match(tenant_id=tenant, subject=subject))) >= count,
            f"{count} vectors of {tenant} {subject}",
        )

    def wait_for(self, check: Callable[[], Any], what: str, seconds: float = 90) -> Any:
        return self.env.wait_until(check, what, seconds)


async def _committed(conn: Any, work: Awaitable[T]) -> T:
    result = await work
    await conn.commit()
    return result


def _migrated(settings: Settings) -> None:
    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(settings.postgres_dsn) as conn:
            await migrate(conn)

    asyncio.run(run())


@contextlib.contextmanager
def serving_in_process(env: Env, services: ApiServices) -> Iterator[ApiServer]:
    """The API over ``services`` a test built (holding one of them where it can see it, an
    embedder say), served as ``memproj serve`` serves it, in a thread of this process."""
    _migrated(services.settings)
    server = ApiServer(env, services.settings, env.tmp_path / "serve-in-process.log")
    running = http_server(create_app(services), services.settings, "127.0.0.1", server.port)
    thread = threading.Thread(target=running.run, name="api-in-process", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server._healthy():
            if not thread.is_alive() or time.monotonic() > deadline:
                raise AssertionError("the API did not start in this process")
            time.sleep(0.1)
        yield server
    finally:
        running.should_exit = True
        thread.join(30)


@contextlib.contextmanager
def serving(env: Env, **overrides: Any) -> Iterator[ApiServer]:
    settings = env.settings.model_copy(update=overrides) if overrides else env.settings
    _migrated(settings)
    log_path = env.tmp_path / f"serve-{uuid.uuid4().hex[:6]}.log"
    server = ApiServer(env, settings, log_path).start()
    try:
        yield server
    finally:
        server.stop()
