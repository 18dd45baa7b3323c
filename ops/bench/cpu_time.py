"""CPU time per process, from /proc: which process a benchmarked path spends its CPU in.

Used by ops/bench/projection.py. Linux only.

PostgreSQL and the broker are found through the services themselves, not through a stack
directory: the benchmark may run from a worktree (whose ``.stack`` does not exist) against
the stack another checkout started. The postmaster is the parent of this process's own
backend; the broker is the process listening on the bootstrap port. ops/stack's pid files
(``MEMPROJ_STACK_DIR``, else the main checkout's ``.stack``) are the fallback, for a server
that does not answer. Services in another pid namespace (Docker) are not found: then only
the workers are measured, and ``StackProcesses.missing`` says so.

Other sessions may use the same PostgreSQL: only the backends of this run (its connections
carry an ``application_name`` starting with the run's prefix) and the server's shared
processes (postmaster, checkpointer, WAL writer, ...) are counted. The broker is one process
for everyone: its figure includes whatever else the machine sends it.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parents[2]
TICKS = os.sysconf("SC_CLK_TCK")
LISTEN = "0A"  # the TCP state in /proc/net/tcp
POSTGRES_BACKENDS = "PostgreSQL backends"
POSTGRES_SHARED = "PostgreSQL shared"
BROKER = "broker"
THIS_PROCESS = "this process"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def children_of(parent: int) -> list[int]:
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and parent_of(int(entry.name)) == parent
    ]


def stack_directories() -> list[Path]:
    """Where ops/stack may keep its pid files: MEMPROJ_STACK_DIR, this checkout's .stack,
    and the main checkout's when this one is a git worktree."""
    candidates = []
    if os.environ.get("MEMPROJ_STACK_DIR"):
        candidates.append(Path(os.environ["MEMPROJ_STACK_DIR"]))
    candidates.append(REPO / ".stack")
    try:
        common = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--path-format=absolute", "--git-common-dir"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        candidates.append(Path(common).parent / ".stack")
    except (OSError, subprocess.CalledProcessError):
        pass
    return [path for path in dict.fromkeys(candidates) if path.is_dir()]


def _pid_from_file(name: str) -> int | None:
    for directory in stack_directories():
        path = directory / name
        try:
            pid = int(path.read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue
        if Path(f"/proc/{pid}").exists():
            return pid
    return None


def listening_pid(port: int) -> int | None:
    """The process with a socket listening on ``port`` (any address), from /proc."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for descriptor in (entry / "fd").iterdir():
                if os.readlink(descriptor) in inodes:
                    return int(entry.name)
        except OSError:
            continue
    return None


class StackProcesses:
    """PostgreSQL's and the broker's processes, as they are when asked (a backend that
    connected meanwhile counts from its start)."""

    def __init__(self, conninfo: str, kafka_bootstrap: str, application_prefix: str) -> None:
        self.conninfo = conninfo
        self.application_prefix = application_prefix
        self.missing: list[str] = []
        self.postmaster = self._find_postmaster()
        port = int(kafka_bootstrap.split(",")[0].rsplit(":", 1)[1])
        self.broker = listening_pid(port) or _pid_from_file("kafka/kafka.pid")
        if self.postmaster is None:
            self.missing.append("PostgreSQL")
        if self.broker is None:
            self.missing.append("the broker")

    def _connect(self) -> psycopg.Connection[tuple[object, ...]]:
        # Its own name, so that the meter's queries are not counted as the run's work.
        return psycopg.connect(self.conninfo, application_name="memproj-bench-meter")

    def _find_postmaster(self) -> int | None:
        try:
            with self._connect() as conn:
                row = conn.execute("SELECT pg_backend_pid()").fetchone()
        except psycopg.Error:
            row = None
        if row is not None:
            backend = int(str(row[0]))
            parent = parent_of(backend)
            if parent is not None and Path(f"/proc/{backend}").exists():
                return parent
        return _pid_from_file("postgres/data/postmaster.pid")

    def current(self) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        if self.postmaster is not None:
            found.update(self._postgres())
        if self.broker is not None:
            found[BROKER] = [self.broker]
        return found

    def _postgres(self) -> dict[str, list[int]]:
        assert self.postmaster is not None
        children = set(children_of(self.postmaster))
        try:
            with self._connect() as conn:
                rows = conn.execute(
                    "SELECT pid, backend_type, application_name FROM pg_stat_activity"
                ).fetchall()
        except psycopg.Error:
            return {POSTGRES_SHARED: [self.postmaster, *sorted(children)]}
        clients = {int(str(pid)) for pid, kind, _ in rows if kind == "client backend"}
        ours = [
            int(str(pid))
            for pid, kind, name in rows
            if kind == "client backend" and str(name or "").startswith(self.application_prefix)
        ]
        # Everything but client backends (checkpointer, WAL writer, autovacuum, ...), plus
        # children too young to be listed yet: they serve every client, this run among them.
        shared = [self.postmaster, *sorted(children - clients)]
        return {POSTGRES_BACKENDS: sorted(set(ours) & children), POSTGRES_SHARED: shared}


class CpuMeter:
    """CPU seconds spent by named processes between ``start`` and ``stop``. The processes are
    listed again at the stop, so that a PostgreSQL backend that connected meanwhile counts."""

    def __init__(
        self,
        workers: Mapping[str, list[int]] | None = None,
        stack: StackProcesses | None = None,
    ) -> None:
        self._workers = dict(workers or {})
        self._stack = stack
        self._started: dict[int, float] = {}
        self._process_started = 0.0
        self.spent: dict[str, float] = {}

    def _processes(self) -> dict[str, list[int]]:
        stack = self._stack.current() if self._stack is not None else {}
        return {**self._workers, **stack}

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
        self.spent[THIS_PROCESS] = time.process_time() - self._process_started

    def per_event(self, events: int) -> dict[str, float]:
        return {name: round(1e6 * spent / events, 1) for name, spent in self.spent.items()}


def total(per_event: Mapping[str, float]) -> float:
    """Every process's CPU per event together: workers (or the bare upsert's client),
    PostgreSQL and the broker."""
    return round(sum(per_event.values()), 1)
