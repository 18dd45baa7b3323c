"""The inputs of ops/CAPACITY.md: CPU per unit of work of each path, measured in one run.

    .venv/bin/python ops/bench/capacity_inputs.py [--memories 10000] [--conversations 1500]
        [--erasures 10] [--json PATH]

In one environment of its own (topics and schema), against the real Kafka and PostgreSQL:

1. memory apply: the sample memory stream is produced while no worker runs, then one
   ``memproj worker memory`` applies the backlog (validate, seal, reduce, write, publish);
2. conversation apply: likewise the sample conversation stream (messages, tool exchanges
   with large results, summaries) and one ``memproj worker conversation``;
3. embeddings: one ``memproj worker embeddings`` indexes what the two stages published
   (``memory.current`` and ``conversation.messages``) with the configured embedder into the
   configured vector store;
4. erasure: the deletion worker and the four store workers (embeddings, summaries, cache,
   context) running and caught up, ``--erasures`` subject erasures one after the other, each
   waited for until the ledger marks it completed. The same workers' CPU over an idle window
   as long as the erasures took is subtracted: what is left is what the erasures cost.

Each part's CPU is every process that does its work: its workers, this run's PostgreSQL
backends and the server's shared processes, and the broker (which serves the whole machine:
on a shared machine its figure is an upper bound). Search is measured by
ops/bench/http_api.py (server and PostgreSQL CPU per search). The machine is shared: CPU per
unit is what the capacity arithmetic uses, not the rates.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from cpu_time import CpuMeter, StackProcesses, total  # ops/bench/cpu_time.py, beside this script
from environment import Environment, application_prefix, drop, isolated, prepare, print_and_save
from erasure_load import STORE_WORKERS, subject_erasure, wait_completed
from pipeline import Workers, produce

from streams.kafka import producer_config
from streams.progress import committed_offsets, end_offsets, wait_pipeline
from streams.sample import sample_conversation_stream, sample_memory_stream
from streams.settings import Settings
from streams.worker import consumers_per_worker
from topics.registry import (
    CONVERSATION_EVENTS,
    CONVERSATION_MESSAGES,
    DELETION_REQUESTS,
    MEMORY_CURRENT,
    MEMORY_EVENTS,
    TopicSpec,
)

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "ops" / "bench" / "results"
TENANTS = 8
Message = tuple[bytes | None, bytes | None]


def caught_up(settings: Settings, raw: TopicSpec, kind: str) -> None:
    async def wait() -> None:
        async with await psycopg.AsyncConnection.connect(settings.postgres_conninfo) as conn:
            await wait_pipeline(conn, settings.kafka_bootstrap, settings.topics, raw, kind, 900)

    asyncio.run(wait())


def group_at_end(settings: Settings, group: str, topics: list[TopicSpec]) -> bool:
    """Whether ``group`` has committed the end of every one of ``topics`` (a transaction
    marker may sit at a partition's end: one short of it counts)."""
    for topic in topics:
        name = settings.topics.name(topic)
        ends = end_offsets(settings.kafka_bootstrap, name)
        committed = committed_offsets(settings.kafka_bootstrap, group, name)
        if any(committed.get(p, 0) < end - 1 for p, end in ends.items() if end > 0):
            return False
    return True


def wait_until(check: Callable[[], bool], what: str, seconds: float = 900) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def measured(meter: CpuMeter, units: int, seconds: float) -> dict[str, Any]:
    per_unit = meter.per_event(units)
    return {
        "units": units,
        "seconds": round(seconds, 2),
        "cpu_us_per_unit": per_unit,
        "cpu_us_per_unit_total": total(per_unit),
    }


def backlog_stage(
    environment: Environment,
    stack: StackProcesses,
    kind: str,
    raw: TopicSpec,
    messages: list[Message],
) -> dict[str, Any]:
    """One ``kind`` worker applies ``messages`` from a backlog produced before it started
    (its start-up and group join are outside the clock: it warms up on the first message)."""
    settings = environment.settings
    with Workers(settings, environment.data_dir / f"worker-{kind}", [kind]) as workers:
        produce(settings, messages[:1], raw)
        caught_up(settings, raw, kind)
        produce(settings, messages[1:], raw)
        meter = CpuMeter(workers.pids(), stack)
        meter.start()
        started = time.perf_counter()
        caught_up(settings, raw, kind)
        seconds = time.perf_counter() - started
        meter.stop()
    return measured(meter, len(messages) - 1, seconds)


def records_on(settings: Settings, topics: list[TopicSpec]) -> int:
    """Offsets on ``topics`` (records, and the transaction markers the stages' outboxes add:
    an upper bound of the records, so the CPU per record is a lower bound)."""
    count = 0
    for topic in topics:
        count += sum(end_offsets(settings.kafka_bootstrap, settings.topics.name(topic)).values())
    return count


def indexing(environment: Environment, stack: StackProcesses) -> dict[str, Any]:
    """One embeddings worker indexes both stages' outputs, from its start (the model's load
    included: a worker's start-up is seconds, the backlog longer) to its group's commit of
    their ends."""
    settings = environment.settings
    topics = [MEMORY_CURRENT, CONVERSATION_MESSAGES]
    records = records_on(settings, topics)
    group = settings.group_id("embeddings")
    with Workers(settings, environment.data_dir / "worker-index", ["embeddings"]) as workers:
        meter = CpuMeter(workers.pids(), stack)
        meter.start()
        started = time.perf_counter()
        wait_until(lambda: group_at_end(settings, group, topics), "the backlog to be indexed")
        seconds = time.perf_counter() - started
        meter.stop()
    return measured(meter, records, seconds)


def subject_items(settings: Settings, subjects: list[tuple[str, str]]) -> int:
    """Memories of the erased subjects (their messages are erased too; not counted here)."""
    with psycopg.connect(settings.postgres_conninfo) as conn:
        found = 0
        for tenant, subject_id in subjects:
            row = conn.execute(
                "SELECT count(*) FROM memories WHERE tenant_id = %s AND subject_type = 'user'"
                " AND subject_id = %s",
                (tenant, subject_id),
            ).fetchone()
            found += int(str(row[0])) if row else 0
    return found


def postgres_bytes(environment: Environment) -> dict[str, int]:
    """Each table's size with its indexes and TOAST, in the environment's schema."""
    with psycopg.connect(environment.settings.postgres_conninfo) as conn:
        rows = conn.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind = 'r' ORDER BY 2 DESC",
            (environment.schema,),
        ).fetchall()
    return {str(name): int(str(size)) for name, size in rows if int(str(size)) > 16384}


