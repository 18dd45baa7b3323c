"""Ids in paths: every id the contract accepts (any 1 to 128 characters but NUL, which the codec
refuses) is addressable on every route, as one percent-encoded path segment.

The server decodes the path before routing, so an id holding ``/`` (sent as ``%2F``) would
split into two segments and miss its route; ``al/ice`` as a subject id was a 404. Here the
router matches the path as it was received (``RawPathRouting``), segment by segment, and each
id parameter (``{memory_id:segment}``) is decoded once, after it has been matched
(``SegmentConvertor``): ``m%2F..%2Fx%252F%3Ay%20%C3%BC`` is the memory ``m/../x%2F:y ü``.

Clients encode each id as ``topics.api.paths.encode_segment`` does: every character but the
unreserved ones (``A-Z a-z 0-9 - . _ ~``) percent-encoded as UTF-8 (``quote(id, safe="")``,
``encodeURIComponent``), and the two ids that are dot segments, ``.`` and ``..``, as ``%2E``
and ``%2E%2E``: clients and proxies remove a literal dot segment from a path before it is
sent."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import unquote

from fastapi import Path
from starlette.convertors import Convertor, register_url_convertor
from starlette.types import ASGIApp, Receive, Scope, Send

from topics.api.paths import encode_segment
from topics.envelope import IDENTIFIER_MAX_LENGTH

# PostgreSQL's text holds no NUL, so the codec refuses an event with one: no stored id has it.
ID_PATTERN = r"^[^\x00]+$"


class SegmentConvertor(Convertor[str]):
    """One path segment as received (``%2F`` inside it is no separator), decoded once."""

    regex = "[^/]+"

    def convert(self, value: str) -> str:
        return unquote(value)

    def to_string(self, value: str) -> str:
        return encode_segment(value)


register_url_convertor("segment", SegmentConvertor())


class RawPathRouting:
    """ASGI middleware: routes match the path as the client sent it, its percent escapes
    intact (the server's ``raw_path``); id parameters are decoded by ``SegmentConvertor``.
    The scope is changed in place: the metrics middleware reads the route the router chose
    from it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw_path = scope.get("raw_path")
        if scope["type"] == "http" and raw_path is not None:
            # The request target is ASCII (HTTP refuses anything else in it).
            scope["path"] = raw_path.decode("ascii")
        await self.app(scope, receive, send)


def id_path(description: str) -> Any:
    """A path parameter holding a contract id (used as ``{name:segment}`` in the route)."""
    return Path(
        min_length=1,
        max_length=IDENTIFIER_MAX_LENGTH,
        pattern=ID_PATTERN,
        description=f"{description}, percent-encoded as one path segment (`/` as %2F; `.` "
        "and `..` as %2E and %2E%2E)",
    )


MemoryIdPath = Annotated[str, id_path("the memory id")]
ConversationIdPath = Annotated[str, id_path("the conversation id")]
SubjectTypePath = Annotated[str, id_path("the subject's type")]
SubjectIdPath = Annotated[str, id_path("the subject's id")]
DeletionIdPath = Annotated[str, id_path("the deletion id")]
