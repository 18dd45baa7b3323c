"""Reading dead letters: each opened while its key lives, or why it does not open."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from projections.deadletters.keys import key_state, load_keys
from projections.deadletters.sealing import LetterSealer, Opened, Position
from projections.sealing.crypto import Unreadable
from projections.sql import Conn
from topics.outputs import DeadLetter

# What a reader finds: a key state, a letter written before sealing ("plaintext": its
# ``original`` is the contract's base64) or one whose seal does not open with its key.
LetterState = Literal["open", "erased", "expired", "missing", "plaintext", "unreadable"]


@dataclass(frozen=True, slots=True)
class LetterView:
    """A dead letter as a reader sees it: opened while its key lives."""

    letter: DeadLetter
    state: LetterState
    opened: Opened | None = None
    erased_by: str | None = None


async def open_letters(
    conn: Conn, sealer: LetterSealer, letters: Sequence[DeadLetter], now: datetime
) -> list[LetterView]:
    """Open each letter whose key lives; say why the others do not open."""
    sealed_ids = [lt.sealed_original.key_id for lt in letters if lt.sealed_original is not None]
    stored = await load_keys(conn, sealed_ids) if sealed_ids else {}
    views = []
    for letter in letters:
        sealed = letter.sealed_original
        if sealed is None:
            original = base64.b64decode(letter.original)
            key = None if letter.key is None else letter.key.encode()
            views.append(LetterView(letter, "plaintext", Opened(original, key, letter.error)))
            continue
        row = stored.get(sealed.key_id)
        state = key_state(row, letter.failed_at, now, sealer.retention)
        if state != "open" or row is None or row.wrapped_key is None:
            views.append(LetterView(letter, state, erased_by=row.erased_by if row else None))
            continue
        at = Position(letter.topic, letter.partition, letter.offset)
        try:
            opened = sealer.open(sealed, row.wrapped_key, at, row.master_key_id)
            views.append(LetterView(letter, "open", opened))
        except (Unreadable, ValueError, KeyError, TypeError):
            views.append(LetterView(letter, "unreadable"))
    return views
