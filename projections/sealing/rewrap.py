"""Re-wrapping stored data keys under the newest master key, one batch at a time: the one
routine behind every table of wrapped keys (the entities' data keys in ``sealing.keys``, the
dead letters' keys in ``deadletters.keys``), each of which owns its SQL and its wrapping.

A batch reads the rows not wrapped by the newest master key with ``FOR UPDATE SKIP LOCKED``
(rows another transaction holds are found by a later batch), opens each key with the master
key that wrapped it, wraps it under the newest, and updates only rows that still hold a key:
a key destroyed meanwhile (an erasure, an expiry) is never brought back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, LiteralString

from projections.sql import Conn

# A selected row -> the update's parameters, and the id of the master key it leaves.
RewrapRow = Callable[[tuple[Any, ...]], tuple[tuple[Any, ...], str]]


@dataclass(frozen=True, slots=True)
class Rewrapped:
    """One batch of a rotation: how many keys it re-wrapped, and the master keys they left."""

    count: int
    from_keys: dict[str, int]


async def rewrap_keys(
    conn: Conn,
    select: LiteralString,
    params: Sequence[Any],
    rewrap_row: RewrapRow,
    update: LiteralString,
) -> Rewrapped:
    """Run the owner's ``select`` (``FOR UPDATE SKIP LOCKED``), re-wrap every row it found
    (``rewrap_row``) and write them back with its ``update``, in the caller's transaction."""
    cursor = await conn.execute(select, params)
    rows = []
    from_keys: dict[str, int] = {}
    for row in await cursor.fetchall():
        updated, master_key_id = rewrap_row(tuple(row))
        rows.append(updated)
        from_keys[master_key_id] = from_keys.get(master_key_id, 0) + 1
    if rows:
        async with conn.cursor() as cursor_update:
            await cursor_update.executemany(update, rows)
    return Rewrapped(len(rows), from_keys)
