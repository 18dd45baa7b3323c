"""CPU time per process, from /proc: which process a benchmarked path spends its CPU in.

Used by ops/bench/projection.py. Linux only; PostgreSQL and Kafka are found through the pid
files of the native stack (ops/stack), so under Docker only the workers are measured.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STACK = Path(os.environ.get("MEMPROJ_STACK_DIR", REPO / ".stack"))
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def stack_processes() -> dict[str, list[int]]:
    """The native stack's PostgreSQL (postmaster and its backends) and Kafka processes."""
    found: dict[str, list[int]] = {}
    postmaster = STACK / "postgres" / "data" / "postmaster.pid"
    kafka = STACK / "kafka" / "kafka.pid"
    if postmaster.exists():
        parent = int(postmaster.read_text().split()[0])
        children = [
            int(stat.parent.name)
            for stat in Path("/proc").glob("[0-9]*/stat")
            if _parent_of(stat) == parent
        ]
        found["postgres"] = [parent, *children]
    if kafka.exists():
        found["kafka"] = [int(kafka.read_text().split()[0])]
    return found


def _parent_of(stat: Path) -> int | None:
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


class CpuMeter:
    """CPU seconds spent by named processes between ``start`` and ``stop``. The processes are
    listed again at the stop, so that a PostgreSQL backend that connected meanwhile counts."""

    def __init__(self, workers: dict[str, list[int]] | None = None) -> None:
        self._workers = workers or {}
        self._started: dict[int, float] = {}
        self._process_started = 0.0
        self.spent: dict[str, float] = {}

    def _processes(self) -> dict[str, list[int]]:
        return {**self._workers, **stack_processes()}

    def start(self) -> None:
        self._started = {
            pid: cpu_seconds(pid) for pids in self._processes().values() for pid in pids
        }
        self._process_started = time.process_time()

    def stop(self) -> None:
        self.spent = {
            name: sum(cpu_seconds(pid) - self._started.get(pid, 0.0) for pid in pids)
            for name, pids in self._processes().items()
        }
        # this process: the producer during the live apply, the client of the bare upsert
        self.spent["this process"] = time.process_time() - self._process_started

    def per_event(self, events: int) -> dict[str, float]:
        return {name: round(1e6 * spent / events, 1) for name, spent in self.spent.items()}
