"""How an id travels in an API path: as one percent-encoded segment (the server side is
``streams.api.paths``)."""

from __future__ import annotations

from urllib.parse import quote


def encode_segment(value: str) -> str:
    """``value`` as one path segment that clients and proxies pass on unchanged: every
    character but the unreserved ones percent-encoded as UTF-8, and the two ids that are dot
    segments, ``.`` and ``..``, as ``%2E`` and ``%2E%2E`` (clients remove a literal one)."""
    if value in (".", ".."):
        return value.replace(".", "%2E")
    return quote(value, safe="")