def table_rows(environment: Environment, tables: list[str]) -> dict[str, int]:
    with psycopg.connect(environment.settings.postgres_conninfo) as conn:
        return {
            table: int(str(row[0]))
            for table in tables
            if (row := conn.execute(f"SELECT count(*) FROM {table}").fetchone()) is not None
        }


def kafka_bytes(environment: Environment) -> dict[str, int]:
    """Bytes of each of the environment's topics in the broker's log segments (one replica;
    the index files are preallocated and not counted). Empty when the broker's data directory
    is not this stack's (``MEMPROJ_STACK_DIR``)."""
    stack = os.environ.get("MEMPROJ_STACK_DIR")
    data = Path(stack) / "kafka" / "data" if stack else None
    if data is None or not data.is_dir():
        return {}
    prefix = environment.settings.topic_prefix
    sizes: dict[str, int] = {}
    for partition in data.glob(f"{prefix}*-*"):
        topic = partition.name.rsplit("-", 1)[0].removeprefix(prefix)
        sizes[topic] = sizes.get(topic, 0) + sum(f.stat().st_size for f in partition.glob("*.log"))
    return {topic: size for topic, size in sorted(sizes.items()) if size}


def beyond_idle(busy: dict[str, float], idle: dict[str, float]) -> dict[str, float]:
    """CPU seconds per process spent over what it spends idle in a window as long (polling,
    heartbeats, the other sessions' share of the broker); never below zero."""
    return {name: max(0.0, spent - idle.get(name, 0.0)) for name, spent in busy.items()}


