"""Master-key rotation: every wrapped key and sealed probe moved to the newest master key.

Online and in batches, each its own short transaction whose rows are taken ``FOR UPDATE SKIP
LOCKED``: workers keep running (a row one of them holds is left for a later pass), and an
interrupted rotation resumes where it stopped, since a batch only takes what the newest key
has not wrapped yet. Only existing rows are updated, so a key shredded before or during the
rotation stays shredded. After a rotation that reports nothing remaining, the older master keys
open nothing and can be removed from the settings.

Workers configured with an older key list (before the newest key was added) keep wrapping new
keys under their newest: add the new key to every worker first, then rotate; ``remaining``
counts whatever they wrote meanwhile, and the next run moves it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from projections.deadletters.keys import count_letter_keys_not_newest, rewrap_letter_keys
from projections.deadletters.sealing import LetterSealer
from projections.deletion import probes as stored_probes
from projections.sealing.crypto import Unreadable
from projections.sealing.keys import KeyStore, count_not_newest, rewrap_batch
from projections.sealing.probes import ProbeSealer
from projections.sql import Conn

DEFAULT_BATCH = 500
# A pass leaves rows that workers held; the next pass takes them. Bounded: a row held for
# longer than this is reported as remaining, and the next run moves it.
MAX_PASSES = 5
_PASS_PAUSE_SECONDS = 0.5


@dataclass(frozen=True, slots=True)
class Sealers:
    """The three things the master keys protect, each built from the same key list."""

    entity_keys: KeyStore
    letter_keys: LetterSealer
    probes: ProbeSealer


@dataclass
class RotationReport:
    newest: str
    entity_keys: Counter[str] = field(default_factory=Counter)
    letter_keys: Counter[str] = field(default_factory=Counter)
    probes: int = 0
    # Left under another key (rows workers held through every pass, or wrote meanwhile).
    remaining_entity_keys: dict[str, int] = field(default_factory=dict)
    remaining_letter_keys: dict[str, int] = field(default_factory=dict)
    remaining_probes: int = 0
    # Probes no configured key opens: they cannot be verified with, whatever the rotation.
    unreadable_probes: int = 0
    passes: int = 0

    @property
    def complete(self) -> bool:
        return not (
            self.remaining_entity_keys or self.remaining_letter_keys or self.remaining_probes
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "newest_master_key": self.newest,
            "rewrapped": {
                "entity_keys": sum(self.entity_keys.values()),
                "dead_letter_keys": sum(self.letter_keys.values()),
                "probes": self.probes,
            },
            "rewrapped_from": {
                "entity_keys": dict(sorted(self.entity_keys.items())),
                "dead_letter_keys": dict(sorted(self.letter_keys.items())),
            },
            "remaining": {
                "entity_keys": self.remaining_entity_keys,
                "dead_letter_keys": self.remaining_letter_keys,
                "probes": self.remaining_probes,
            },
            "unreadable_probes": self.unreadable_probes,
            "passes": self.passes,
            "complete": self.complete,
        }


async def reseal_probes(conn: Conn, probes: ProbeSealer, limit: int, report: RotationReport) -> int:
    """Re-seal every sealed probe not sealed by the newest key, ``limit`` rows a transaction,
    in key order; the number of probes no configured key opens (they are left as they are)."""
    after: stored_probes.ProbeId | None = None
    unreadable = 0
    while True:
        async with conn.transaction():
            rows = await stored_probes.lock_sealed_batch(conn, after, limit)
            updates = []
            for tenant, deletion, item_type, item_id, sealed in rows:
                try:
                    resealed = probes.reseal(tenant, deletion, item_type, item_id, bytes(sealed))
                except Unreadable:
                    unreadable += 1
                    continue
                if resealed is not None:
                    updates.append((resealed, tenant, deletion, item_type, item_id))
            await stored_probes.replace_sealed(conn, updates)
            report.probes += len(updates)
        if len(rows) < limit:
            return unreadable
        last = rows[-1]
        after = (last[0], last[1], last[2], last[3])


async def probes_not_newest(conn: Conn, probes: ProbeSealer) -> tuple[int, int]:
    """Sealed probes under an older key, and those no configured key opens."""
    older = unreadable = 0
    for tenant, deletion, item_type, item_id, sealed in await stored_probes.sealed(conn):
        try:
            if probes.reseal(tenant, deletion, item_type, item_id, bytes(sealed)) is not None:
                older += 1
        except Unreadable:
            unreadable += 1
    return older, unreadable


async def remaining(conn: Conn, sealers: Sealers, report: RotationReport) -> None:
    report.remaining_entity_keys = await count_not_newest(conn, sealers.entity_keys)
    report.remaining_letter_keys = await count_letter_keys_not_newest(conn, sealers.letter_keys)
    report.remaining_probes, report.unreadable_probes = await probes_not_newest(
        conn, sealers.probes
    )


async def rotate(conn: Conn, sealers: Sealers, batch: int = DEFAULT_BATCH) -> RotationReport:
    """Move every wrapped key and sealed probe to the newest master key. ``conn`` must be in
    autocommit mode: each batch is its own transaction."""
    if not conn.autocommit:
        raise ValueError("rotate needs an autocommit connection: each batch commits")
    report = RotationReport(sealers.entity_keys.key_id)
    while report.passes < MAX_PASSES:
        report.passes += 1
        while True:
            async with conn.transaction():
                entity = await rewrap_batch(conn, sealers.entity_keys, batch)
            report.entity_keys.update(entity.from_keys)
            if entity.count < batch:
                break
        while True:
            async with conn.transaction():
                letters = await rewrap_letter_keys(conn, sealers.letter_keys, batch)
            report.letter_keys.update(letters.from_keys)
            if letters.count < batch:
                break
        await reseal_probes(conn, sealers.probes, batch, report)
        await remaining(conn, sealers, report)
        if report.complete:
            break
        await asyncio.sleep(_PASS_PAUSE_SECONDS)
    return report
