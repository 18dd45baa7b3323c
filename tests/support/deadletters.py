"""Dead letters in tests: in-memory key rows for tests without services, and the one way
integration tests open the letters of a topic (with the test's key rows and master key)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from projections.deadletters.reading import LetterView, open_letters
from projections.deadletters.sealing import LetterKey, LetterSealer
from projections.sealing.crypto import parse_master_key
from projections.sql import Conn
from streams.isolation import DeadLetters
from streams.settings import Settings
from topics.outputs import DeadLetter
from topics.registry import TopicSpec

TEST_MASTER_KEY = parse_master_key(Settings().master_key)


@dataclass
class MemoryLetterKeys:
    """Key rows kept in a list, for tests whose database is a fake."""

    saved: list[LetterKey] = field(default_factory=list)

    async def save_in(self, conn: Conn, keys: Sequence[LetterKey]) -> None:
        self.saved.extend(keys)

    async def save(self, keys: Sequence[LetterKey]) -> None:
        self.saved.extend(keys)


def memory_dead_letters(keys: MemoryLetterKeys | None = None) -> DeadLetters:
    return DeadLetters(LetterSealer(TEST_MASTER_KEY), keys or MemoryLetterKeys())


def open_topic_letters(env: Any, spec: TopicSpec, suffix: str = ".dlq") -> list[LetterView]:
    """Every letter on ``spec``'s dead-letter topic, opened while its key lives."""
    letters = [
        DeadLetter.model_validate_json(message.value)
        for message in env.read_messages(spec, suffix)
        if message.value
    ]
    return open_views(env, letters)


def open_views(env: Any, letters: Sequence[DeadLetter]) -> list[LetterView]:
    sealer = LetterSealer(parse_master_key(env.settings.master_key))

    async def work(conn: Conn) -> list[LetterView]:
        return await open_letters(conn, sealer, letters, datetime.now(UTC))

    views: list[LetterView] = env.run(work)
    return views


def opened_original(view: LetterView) -> bytes:
    """The original value of an opened letter (a test that expects it open says so)."""
    assert view.opened is not None, f"the letter does not open: {view.state}"
    return view.opened.value
