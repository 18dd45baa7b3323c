"""The API's limits: rate limits (a moving window, the ``limits`` library) and a bound on
request bodies.

Two rate limits: requests per key, judged after authentication (one key's burst never spends
another's allowance), and failed authentications per client address, judged before the key is
looked up (a guesser's attempts stop costing a database connection each). Their windows live
in the process (``memory``) or in Redis (``redis``: a single Redis or a Redis Cluster), where
every replica of the API counts against the same windows.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from limits import RateLimitItem, parse
from limits.aio.storage import MemoryStorage, Storage
from limits.aio.strategies import MovingWindowRateLimiter
from limits.storage import storage_from_string
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from streams.api.errors import error_response


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    retry_after_seconds: int = 0


def shared_storage_uri(redis_url: str, cluster: bool) -> str:
    """The ``limits`` storage of the Redis at ``redis_url``, or of the Redis Cluster one of whose
    nodes it names. Every window is one key, each operation on it one script: no operation
    spans two slots, whatever the keys."""
    if not cluster:
        return f"async+{redis_url}"
    parts = urlsplit(redis_url)
    return f"async+redis+cluster://{parts.netloc}"


class RateLimit:
    def __init__(self, limit: str, storage: Storage | None = None) -> None:
        self.item: RateLimitItem = parse(limit)
        self._storage = storage if storage is not None else MemoryStorage()
        self._limiter = MovingWindowRateLimiter(self._storage)

    @classmethod
    def of(
        cls, limit: str, storage: str, redis_url: str, namespace: str, cluster: bool = False
    ) -> RateLimit:
        if storage == "memory":
            return cls(limit)
        shared = storage_from_string(
            shared_storage_uri(redis_url, cluster),
            implementation="redispy",
            key_prefix=f"{namespace}-ratelimit",
        )
        assert isinstance(shared, Storage)
        return cls(limit, shared)

    async def hit(self, key: str) -> Verdict:
        """Spends one unit of ``key``'s allowance, if there is one left."""
        if await self._limiter.hit(self.item, key):
            return Verdict(True)
        return await self._refused(key)

    async def check(self, key: str) -> Verdict:
        """Whether ``key`` has allowance left, spending none."""
        if await self._limiter.test(self.item, key):
            return Verdict(True)
        return await self._refused(key)

    async def _refused(self, key: str) -> Verdict:
        stats = await self._limiter.get_window_stats(self.item, key)
        return Verdict(False, max(1, math.ceil(stats.reset_time - time.time())))


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` as the body grows past the bound. An HTTPException, so that
    FastAPI, which turns other failures of a body read into 400, lets it through to the
    error handlers (413)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"request bodies are limited to {max_bytes} bytes")


class BodyLimit:
    """ASGI middleware: refuses (413) a body larger than ``max_bytes``, whether its
    Content-Length says so up front or a chunked body grows past it while it is read."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.max_bytes or declared < 0:
                    await self._refuse(scope, receive, send, declared < 0)
                    return
        seen = 0
        started = False

        async def bounded_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, bounded_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._refuse(scope, receive, send, False)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, malformed: bool) -> None:
        if malformed:
            response = error_response(400, "bad_request", "malformed Content-Length")
        else:
            response = error_response(
                413, "body_too_large", f"request bodies are limited to {self.max_bytes} bytes"
            )
        await response(scope, receive, send)
