"""Openers: what memproj itself could still open in a topic's records.

A sealed field counts as readable while memproj can open it: its data key still exists. Each
topic kind has a list of openers; an opener sees a batch of records first (``prepare``, e.g. to
read the batch's data keys in one query) and then returns, per record, the plaintext it can
open, or None. Whatever an opener returns is searched like the record itself.

Adding one is one line in ``OPENERS``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson
from pydantic import ValidationError

from projections.conversation.published import PublishedMessage, parse_record
from projections.deadletters.reading import open_letters
from projections.deadletters.sealing import LetterSealer
from projections.sealing.crypto import Unreadable
from projections.sealing.fields import EntityRef, sealing_keys, unseal
from projections.sealing.keys import KeyStore
from projections.sql import Conn
from streams.audit.plaintext import TopicKind, TopicRecord, parse_json
from topics.outputs import DeadLetter


@dataclass(frozen=True, slots=True)
class OpenerContext:
    """What an opener may use: the live schema's connection (its data keys) and the master
    key's key store."""

    conn: Conn
    keys: KeyStore
    letters: LetterSealer


class Opener(Protocol):
    name: str

    async def prepare(self, records: Sequence[TopicRecord]) -> None: ...

    def open(self, record: TopicRecord) -> bytes | None: ...


OpenerFactory = Callable[[OpenerContext], Opener]


class SealedEventOpener:
    """An event of a ``*.sealed`` topic with its personal fields opened by the live data key;
    None once the key is shredded (or the event cannot be opened at all)."""

    name = "sealed_fields"

    def __init__(self, context: OpenerContext) -> None:
        self._context = context
        self._keys: dict[EntityRef, bytes] = {}
        self._missing: set[EntityRef] = set()
        self._parsed: dict[tuple[int, int], dict[str, Any]] = {}

    async def prepare(self, records: Sequence[TopicRecord]) -> None:
        self._parsed = {}
        refs: list[EntityRef] = []
        for record in records:
            event = parse_json(record.value) if record.value else None
            if not isinstance(event, dict) or not isinstance(event.get("payload"), dict):
                continue
            try:
                keys = sealing_keys(event)
            except (KeyError, TypeError, AttributeError):
                continue
            if keys and "sealed" in event["payload"]:
                self._parsed[(record.partition, record.offset)] = event
                refs.extend(keys)
        # Read in the audit's snapshot transaction (a key shredded before it began is gone),
        # so a key read once holds for the whole scan: each is read and unwrapped once.
        wanted = {ref for ref in refs if ref not in self._keys and ref not in self._missing}
        if wanted:
            found = await self._context.keys.keys(self._context.conn, wanted)
            self._keys.update(found)
            self._missing.update(wanted - found.keys())

    def open(self, record: TopicRecord) -> bytes | None:
        event = self._parsed.get((record.partition, record.offset))
        if event is None:
            return None
        try:
            return orjson.dumps(unseal(event, self._keys.get)["payload"])
        except (Unreadable, KeyError, TypeError, ValueError):
            return None  # shredded (Shredded is Unreadable), tampered or not sealed by memproj


class DeadLetterOriginal:
    """The original bytes a dead letter keeps, base64 in ``original`` (contract 1.1)."""

    name = "dead_letter_original"

    def __init__(self, context: OpenerContext) -> None:
        del context  # needs nothing: the original is only encoded, not sealed

    async def prepare(self, records: Sequence[TopicRecord]) -> None:
        return None

    def open(self, record: TopicRecord) -> bytes | None:
        letter = parse_json(record.value) if record.value else None
        original = letter.get("original") if isinstance(letter, dict) else None
        if not isinstance(original, str):
            return None
        try:
            return base64.b64decode(original, validate=True)
        except (binascii.Error, ValueError):
            return None


class SealedMessageOpener:
    """A ``conversation.messages`` record with its content opened by the conversation's live
    data key (records written before sealing are plaintext and searched as they are)."""

    name = "sealed_message"

    def __init__(self, context: OpenerContext) -> None:
        self._context = context
        self._keys: dict[EntityRef, bytes] = {}
        self._records: dict[tuple[int, int], PublishedMessage] = {}

    async def prepare(self, records: Sequence[TopicRecord]) -> None:
        self._records = {}
        for record in records:
            try:
                message = parse_record(record.value or b"")
            except (ValueError, KeyError, TypeError):
                continue
            if message.sealed is not None:
                self._records[(record.partition, record.offset)] = message
        wanted = {m.entity for m in self._records.values()} - self._keys.keys()
        if wanted:
            self._keys.update(await self._context.keys.keys(self._context.conn, wanted))

    def open(self, record: TopicRecord) -> bytes | None:
        message = self._records.get((record.partition, record.offset))
        if message is None:
            return None
        try:
            return orjson.dumps(message.opened(self._keys.get(message.entity)).content)
        except (Unreadable, KeyError, TypeError, ValueError):
            return None  # shredded or tampered


class SealedLetterOpener:
    """A dead letter's sealed original (value, key and error detail), opened while its
    per-letter key lives: None once an erasure or the end of its window destroyed it."""

    name = "sealed_original"

    def __init__(self, context: OpenerContext) -> None:
        self._context = context
        self._opened: dict[tuple[int, int], bytes] = {}

    async def prepare(self, records: Sequence[TopicRecord]) -> None:
        self._opened = {}
        letters: list[tuple[tuple[int, int], DeadLetter]] = []
        for record in records:
            try:
                letter = DeadLetter.model_validate_json(record.value or b"")
            except ValidationError:
                continue
            if letter.sealed_original is not None:
                letters.append(((record.partition, record.offset), letter))
        views = await open_letters(
            self._context.conn,
            self._context.letters,
            [letter for _, letter in letters],
            datetime.now(UTC),
        )
        for (place, _), view in zip(letters, views, strict=True):
            if view.opened is not None:
                opened = view.opened
                self._opened[place] = b"\n".join(
                    (opened.value, opened.key or b"", opened.detail.encode())
                )

    def open(self, record: TopicRecord) -> bytes | None:
        return self._opened.get((record.partition, record.offset))


OPENERS: Mapping[TopicKind, tuple[OpenerFactory, ...]] = {
    TopicKind.SEALED: (SealedEventOpener,),
    # Letters written before they were sealed keep a plain base64 ``original``.
    TopicKind.DEAD_LETTER: (SealedLetterOpener, DeadLetterOriginal),
    TopicKind.CONVERSATION_MESSAGES: (SealedMessageOpener,),
}


def openers_for(kind: TopicKind, context: OpenerContext) -> list[Opener]:
    return [factory(context) for factory in OPENERS.get(kind, ())]
