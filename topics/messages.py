"""A message as read from a topic, before decoding."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class InputMessage:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]] = ()


def header_pairs(headers: Any) -> list[tuple[str, bytes]]:
    """Kafka headers as (name, value) pairs: clients give a mapping or a list of pairs, and a
    header may have no value."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    return [(str(name), _bytes(value)) for name, value in pairs]


def _bytes(value: bytes | str | None) -> bytes:
    if value is None:
        return b""
    return value.encode() if isinstance(value, str) else bytes(value)