def erasures(environment: Environment, stack: StackProcesses, count: int) -> dict[str, Any]:
    """``count`` subject erasures, one at a time, with the deletion and store workers
    running; their idle CPU over as long a window subtracted."""
    from confluent_kafka import Producer

    settings = environment.settings
    subjects = [(f"tenant_{n % TENANTS}", f"user_{n}") for n in range(count)]
    memories = subject_items(settings, subjects)
    kinds = list(STORE_WORKERS)
    with Workers(settings, environment.data_dir / "worker-erase", kinds) as workers:
        # caught up with what the stages published (the embeddings store's index among it)
        for kind in kinds:
            if consumers_per_worker(kind):
                workers.wait_until_stable(kind, consumers_per_worker(kind))
        wait_until(
            lambda: group_at_end(
                settings, settings.group_id("embeddings"), [MEMORY_CURRENT, CONVERSATION_MESSAGES]
            ),
            "the store workers to catch up",
        )
        requests = Producer(producer_config(settings.kafka_bootstrap))
        topic = settings.topics.name(DELETION_REQUESTS)
        meter = CpuMeter(workers.pids(), stack)
        meter.start()
        started = time.perf_counter()
        for tenant, subject_id in subjects:
            deletion_id, (key, value) = subject_erasure(tenant, subject_id)
            requests.produce(topic, value, key)
            requests.flush(30)
            ledger = wait_completed(settings, [deletion_id], 120)
            if ledger.get(deletion_id) is None or ledger[deletion_id].completed is None:
                raise RuntimeError(f"erasure {deletion_id} did not complete in 120 s")
        seconds = time.perf_counter() - started
        meter.stop()
        idle = CpuMeter(workers.pids(), stack)
        idle.start()
        time.sleep(seconds)
        idle.stop()
    meter.spent = beyond_idle(meter.spent, idle.spent)
    result = measured(meter, count, seconds)
    result["memories_erased"] = memories
    result["idle_cpu_s"] = {name: round(spent, 3) for name, spent in idle.spent.items()}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--conversations", type=int, default=1_500)
    parser.add_argument("--erasures", type=int, default=10, help="subject erasures (≤ 25)")
    parser.add_argument("--json", type=Path, help="where to save the results")
    args = parser.parse_args()
    base = Settings()
    run = uuid.uuid4().hex[:8]
    environment = isolated(base, run, "capacity")
    stack = StackProcesses(base.postgres_conninfo, base.kafka_bootstrap, application_prefix(run))
    memory_messages = [
        (m.key, m.value) for m in sample_memory_stream(args.memories, TENANTS, seed=3)
    ]
    conversation_messages = [
        (m.key, m.value) for m in sample_conversation_stream(args.conversations, TENANTS, seed=5)
    ]
    result: dict[str, Any] = {
        "memories": args.memories,
        "conversations": args.conversations,
        "vector_store": base.vector_store,
        "embedder": base.embedder,
        "missing": stack.missing,
    }
    prepare(base, environment)
    try:
        result["memory_apply"] = backlog_stage(
            environment, stack, "memory", MEMORY_EVENTS, memory_messages
        )
        result["conversation_apply"] = backlog_stage(
            environment, stack, "conversation", CONVERSATION_EVENTS, conversation_messages
        )
        result["embeddings"] = indexing(environment, stack)
        result["postgres_bytes"] = postgres_bytes(environment)
        result["postgres_rows"] = table_rows(
            environment, ["memories", "memory_versions", "vector_entries"]
        )
        result["kafka_bytes"] = kafka_bytes(environment)
        result["events"] = {
            "memory": len(memory_messages),
            "conversation": len(conversation_messages),
            "memory_bytes": sum(len(v or b"") for _, v in memory_messages),
            "conversation_bytes": sum(len(v or b"") for _, v in conversation_messages),
        }
        result["erasure"] = erasures(environment, stack, min(args.erasures, 25))
    finally:
        drop(base, [environment], [])
    saved = args.json or RESULTS / f"capacity-inputs-{time.strftime('%Y%m%dT%H%M%S')}.json"
    print_and_save(result, saved)
    print(f"saved: {saved}")


if __name__ == "__main__":
    main()
