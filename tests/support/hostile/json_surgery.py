"""JSON surgery: an event's JSON with a value, a raw fragment or a raw member put in."""

from __future__ import annotations

import copy
from typing import Any

import orjson

from streams.sample import RawEvent

Path = tuple[str | int, ...]
_HOLE = "@@hole@@"
_MEMBER = "@@member@@"


def set_at(event: Any, path: Path, value: Any) -> Any:
    """A deep copy of ``event`` with ``value`` at ``path`` (added when missing)."""
    event = copy.deepcopy(event)
    _get(event, path[:-1])[path[-1]] = value
    return event


def delete_at(event: Any, path: Path) -> Any:
    """A deep copy of ``event`` without what is at ``path``."""
    event = copy.deepcopy(event)
    del _get(event, path[:-1])[path[-1]]
    return event


def _get(event: Any, path: Path) -> Any:
    for step in path:
        event = event[step]
    return event


def raw_at(event: RawEvent, path: Path, fragment: bytes) -> bytes:
    """The event's JSON with raw JSON text ``fragment`` as the value at ``path``."""
    text = orjson.dumps(set_at(event, path, _HOLE))
    assert text.count(b'"' + _HOLE.encode() + b'"') == 1
    return text.replace(b'"' + _HOLE.encode() + b'"', fragment)


def member_in(event: RawEvent, path: Path, member: bytes, first: bool) -> bytes:
    """The event's JSON with the raw member ``member`` (``"name":value``) added to the object
    at ``path``, before its other members or after them."""
    target = _get(event, path)
    assert isinstance(target, dict)
    rebuilt = {_MEMBER: 0, **target} if first else {**target, _MEMBER: 0}
    text = orjson.dumps(set_at(event, path, rebuilt) if path else rebuilt)
    marker = b'"' + _MEMBER.encode() + b'":0'
    assert text.count(marker) == 1
    return text.replace(marker, member)


def nested(depth: int, objects: bool) -> bytes:
    """JSON nesting ``depth`` containers deep."""
    if objects:
        return b'{"a":' * depth + b"1" + b"}" * depth
    return b"[" * depth + b"]" * depth
