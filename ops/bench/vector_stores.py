"""The vector store side by side: LanceDB on disk against PostgreSQL's ``vector_entries``, in
one run, through the ``VectorStore`` port the workers and the API use.

    .venv/bin/python ops/bench/vector_stores.py [--sizes 10,100,1000,10000] [--background 20000]
        [--queries 200] [--erasures 200] [--rounds 1] [--json out.json]

Needs the stack's PostgreSQL (``ops/stack up``; the run makes a schema of its own and drops
it). Each backend runs in a child process of its own, so that its resident memory is its
own (``VmHWM``, the peak, and ``VmRSS`` at the end); with ``--rounds 2`` they alternate
(A B A B) and the medians are reported, so that the shared machine's drift falls on both.

One tenant holds one subject of each of ``--sizes`` entries and ``--background`` entries of
subjects of 10 (the hashing embedder's 256-dimension vectors, texts of about 300
characters, embedded before any timing). Measured, per backend:

- index: every entry upserted in batches of ``BATCH`` (the indexer's batches), entries/s;
- search: per subject size, ``--queries`` searches of that subject as a read asks them
  (``search_candidates``: 40 candidates, memories only), p50 and p99 of the wall time;
- erase: ``--erasures`` subjects of the background erased ``ERASE_BATCH`` at a time, as the
  embeddings store erases a batch of tombstones (one ``remove_any``, one ``purge_history``:
  LanceDB's rewrites the table and drops its old versions; PostgreSQL's has nothing to do),
  erasures/s;
- CPU per operation, of every process that does the work: the child itself, and for
  PostgreSQL its backends and shared processes (``ops/bench/cpu_time.py``).

No assertion: the numbers go into ops/decisions/vector-store.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

# ops/bench/*.py, beside this script
from cpu_time import POSTGRES_BACKENDS, POSTGRES_SHARED, THIS_PROCESS, CpuMeter, StackProcesses
from environment import application_prefix, drop, isolated, percentile, prepare

from projections.embeddings.embedder import HashingEmbedder
from projections.embeddings.vectors import (
    Match,
    MemoryOnly,
    VectorEntry,
    VectorStore,
    memory_entry_id,
)
from streams.reads import CANDIDATES_PER_RESULT
from streams.services import open_vector_store
from streams.settings import Settings

BACKENDS = ("lancedb", "postgres")
TENANT = "acme"
BACKGROUND_SUBJECT = 10  # entries per background subject
BATCH = 256  # entries per upsert
ERASE_BATCH = 10  # subjects per remove_any + purge_history
LIMIT = 10 * CANDIDATES_PER_RESULT  # a read of 10 results ranks 40 candidates
WORDS = (
    "tea", "coffee", "morning", "flights", "window", "seat", "Lisbon", "bakery", "cats",
    "invoice", "ticket", "manager", "jazz", "opera", "allergic", "peanuts", "train", "river",
)  # fmt: skip
KINDS = ("preference", "fact", "event")
MEASURED = (THIS_PROCESS, POSTGRES_BACKENDS, POSTGRES_SHARED)


def text_of(n: int) -> str:
    words = [WORDS[(n * 7 + i * 3 + n // 5) % len(WORDS)] for i in range(40)]
    return f"memory {n}: " + " ".join(words)


class Population:
    """One subject of each of ``sizes`` entries and ``background`` entries of subjects of
    ``BACKGROUND_SUBJECT``: their vectors embedded at once into one float32 array (32 MB for
    31,000 entries), the entries made a batch at a time, so that what the process holds is
    the store's, not the benchmark's (a tuple of 256 Python floats is 8 KB)."""

    def __init__(self, sizes: Sequence[int], background: int) -> None:
        subjects = [(f"size-{size}", size) for size in sizes]
        subjects += [
            (f"bg-{n}", BACKGROUND_SUBJECT) for n in range(background // BACKGROUND_SUBJECT)
        ]
        self.specs = [(subject, n) for subject, count in subjects for n in range(count)]
        embedder = HashingEmbedder(256)
        self.vectors = np.empty((len(self.specs), 256), dtype=np.float32)
        for start in range(0, len(self.specs), 1000):
            stop = min(start + 1000, len(self.specs))
            self.vectors[start:stop] = embedder.embed([text_of(i) for i in range(start, stop)])
        self.now = datetime.now(UTC)

    def __len__(self) -> int:
        return len(self.specs)

    def batch(self, start: int, stop: int) -> list[VectorEntry]:
        return [self.entry(i) for i in range(start, min(stop, len(self.specs)))]

    def entry(self, i: int) -> VectorEntry:
        subject, n = self.specs[i]
        return VectorEntry(
            id=memory_entry_id(TENANT, f"{subject}-{n}"),
            kind="memory",
            tenant_id=TENANT,
            subject_type="user",
            subject_id=subject,
            memory_id=f"{subject}-{n}",
            conversation_id=None,
            message_id=None,
            source_type="message",
            source_ref=f"conv/{subject}/{n}",
            text=text_of(i),
            version=1,
            occurred_at=self.now,
            vector=tuple(self.vectors[i].tolist()),
            memory_kind=KINDS[n % len(KINDS)],
            scope="user",
        )


def memory_mb() -> dict[str, float]:
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in ("VmHWM", "VmRSS"):
            found[key] = round(int(line.split()[1]) / 1024, 1)
    return found


def metered(meter: CpuMeter, work: Callable[[], None]) -> tuple[float, dict[str, float]]:
    """Wall seconds and CPU seconds per process group of ``work``."""
    meter.start()
    began = time.perf_counter()
    work()
    wall = time.perf_counter() - began
    meter.stop()
    spent = {
        name: meter.spent.get(name, 0.0)
        for name in (THIS_PROCESS, POSTGRES_BACKENDS, POSTGRES_SHARED)
    }
    return wall, spent


def child(backend: str, settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    """One backend's whole measurement, in this (child) process."""
    sizes = [int(size) for size in args.sizes.split(",")]
    entries = Population(sizes, args.background)
    stack = StackProcesses(
        settings.postgres_conninfo, settings.kafka_bootstrap, application_prefix(args.run)
    )
    meter = CpuMeter(stack=stack)
    settings = settings.model_copy(
        update={"vector_store": backend, "embedder": "hashing", "embedding_dim": 256}
    )
    store: VectorStore = open_vector_store(settings)
    report: dict[str, Any] = {"backend": backend, "entries": len(entries)}
    opened = memory_mb()

    def index() -> None:
        for start in range(0, len(entries), BATCH):
            store.upsert(entries.batch(start, start + BATCH))

    wall, cpu = metered(meter, index)
    if backend == "postgres":
        # Its statistics, which autovacuum gathers within a minute of the load (its naptime):
        # before, a fresh table has none, and the planner may read a few ids through the
        # subject index on the tenant alone.
        with psycopg.connect(settings.postgres_conninfo, autocommit=True) as conn:
            conn.execute("ANALYZE vector_entries")
    report["index"] = {
        "entries_per_s": round(len(entries) / wall),
        "cpu_ms_per_1000": {k: round(1e6 * v / len(entries), 1) for k, v in cpu.items()},
    }

    embedder = HashingEmbedder(256)
    queries = embedder.embed(
        [f"{WORDS[n % len(WORDS)]} and {WORDS[(n * 5) % len(WORDS)]}" for n in range(args.queries)]
    )
    only = MemoryOnly()
    report["search"] = {}
    for size in sizes:
        subject = ("user", f"size-{size}")
        for query in queries[:5]:  # warm: pages cached, indexes loaded
            store.search_candidates(TENANT, query, LIMIT, subject, only)
        times: list[float] = []

        def search(
            subject: tuple[str, str] = subject, times: list[float] = times, size: int = size
        ) -> None:
            for query in queries:
                began = time.perf_counter()
                found = store.search_candidates(TENANT, query, LIMIT, subject, only)
                times.append((time.perf_counter() - began) * 1000)
                assert len(found) == min(LIMIT, size), (size, len(found))

        _, cpu = metered(meter, search)
        report["search"][str(size)] = {
            "p50_ms": round(percentile(times, 0.50), 2),
            "p99_ms": round(percentile(times, 0.99), 2),
            "cpu_ms_per_search": {k: round(1e3 * v / len(queries), 2) for k, v in cpu.items()},
        }

    erased_subjects = [f"bg-{n}" for n in range(args.erasures)]

    def erase() -> None:
        for start in range(0, len(erased_subjects), ERASE_BATCH):
            batch = erased_subjects[start : start + ERASE_BATCH]
            removed = store.remove_any([Match(TENANT, subject=("user", s)) for s in batch])
            store.purge_history()
            assert removed == len(batch) * BACKGROUND_SUBJECT, removed

    wall, cpu = metered(meter, erase)
    report["erase"] = {
        "erasures_per_s": round(len(erased_subjects) / wall, 1),
        "cpu_ms_per_erasure": {k: round(1e3 * v / len(erased_subjects), 1) for k, v in cpu.items()},
    }
    report["rss_mb"] = {"after_open": opened.get("VmRSS"), **memory_mb()}
    return report


