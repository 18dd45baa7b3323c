"""The purge checks of the Kafka places (streams.purge) over fake logs: memory.current
rewritten past the nulls, raw input trimmed past the mark; and the purge round against the
real PostgreSQL: one deletion worker at a time, every step idempotent."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from projections.deletion.purge import DuePurge
from streams.purge import MemoryCurrentCompacted, PurgeRound, RawInputTrimmed
from streams.services import make_pool
from support.purges import due


class FakeLog:
    def __init__(
        self,
        records: Sequence[tuple[bytes | None, bool]] = (),
        marks: dict[str, dict[str, tuple[int, int]]] | None = None,
    ) -> None:
        self._records = list(records)
        self.marks = marks or {}

    def records(self, topic: str) -> Iterator[tuple[bytes | None, bool]]:
        return iter(self._records)

    def watermarks(self, topics: Sequence[str]) -> dict[str, dict[str, tuple[int, int]]]:
        return {topic: self.marks[topic] for topic in topics}


def test_memory_current_is_purged_per_deletion() -> None:
    log = FakeLog([(b"acme:m1", False), (b"acme:m2", False), (b"acme:m1", True)])
    check = MemoryCurrentCompacted(log, "memory.current")  # type: ignore[arg-type]
    purged = asyncio.run(check.purged([due("d1", ["m1"]), due("d2", ["m2"])]))
    assert purged == {("acme", "d2")}  # m2 has no null yet in this log: nothing erased there


def test_raw_input_marks_the_end_and_waits_for_the_low_watermark() -> None:
    log = FakeLog(marks={"memory.events": {"0": (3, 12)}, "conversation.events": {"0": (0, 5)}})
    check = RawInputTrimmed(log, ["memory.events", "conversation.events"])  # type: ignore[arg-type]
    mark = asyncio.run(check.mark())
    assert mark == {"memory.events": {"0": 12}, "conversation.events": {"0": 5}}
    assert asyncio.run(check.purged([due("d1", mark=mark)])) == set()
    log.marks = {"memory.events": {"0": (12, 20)}, "conversation.events": {"0": (5, 5)}}
    assert asyncio.run(check.purged([due("d1", mark=mark)])) == {("acme", "d1")}


def test_memory_current_applies_to_erasures_of_memories() -> None:
    current = MemoryCurrentCompacted(FakeLog(), "memory.current")  # type: ignore[arg-type]
    assert current.applies(due("d1")) and not current.applies(due("d2", memories=()))
    assert not current.applies(due("r1", kind="revocation"))


class HeldCheck:
    """A place whose check waits until the test lets it finish."""

    place = "held"

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    def applies(self, deletion: DuePurge) -> bool:
        return True

    async def mark(self) -> dict[str, object]:
        return {"noted": 1}

    async def purged(self, due: Sequence[DuePurge]) -> set[tuple[str, str]]:
        self.entered.set()
        await self.gate.wait()
        return {d.key for d in due}


@pytest.mark.integration
def test_one_purge_round_at_a_time_and_every_step_idempotent(env: Any) -> None:
    """Two deletion workers: while one runs a round, the other's round is skipped; a round
    repeated changes nothing."""
    tombstone = due("d1").tombstone
    with env.connect() as conn:
        conn.execute(
            "INSERT INTO deletion_requests (tenant_id, deletion_id, kind, target_type,"
            " target_id, subject_type, reason, cut_off, deadline_at, required_stores, status,"
            " completed_at, request_event_id, tombstone) VALUES ('acme', 'd1', 'erasure',"
            " 'subject', 'alice', 'user', 'test', now(), now(), %s, 'completed', now(), 'e1',"
            " %s)",
            (list(tombstone.required_stores), tombstone.model_dump_json()),
        )

    async def run() -> None:
        pool = make_pool(env.settings.postgres_dsn, 4)
        await pool.open()
        try:
            check = HeldCheck()
            first, second = PurgeRound(pool, [check]), PurgeRound(pool, [check])
            running = asyncio.create_task(first.run())
            await check.entered.wait()
            assert await second.run() is None  # the other worker holds the round
            check.gate.set()
            assert await running == [("acme", "d1")]
            assert await second.run() == []  # nothing left to do, nothing done twice
        finally:
            await pool.close()

    asyncio.run(run())
    with env.connect() as conn:
        rows = conn.execute("SELECT place, mark, purged_at IS NOT NULL FROM deletion_purges")
        assert rows.fetchall() == [("held", {"noted": 1}, True)]
        row = conn.execute("SELECT purged_at IS NOT NULL FROM deletion_requests").fetchone()
        assert row == (True,)
