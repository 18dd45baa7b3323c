"""Scale-out: memory workers join and leave during a live apply, and nothing changes.

The run's stream is produced at a fixed rate into a pipeline of its own (the run's memory
workers, which seal and project the raw topic in one stage); a third and then a fourth memory
worker join, then one of the first leaves (SIGTERM: it drains, commits and leaves the group).
Once everything is applied the projection's checksum (``projections.memory.store.checksums``:
counts and a digest of current records and history, per tenant) must equal the live apply's,
which applied the same stream without churn.

The rebalance pauses come from the projection's own progress: its tracked offsets of the raw
topic (``projection_offsets``, written in each batch's transaction) are sampled every 50 ms.
Around each join or leave, from the moment the worker was started or signalled to 3 s after
the group was stable again, it reports the longest time the whole group committed nothing
(every partition stopped) and the longest any one partition committed nothing (a partition
moving between members). The same two figures over the steady stretch before the first join
are the baseline: batches are committed every ``MEMPROJ_BATCH_MAX_WAIT_SECONDS`` or so anyway.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
from environment import Message, PacedProducer  # ops/bench/environment.py
from pipeline import Workers, pipeline_kinds  # ops/bench/pipeline.py
from rss import PeakRss  # ops/bench/rss.py

from streams.settings import Settings
from topics.registry import MEMORY_EVENTS

SAMPLE_SECONDS = 0.05
SETTLED_MARGIN_SECONDS = 3.0


class ProgressSampler:
    """The memory projection's tracked offset per partition of the raw topic it reads (and
    seals) over time."""

    def __init__(self, settings: Settings) -> None:
        self._conninfo = settings.postgres_conninfo
        self._topic = settings.topics.name(MEMORY_EVENTS)
        self.samples: list[tuple[float, dict[int, int]]] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def __enter__(self) -> ProgressSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stopping.set()
        self._thread.join()

    def _run(self) -> None:
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            while not self._stopping.is_set():
                rows = conn.execute(
                    "SELECT partition, next_offset FROM projection_offsets"
                    " WHERE projection = 'memory' AND topic = %s",
                    (self._topic,),
                ).fetchall()
                offsets = {int(str(p)): int(str(o)) for p, o in rows}
                self.samples.append((time.monotonic(), offsets))
                self._stopping.wait(SAMPLE_SECONDS)

    def advances(self) -> tuple[list[float], dict[int, list[float]]]:
        """When the group's total and each partition's offset moved on."""
        total: list[float] = []
        partitions: dict[int, list[float]] = {}
        previous: dict[int, int] = {}
        for moment, offsets in self.samples:
            moved = [p for p, o in offsets.items() if o > previous.get(p, -1)]
            for partition in moved:
                partitions.setdefault(partition, []).append(moment)
            if moved:
                total.append(moment)
            previous = offsets
        return total, partitions


def longest_stall(advances: Sequence[float], start: float, end: float) -> float:
    """The longest time within [start, end] with no advance (seconds)."""
    inside = [moment for moment in advances if start < moment < end]
    points = [start, *inside, end]
    return max((b - a for a, b in itertools.pairwise(points)), default=0.0)


@dataclass(frozen=True)
class Churn:
    what: str  # "join #3", "join #4", "leave #1"
    started: float
    settled: float

    def window(self, end: float) -> tuple[float, float]:
        return self.started, min(end, self.settled + SETTLED_MARGIN_SECONDS)


@dataclass(frozen=True)
class ScaleOut:
    same_checksum: bool
    rate: float
    pauses: list[dict[str, object]]

    def as_json(self) -> dict[str, object]:
        return {
            "same_checksum_as_live_apply": self.same_checksum,
            "rate_events_per_s": round(self.rate),
            "pauses": self.pauses,
        }


def measure_scale_out(
    settings: Settings,
    messages: Sequence[Message],
    log_path: Path,
    memory_workers: int,
    rate: float,
    expected_checksum: object,
    checksum: Callable[[Settings], object],
    peak_rss: PeakRss | None = None,
) -> ScaleOut:
    """Join two memory workers and let one leave while ``messages`` are produced at
    ``rate``; ``checksum(settings)`` of the result is compared with ``expected_checksum``."""
    duration = len(messages) / rate
    with Workers(settings, log_path, pipeline_kinds(memory_workers), peak_rss) as workers:
        workers.warm_up(list(messages))
        with ProgressSampler(settings) as progress:
            producer = PacedProducer(settings, messages[1:], rate).start()
            began = time.monotonic()
            churn: list[Churn] = []

            def at(share: float) -> None:
                time.sleep(max(0.0, began + share * duration - time.monotonic()))

            for share, joining in ((0.2, memory_workers + 1), (0.4, memory_workers + 2)):
                at(share)
                started = time.monotonic()
                workers.start("memory")
                workers.wait_until_stable("memory", len(workers.running("memory")))
                churn.append(Churn(f"join #{joining}", started, time.monotonic()))
            at(0.65)
            leaving = workers.running("memory")[0]
            started = time.monotonic()
            workers.stop(leaving)
            workers.wait_until_stable("memory", len(workers.running("memory")))
            churn.append(Churn("leave #1", started, time.monotonic()))
            producer.join()
            produced_until = time.monotonic()
            workers.wait()
        same = checksum(settings) == expected_checksum
    total, partitions = progress.advances()
    steady = (began + 2.0, churn[0].started)
    pauses = [_pauses("steady (before any join)", steady, total, partitions)]
    pauses += [
        _pauses(c.what, c.window(produced_until), total, partitions, c.settled - c.started)
        for c in churn
    ]
    return ScaleOut(same, len(messages) / (produced_until - began), pauses)


def _pauses(
    what: str,
    window: tuple[float, float],
    total: list[float],
    partitions: dict[int, list[float]],
    settle_seconds: float | None = None,
) -> dict[str, object]:
    start, end = window
    per_partition = max(
        (longest_stall(moments, start, end) for moments in partitions.values()), default=0.0
    )
    return {
        "what": what,
        "window_s": round(end - start, 1),
        "until_group_stable_s": None if settle_seconds is None else round(settle_seconds, 2),
        "longest_pause_all_partitions_ms": round(1000 * longest_stall(total, start, end)),
        "longest_pause_one_partition_ms": round(1000 * per_partition),
    }
