"""The purge checks of the Kafka places (streams.purge) over fake logs: memory.current
rewritten past the nulls, raw input trimmed past the mark."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence

from streams.purge import MemoryCurrentCompacted, RawInputTrimmed
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
