"""A message as read from a topic, before decoding."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class InputMessage:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
