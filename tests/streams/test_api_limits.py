"""The API's body bound as ASGI middleware, without a server: a chunked body that grows past
the bound is refused while it is read, a declared one before."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import orjson

from streams.api.limits import BodyLimit, RateLimit


async def echo_length(scope: Any, receive: Any, send: Any) -> None:
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(size).encode()})


def call(chunks: list[bytes], headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
    app = BodyLimit(echo_length, max_bytes=10)
    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    queue = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return queue.pop(0)

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body


def test_bodies_within_the_bound_pass() -> None:
    assert call([b"12345", b"67890"], []) == (200, b"10")
    assert call([b"1234567890"], [(b"content-length", b"10")]) == (200, b"10")


def test_a_declared_length_past_the_bound_is_refused_unread() -> None:
    status, body = call([b"x" * 11], [(b"content-length", b"11")])
    assert status == 413
    assert orjson.loads(body)["error"]["code"] == "body_too_large"
    assert call([b""], [(b"content-length", b"ten")])[0] == 400


def test_a_chunked_body_growing_past_the_bound_is_refused() -> None:
    status, body = call([b"123456", b"789012"], [(b"transfer-encoding", b"chunked")])
    assert status == 413
    assert orjson.loads(body)["error"]["code"] == "body_too_large"


def test_the_rate_limit_is_per_key_in_a_moving_window() -> None:
    async def hits() -> list[bool]:
        limit = RateLimit("2/minute")
        verdicts = [await limit.hit("k1") for _ in range(3)] + [await limit.hit("k2")]
        assert 1 <= verdicts[2].retry_after_seconds <= 60
        return [v.allowed for v in verdicts]

    assert asyncio.run(hits()) == [True, True, False, True]
