"""Peak resident memory of every worker the benchmark starts, per worker kind.

The kernel keeps each process's high-water mark (``VmHWM`` in /proc/<pid>/status), so a
sample every half second misses no peak, only the growth after the last sample before a
process exits: the workers are sampled once more right before they are stopped.
"""

from __future__ import annotations

import threading
from pathlib import Path

LIMIT_MB = 300.0  # the hot path's target: every worker's RSS stays under it through the benchmark


def peak_rss_mb(pid: int) -> float | None:
    """The process's peak resident set so far, in MB (None once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


class PeakRss:
    """Samples the registered worker processes in a thread of its own until ``close``."""

    def __init__(self, interval_seconds: float = 0.5) -> None:
        self._interval = interval_seconds
        self._kinds: dict[int, str] = {}
        self._peaks: dict[int, float] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-rss", daemon=True)
        self._thread.start()

    def watch(self, pid: int, kind: str) -> None:
        with self._lock:
            self._kinds[pid] = kind

    def sample(self, pids: list[int] | None = None) -> None:
        with self._lock:
            chosen = list(self._kinds) if pids is None else pids
            for pid in chosen:
                peak = peak_rss_mb(pid)
                if peak is not None:
                    self._peaks[pid] = max(peak, self._peaks.get(pid, 0.0))

    def _run(self) -> None:
        while not self._closed.wait(self._interval):
            self.sample()

    def close(self) -> None:
        self._closed.set()
        self._thread.join()
        self.sample()

    def by_kind(self) -> dict[str, float]:
        """The highest peak of any process of each kind, in MB."""
        with self._lock:
            peaks: dict[str, float] = {}
            for pid, peak in self._peaks.items():
                kind = self._kinds[pid]
                peaks[kind] = round(max(peak, peaks.get(kind, 0.0)), 1)
            return dict(sorted(peaks.items()))