def total(cpu: dict[str, float]) -> float:
    return round(sum(cpu.values()), 2)


def table(reports: dict[str, list[dict[str, Any]]], sizes: Sequence[int]) -> str:
    """The markdown table: medians over the rounds, and PostgreSQL / LanceDB."""

    def median(backend: str, pick: Callable[[dict[str, Any]], float]) -> float:
        return statistics.median(pick(report) for report in reports[backend])

    Pick = Callable[[dict[str, Any]], float]

    def search(size: int, field: str) -> Pick:
        return lambda report: float(report["search"][str(size)][field])

    def search_cpu(size: int) -> Pick:
        return lambda report: total(report["search"][str(size)]["cpu_ms_per_search"])

    rows: list[tuple[str, Pick]] = []
    for size in sizes:
        rows += [
            (f"search p50 ms, subject of {size:,}", search(size, "p50_ms")),
            (f"search p99 ms, subject of {size:,}", search(size, "p99_ms")),
            (f"search CPU ms (all processes), subject of {size:,}", search_cpu(size)),
        ]
    rows += [
        ("index, entries/s", lambda r: r["index"]["entries_per_s"]),
        ("index CPU ms per 1,000 entries", lambda r: total(r["index"]["cpu_ms_per_1000"])),
        ("erase, erasures/s (subjects of 10)", lambda r: r["erase"]["erasures_per_s"]),
        ("erase CPU ms per erasure", lambda r: total(r["erase"]["cpu_ms_per_erasure"])),
        ("RSS MB, peak (VmHWM)", lambda r: r["rss_mb"]["VmHWM"]),
        ("RSS MB, at the end", lambda r: r["rss_mb"]["VmRSS"]),
    ]
    lines = [
        "| measure | LanceDB | PostgreSQL | PostgreSQL / LanceDB |",
        "|---|---:|---:|---:|",
    ]
    for name, pick in rows:
        lance, pg = median("lancedb", pick), median("postgres", pick)
        ratio = f"{pg / lance:.2f}" if lance else "-"
        lines.append(f"| {name} | {lance:,.2f} | {pg:,.2f} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,100,1000,10000")
    parser.add_argument("--background", type=int, default=20000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--erasures", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", choices=BACKENDS, help=argparse.SUPPRESS)
    parser.add_argument("--run", default=f"vec{uuid.uuid4().hex[:8]}", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    base = Settings()
    if args.child:
        environment = json.loads(os.environ["MEMPROJ_BENCH_ENVIRONMENT"])
        settings = base.model_copy(
            update={
                "postgres_dsn": environment["dsn"],
                "data_dir": Path(environment["data_dir"]),
            }
        )
        args.out.write_text(json.dumps(child(args.child, settings, args)))
        return
    sizes = [int(size) for size in args.sizes.split(",")]
    reports: dict[str, list[dict[str, Any]]] = {backend: [] for backend in BACKENDS}
    for round_ in range(args.rounds):
        for backend in BACKENDS:
            environment = isolated(base, args.run, f"{backend}{round_}")
            prepare(base, environment, specs=())
            try:
                with tempfile.NamedTemporaryFile(suffix=".json") as out:
                    passed = [
                        f"--{name}={getattr(args, name)}"
                        for name in ("sizes", "background", "queries", "erasures", "run")
                    ]
                    subprocess.run(
                        [
                            sys.executable,
                            __file__,
                            f"--child={backend}",
                            f"--out={out.name}",
                            *passed,
                        ],
                        check=True,
                        env={
                            **os.environ,
                            "MEMPROJ_BENCH_ENVIRONMENT": json.dumps(
                                {
                                    "dsn": environment.settings.postgres_dsn,
                                    "data_dir": str(environment.data_dir),
                                }
                            ),
                        },
                    )
                    report = json.loads(Path(out.name).read_text())
            finally:
                drop(base, [environment], [])
            reports[backend].append(report)
            print(json.dumps(report), file=sys.stderr)
    print(table(reports, sizes))
    if args.json:
        args.json.write_text(json.dumps(reports, indent=2) + "\n")


if __name__ == "__main__":
    main()
