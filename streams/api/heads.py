"""Bounded request heads, always answered: a request line longer than the bound is a 414, a
head (the request line and its headers) longer than it a 431, each with the API's error body,
never a connection reset.

Two places see an over-long head, depending on how it arrives:

- whole in one read: the HTTP parser (h11) takes it, whatever its size, and ``HeadLimit``
  refuses it before any route or key check reads it;
- in pieces: h11 stops buffering past ``h11_max_incomplete_event_size`` (set to the same
  bound) and raises. uvicorn's own answer to that is a 400 followed by closing the socket
  while the client is still sending: the kernel then resets the connection and the client
  usually never reads the answer. ``BoundedHeadProtocol`` answers 414 or 431 instead, then
  closes gracefully: it half-closes its side and reads (and drops) what the client is still
  sending, until the client closes or ``LINGER_SECONDS`` pass.

Not public API, pinned: ``BoundedHeadProtocol`` overrides uvicorn 0.54's
``H11Protocol.send_400_response`` and reads h11 0.16's ``Connection.trailing_data`` and
``h11._connection.DEFAULT_MAX_INCOMPLETE_EVENT_SIZE`` (``ops/constraints.txt`` pins both).
``tests/streams/api/test_heads.py`` fails when an upgrade changes any of them (the over-long
head sent in pieces is then reset or answered 400 again).
"""

from __future__ import annotations

import asyncio

import h11
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol

from streams.api.errors import ErrorBody, ErrorDetail, error_response

# How long a refused connection keeps reading what its client still sends before closing: a
# client writes its whole request before it reads the answer.
LINGER_SECONDS = 10.0


def refusal(status: int, max_bytes: int) -> tuple[int, str, str]:
    """The status, code and message of a refused head."""
    if status == 414:
        return 414, "uri_too_long", f"request lines are limited to {max_bytes} bytes"
    return (
        431,
        "headers_too_large",
        f"request heads (the request line and headers) are limited to {max_bytes} bytes",
    )


def head_status(target_bytes: int, head_bytes: int, max_bytes: int) -> int | None:
    """414 for a request target past the bound, 431 for a head past it, None within it."""
    if target_bytes > max_bytes:
        return 414
    if head_bytes > max_bytes:
        return 431
    return None


class HeadLimit:
    """ASGI middleware: refuses a request whose head, parsed whole, is past ``max_bytes``."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            target = len(scope.get("raw_path", b"")) + len(scope.get("query_string", b""))
            headers = sum(len(name) + len(value) + 4 for name, value in scope["headers"])
            status = head_status(target, target + headers, self.max_bytes)
            if status is not None:
                response = error_response(*refusal(status, self.max_bytes))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BoundedHeadProtocol(H11Protocol):
    """uvicorn's h11 protocol, answering a head h11 refused with 414 or 431 (the API's error
    body), then closing without resetting the connection (see the module doc)."""

    _draining = False
    _linger: asyncio.TimerHandle | None = None

    def send_400_response(self, msg: str) -> None:
        # uvicorn calls this only when h11 refused what it received.
        status, code, message = self._refusal()
        body = ErrorBody(error=ErrorDetail(code=code, message=message)).model_dump_json().encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        for event in (
            h11.Response(status_code=status, headers=headers, reason=STATUS_PHRASES[status]),
            h11.Data(data=body),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event) or b"")
        self._drain()

    def _refusal(self) -> tuple[int, str, str]:
        limit = self.config.h11_max_incomplete_event_size or DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
        received, _ = self.conn.trailing_data
        if len(received) <= limit:
            return 400, "bad_request", "malformed HTTP request"
        line_end = received.find(b"\n")
        line = len(received) if line_end < 0 else line_end
        status = head_status(line, len(received), limit) or 431
        return refusal(status, limit)

    def _drain(self) -> None:
        """Half-close: the answer and a FIN go out; what the client still sends is read and
        dropped until it closes, or the linger ends."""
        self._draining = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._linger = self.loop.call_later(LINGER_SECONDS, self.transport.close)

    def data_received(self, data: bytes) -> None:
        if self._draining:
            return
        super().data_received(data)

    def eof_received(self) -> None:
        if self._draining:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._linger is not None:
            self._linger.cancel()
        super().connection_lost(exc)
