"""The HTTP API under load: recall and semantic search over 100,000 memories.

    flock /tmp/bench.lock .venv/bin/python ops/bench/http_api.py [--memories 100000]
        [--subjects 2000] [--rate 20] [--search-rate 5] [--seconds 20] [--json PATH]

1. Loads ``--memories`` memories of one tenant (``--subjects`` users, 50 each by default;
   kinds and scopes mixed) through the memory projection's own path, without Kafka or HTTP:
   the contract's codec decodes the proposals, the reducer folds them and
   ``projections.memory.store.save_batch`` writes them (COPY); the embeddings store's planner
   (``plan_index``) embeds them with the API's own embedder into the vector store. 10,000 at
   a time. 100,000 proposals over HTTP would measure the producer, not the reads.
2. Starts ``memproj serve`` on a free port over that schema and vector store, with a key
   whose purpose reads every kind and scope, and a rate limit out of the way.
3. Three phases, one after the other, each for ``--seconds``, every request about another
   subject: recall at ``--rate`` requests/s (``GET /v1/subjects/user/{id}/memories``: the
   cache is cold, each answer is read from PostgreSQL and cached), the same recalls again
   (the cache holds them: what a repeated read costs), and semantic search at
   ``--search-rate`` (``GET .../search?text=``: the vector store's prefiltered search, then
   hydration). The client
   is open-loop (asyncio + httpx): each request leaves at its scheduled time whatever the
   answers before it, and its latency runs from that time to the answer, so a queue in the
   server counts against it. Before each phase one request about a subject without
   memories warms the connection and the vector store up, unmeasured.
4. CPU per request, from /proc over each phase: the server process, this run's PostgreSQL
   backends (by ``application_name``), and the client. On a shared 2-core machine read the
   ratios between phases and the CPU per request, not the absolute latencies alone. And the
   server's peak resident memory over the run (``VmHWM``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg

# ops/bench/*.py, beside this script
from cpu_time import CpuMeter, StackProcesses
from environment import (
    application_prefix,
    drop,
    isolated,
    percentile,
    prepare,
    print_and_save,
    rounded_ms,
)
from rss import peak_rss_mb

from projections.access import keys, purposes
from projections.deletion.erasure import NO_ERASURES
from projections.embeddings.embedder import Embedder
from projections.embeddings.indexer import Authoritative, MemoryUpdate, plan_index
from projections.memory import store
from projections.memory.reducer import reduce_batch
from streams.sample import EventFactory, to_message
from streams.services import build_embedder, open_vector_store
from streams.settings import Settings
from topics.codec import EventCodec
from topics.schemas import default_schemas

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "ops" / "bench" / "results"
TENANT = "bench_tenant"
PURPOSE = "bench"
CHUNK = 10_000
KINDS = ("preference", "fact", "profile", "goal")
SCOPES = ("user", "account", "support")
VOCABULARY = (
    "email invoice receipt phone call morning evening weekend holiday travel train flight "
    "hotel coffee tea vegetarian vegan allergy peanut gluten spanish portuguese english "
    "french german newsletter discount refund delivery courier parcel address lisbon porto "
    "madrid berlin paris london office remote meeting calendar reminder password security "
    "billing monthly annual plan premium basic support ticket chat callback priority"
)
WORDS = tuple(VOCABULARY.split())


def memory_events(count: int, subjects: int, seed: int) -> Iterator[tuple[bytes, bytes]]:
    """One ``memory.proposed`` per memory, as a producer would send it."""
    rng = random.Random(seed)
    factory = EventFactory(id_prefix="bench", clock=datetime.now(UTC) - timedelta(days=30))
    for index in range(count):
        kind = KINDS[index % len(KINDS)]
        text = " ".join(rng.sample(WORDS, 6))
        event = factory.proposed(
            TENANT,
            f"mem_{index:06d}",
            ("user", f"user_{index % subjects:05d}"),
            {"text": f"{kind}: {text}"},
            scope=SCOPES[index % len(SCOPES)],
            kind=kind,
            source=("message", f"conv_{index // 10}/msg_{index % 10}"),
        )
        yield to_message(event)


def load(settings: Settings, embedder: Embedder, count: int, subjects: int) -> dict[str, float]:
    """The memories into the projection and the vector store; seconds each part took."""
    schemas = default_schemas()
    codec = EventCodec(schemas, frozenset(t for t in schemas.event_types() if "memory." in t))
    vectors = open_vector_store(settings)
    spent: dict[str, float] = dict.fromkeys(
        ("decode_and_reduce", "postgres", "embed", "vector_store"), 0.0
    )
    messages = list(memory_events(count, subjects, seed=18))
    for start in range(0, len(messages), CHUNK):
        began = time.perf_counter()
        events = [codec.decode(key, value) for key, value in messages[start : start + CHUNK]]
        result = reduce_batch(events, {}, {})  # type: ignore[arg-type]
        spent["decode_and_reduce"] += time.perf_counter() - began

        async def save(batch: Any = result) -> None:
            conninfo = settings.postgres_conninfo
            async with await psycopg.AsyncConnection.connect(conninfo) as conn, conn.transaction():
                await store.save_batch(conn, batch)

        began = time.perf_counter()
        asyncio.run(save())
        spent["postgres"] += time.perf_counter() - began
        began = time.perf_counter()
        records = result.records
        held = Authoritative(
            {key: (r.version, r.status) for key, r in records.items()}, frozenset(), NO_ERASURES
        )
        updates = [MemoryUpdate(t, m, record) for (t, m), record in records.items()]
        plan = plan_index(updates, held, embedder)
        spent["embed"] += time.perf_counter() - began
        began = time.perf_counter()
        vectors.upsert(list(plan.upserts.values()))
        spent["vector_store"] += time.perf_counter() - began
        print(f"  loaded {start + len(events)} memories", file=sys.stderr)
    return {name: round(seconds, 1) for name, seconds in spent.items()}


def drop_scalar_indexes(settings: Settings) -> None:
    """An experiment: the vector table without the scalar indexes the store keeps on the
    columns search prefilters by (``lance_maintenance.INDEXED_COLUMNS``), to measure what they
    are worth."""
    import lancedb

    from projections.embeddings.lance_maintenance import INDEXED_COLUMNS

    table = lancedb.connect(settings.vector_store_path).open_table("embeddings")
    for column in INDEXED_COLUMNS:
        table.drop_index(f"{column}_idx")


def create_key(settings: Settings) -> str:
    async def run() -> str:
        async with await psycopg.AsyncConnection.connect(settings.postgres_conninfo) as conn:
            now = datetime.now(UTC)
            async with conn.transaction():
                await purposes.set_policy(conn, TENANT, PURPOSE, ["*"], ["*"], True, now)
                created = await keys.create_key(conn, TENANT, "service:bench", [PURPOSE], now)
            return created.token

    return asyncio.run(run())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    @classmethod
    def start(cls, settings: Settings, log: Path, seconds: float = 120) -> Server:
        port = free_port()
        environment = {
            **os.environ,
            **settings.as_environment(),
            "MEMPROJ_API_PORT": str(port),
            "MEMPROJ_API_RATE_LIMIT": "1000000/minute",
            "MEMPROJ_LOG_LEVEL": "warning",
        }
        process = subprocess.Popen(
            [sys.executable, "-m", "streams", "serve"],
            env=environment,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        server = cls(process, f"http://127.0.0.1:{port}", log)
        deadline = time.monotonic() + seconds
        while not server.ready():
            if process.poll() is not None or time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"memproj serve did not start: see {log}")
            time.sleep(0.2)
        return server

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@dataclass
class Phase:
    name: str
    paths: list[tuple[str, dict[str, Any]]]  # one request each: path and query
    rate: float  # requests/s


@dataclass
class Outcome:
    latencies_ms: list[float]
    statuses: Counter[int]
    results: int  # memories returned, all requests together
    late_ms: float  # the most a request left after its scheduled time (the client's own lag)
    seconds: float = 0.0  # from the first scheduled request to the last answer


async def paced(
    client: httpx.AsyncClient, requests: Sequence[tuple[str, dict[str, Any]]], rate: float
) -> Outcome:
    """Each request at its scheduled time (open loop), its latency from that time."""
    loop = asyncio.get_running_loop()
    outcome = Outcome([], Counter(), 0, 0.0)

    async def one(path: str, params: dict[str, Any], due: float) -> None:
        outcome.late_ms = max(outcome.late_ms, (loop.time() - due) * 1000)
        try:
            answer = await client.get(path, params=params)
        except httpx.HTTPError:
            outcome.statuses[0] += 1
            return
        outcome.latencies_ms.append((loop.time() - due) * 1000)
        outcome.statuses[answer.status_code] += 1
        if answer.status_code == 200:
            outcome.results += len(answer.json()["memories"])

    began = loop.time()
    tasks = []
    for index, (path, params) in enumerate(requests):
        due = began + index / rate
        await asyncio.sleep(max(0.0, due - loop.time()))
        tasks.append(asyncio.create_task(one(path, params, due)))
    await asyncio.gather(*tasks)
    outcome.seconds = loop.time() - began
    return outcome


def phases(
    subjects: int, recall_rate: float, search_rate: float, seconds: float, seed: int
) -> list[Phase]:
    """Each phase's requests about subjects in one shuffled order: as many different ones as
    there are subjects."""
    rng = random.Random(seed)

    def order(count: int) -> list[str]:
        names = [f"user_{index % subjects:05d}" for index in range(count)]
        rng.shuffle(names)
        return names

    recalled = order(int(recall_rate * seconds))
    recall = [(f"/v1/subjects/user/{s}/memories", {"purpose": PURPOSE}) for s in recalled]
    search = [
        (
            f"/v1/subjects/user/{s}/search",
            {"purpose": PURPOSE, "text": " ".join(rng.sample(WORDS, 3))},
        )
        for s in order(int(search_rate * seconds))
    ]
    return [
        Phase("recall", recall, recall_rate),
        Phase("recall_cached", recall, recall_rate),
        Phase("search", search, search_rate),
    ]


def measure(server: Server, token: str, stack: StackProcesses, plan: list[Phase]) -> dict[str, Any]:
    results: dict[str, Any] = {}

    async def run(phase: Phase) -> Outcome:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(
            base_url=server.url, headers=headers, timeout=60, limits=limits
        ) as client:
            # Unmeasured: the client's first connection, and the server's first use of the
            # vector store (lancedb's import and the table's opening take a second or more).
            path, params = phase.paths[0]
            await client.get(path.replace("/user/user_", "/user/warmup_"), params=params)
            return await paced(client, phase.paths, phase.rate)

    for phase in plan:
        meter = CpuMeter({"API server": [server.process.pid]}, stack)
        meter.start()
        outcome = asyncio.run(run(phase))
        meter.stop()
        count = len(phase.paths)
        cpu = meter.per_event(count)
        results[phase.name] = {
            "requests": count,
            "rate_offered": phase.rate,
            "rate_answered": round(len(outcome.latencies_ms) / outcome.seconds, 1),
            "statuses": dict(outcome.statuses),
            "p50_ms": rounded_ms(percentile(outcome.latencies_ms, 0.50)),
            "p99_ms": rounded_ms(percentile(outcome.latencies_ms, 0.99)),
            "max_ms": rounded_ms(max(outcome.latencies_ms, default=float("nan"))),
            "client_late_max_ms": round(outcome.late_ms, 1),
            "memories_per_answer": round(outcome.results / max(1, count), 1),
            "cpu_us_per_request": {
                "API server": cpu.get("API server", 0.0),
                "PostgreSQL backends": cpu.get("PostgreSQL backends", 0.0),
                "client (this process)": cpu.get("this process", 0.0),
            },
        }
        print(f"  {phase.name}: {json.dumps(results[phase.name])}", file=sys.stderr)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=100_000)
    parser.add_argument("--subjects", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=20.0, help="recall requests/s")
    parser.add_argument(
        "--search-rate",
        type=float,
        default=5.0,
        help="search requests/s (a search costs the server about ten recalls)",
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument(
        "--no-scalar-index",
        action="store_true",
        help="an experiment: drop the vector table's scalar indexes on tenant_id and subject_id "
        "(which the store keeps) before the server starts",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--keep", action="store_true", help="keep the schema and vector store")
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    base = Settings()
    if args.no_scalar_index and base.vector_store != "lancedb":
        parser.error("--no-scalar-index is an experiment on the LanceDB vector store")
    run = uuid.uuid4().hex[:8]
    environment = isolated(base, run, "api")
    # A cache of its own: another run's cached recalls (same tenant and subjects) would be
    # served to this one (and dropped by the hydration guard, not measured as misses).
    environment.settings = environment.settings.model_copy(
        update={"cache_namespace": f"memproj-bench-{run}"}
    )
    prepare(base, environment, specs=())
    settings = environment.settings
    server: Server | None = None
    try:
        embedder = build_embedder(settings)
        print(f"loading {args.memories} memories ({type(embedder).__name__})", file=sys.stderr)
        loaded = load(settings, embedder, args.memories, args.subjects)
        if args.no_scalar_index:
            drop_scalar_indexes(settings)
        token = create_key(settings)
        server = Server.start(settings, environment.data_dir / "serve.log")
        stack = StackProcesses(
            settings.postgres_conninfo, settings.kafka_bootstrap, application_prefix(run)
        )
        plan = phases(args.subjects, args.rate, args.search_rate, args.seconds, seed=18)
        report = {
            "memories": args.memories,
            "subjects": args.subjects,
            "embedder": type(embedder).__name__,
            "vector_store": settings.vector_store,
            "scalar_index": not args.no_scalar_index,
            "load_seconds": loaded,
            "stack_missing": stack.missing,
            "phases": measure(server, token, stack, plan),
            # The kernel's high-water mark over the whole run: what a replica's memory
            # request and limit are sized by (ops/k8s/api.yaml).
            "server_peak_rss_mb": round(peak_rss_mb(server.process.pid) or 0.0, 1),
        }
    finally:
        if server is not None:
            server.stop()
        if not args.keep:
            drop(base, [environment], [])
    print_and_save(report, args.json or RESULTS / f"api-{datetime.now(UTC):%Y%m%dT%H%M%S}.json")


if __name__ == "__main__":
    main()
