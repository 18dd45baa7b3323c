"""What a search by text costs by meaning, by exact words and both fused, side by side.

    .venv/bin/python ops/bench/hybrid_search.py [--sizes 100,1000,10000] [--queries 60]
        [--backends postgres,lancedb] [--json out.json]

Needs the stack's PostgreSQL (``ops/stack up``; the run makes a schema of its own and drops
it). Per backend, one tenant holds a subject of each of ``--sizes`` memories (texts of about
200 characters, each with an invoice number, a ticket id and a product code among common
words; the hashing embedder's 256-dimension vectors, embedded before any timing). Each query
ranks the subject's candidates as a read of 10 answers does (``streams.reads.rank_by_text``:
40 candidates, memories only) in each mode, alternated query by query (A B C A B C, so that
the shared machine's drift falls on all three); half the queries name an id, half are words.

Reported per backend, size and mode: the median and p99 wall milliseconds of a ranking, and
the CPU milliseconds per ranking of this process (embedding the query included: the hashing
embedder's, far cheaper than the default model's, which semantic and hybrid pay alike and
lexical not at all) and of PostgreSQL's backends (``ops/bench/cpu_time.py``). No assertion:
the numbers go into ops/decisions/hybrid-retrieval.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from typing import Any

import psycopg

# ops/bench/*.py, beside this script
from cpu_time import POSTGRES_BACKENDS, THIS_PROCESS, CpuMeter, StackProcesses
from environment import application_prefix, drop, isolated, percentile, prepare
from search_cost import TENANT, entries

from projections.embeddings.embedder import HashingEmbedder
from projections.embeddings.vectors import (
    SEARCH_MODES,
    VectorStore,
)
from projections.memory.store import RecallQuery
from streams.reads import rank_by_text
from streams.services import open_vector_store
from streams.settings import Settings

LIMIT = 10  # answers asked: the ranking proposes LIMIT x CANDIDATES_PER_RESULT
BATCH = 500
WORDS = (
    "tea", "coffee", "morning", "flights", "window", "seat", "Lisbon", "bakery", "cats",
    "invoice", "ticket", "order", "paid", "late", "the", "of", "renewal", "support",
)  # fmt: skip


def text_of(n: int) -> str:
    words = " ".join(WORDS[(n * 7 + i * 3) % len(WORDS)] for i in range(20))
    return f"{words}; invoice INV-2024-{n:05d}, ticket TCK-{80000 + n}, SKU AB-{n % 97}-X"


def queries(size: int, count: int) -> list[str]:
    asked = []
    for n in range(count):
        if n % 2:
            asked.append(f"what about invoice INV-2024-{(n * 37) % size:05d}?")
        else:
            asked.append(f"{WORDS[n % len(WORDS)]} in the {WORDS[(n * 5) % len(WORDS)]}")
    return asked


async def rank_all(
    store: VectorStore,
    embedder: HashingEmbedder,
    stack: StackProcesses | None,
    size: int,
    count: int,
) -> dict[str, Any]:
    """Every query of one subject in each mode, in one event loop (as the API's)."""
    query = RecallQuery(TENANT, "user", f"size-{size}", limit=LIMIT)
    asked = queries(size, count)
    for text in asked[:4]:  # warm: pages cached, indexes loaded
        for mode in SEARCH_MODES:
            await rank_by_text(store, embedder, query, text, mode)
    walls: dict[str, list[float]] = {mode: [] for mode in SEARCH_MODES}
    cpu: dict[str, dict[str, float]] = {
        mode: {THIS_PROCESS: 0.0, POSTGRES_BACKENDS: 0.0} for mode in SEARCH_MODES
    }
    for text in asked:
        for mode in SEARCH_MODES:
            meter = CpuMeter(stack=stack)
            meter.start()
            began, began_cpu = time.perf_counter(), time.process_time()
            await rank_by_text(store, embedder, query, text, mode)
            walls[mode].append(time.perf_counter() - began)
            # This process's own clock: the meter's stop lists the stack's processes first.
            cpu[mode][THIS_PROCESS] += time.process_time() - began_cpu
            meter.stop()
            cpu[mode][POSTGRES_BACKENDS] += meter.spent.get(POSTGRES_BACKENDS, 0.0)
    return {
        mode: {
            "p50_ms": round(1000 * statistics.median(walls[mode]), 2),
            "p99_ms": round(1000 * percentile(walls[mode], 0.99), 2),
            "cpu_ms": {k: round(1000 * v / len(asked), 2) for k, v in cpu[mode].items()},
        }
        for mode in SEARCH_MODES
    }


def measure(backend: str, base: Settings, sizes: list[int], count: int, run: str) -> dict[str, Any]:
    environment = isolated(base, run, backend)
    prepare(base, environment, specs=())
    try:
        settings = environment.settings.model_copy(
            update={"vector_store": backend, "embedder": "hashing", "embedding_dim": 256}
        )
        store: VectorStore = open_vector_store(settings)
        embedder = HashingEmbedder(256)
        for size in sizes:
            population = entries(size, embedder, ("user", f"size-{size}"), text_of)
            for start in range(0, len(population), BATCH):
                store.upsert(population[start : start + BATCH])
        if backend == "postgres":
            with psycopg.connect(settings.postgres_conninfo, autocommit=True) as conn:
                conn.execute("ANALYZE vector_entries")
        stack = StackProcesses(
            settings.postgres_conninfo, settings.kafka_bootstrap, application_prefix(run)
        )
        report: dict[str, Any] = {}
        for size in sizes:
            report[str(size)] = asyncio.run(
                rank_all(store, embedder, stack if backend == "postgres" else None, size, count)
            )
            print(json.dumps({backend: {size: report[str(size)]}}))
        return report
    finally:
        drop(base, [environment], [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--backends", default="postgres,lancedb")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    run = f"hyb{uuid.uuid4().hex[:8]}"
    base = Settings()
    reports = {
        backend: measure(backend, base, sizes, args.queries, f"{run}{backend[:2]}")
        for backend in args.backends.split(",")
    }
    print(json.dumps(reports, indent=2))
    if args.json:
        with open(args.json, "w") as out:
            out.write(json.dumps(reports, indent=2) + "\n")


if __name__ == "__main__":
    main()
