"""Memory projection apply rate, beside its baselines, measured in one run.

    .venv/bin/python ops/bench/projection.py [--memories 40000] [--workers 1]

For the same sample stream in the same Kafka and PostgreSQL it measures:

- raw consume: a confluent-kafka consumer reading the topic (no parsing): the broker's ceiling;
- bare upsert: the projection's resulting rows (current record upsert + history insert)
  written with psycopg ``executemany`` in pipeline mode, 1000 rows per transaction, rows built
  before the clock starts: PostgreSQL's ceiling for this work, with no Kafka, faust, decoding
  or reducing. It runs first and again last, each time into an empty schema, and the ratios
  use the mean of the two: on a shared machine the load drifts over a run;
- faust no-op agent: the same faust app and ``noack_take`` loop, acknowledging only: the
  ceiling faust's own per-event machinery puts on any agent;
- rebuild from earliest: ``memproj replay memory`` of the same sealed log into a shadow schema
  (the same runner, reducer and guard, read with a plain confluent-kafka consumer);
- projection apply: ``memproj worker memory`` (batches from librdkafka, validation, sealing,
  reduce, one transaction per batch, outbox publish of the sealed log and memory.current,
  offsets acknowledged: one stage since issue 17), from the first produced event to the last
  committed row;
- the same stage from a backlog, in a second environment: the stream produced while the
  memory workers are paused, timed from their resumption (the stage's own rate from its
  input topic, without the producer beside it).

Rates are events/s of the same stream, so the ratios compare like with like. The machine is
shared and noisy: read the ratios, not the absolute numbers. Needs ``ops/stack up``.

Beside the rates it reports CPU time per event of each process involved (the workers, the
PostgreSQL server processes and the broker, from /proc, when the native stack runs them), for
the live apply and for the bare upsert: on a machine with few cores the ratio is set by how
much CPU each path spends per event, and this says where it goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import psycopg
from confluent_kafka import Consumer, TopicPartition
from cpu_time import CpuMeter  # ops/bench/cpu_time.py, beside this script
from pipeline import from_backlog, produce, projection_apply  # ops/bench/pipeline.py

from projections.memory.reducer import reduce_batch
from projections.migrate import migrate
from streams.kafka import consumer_config, create_topics, delete_topics
from streams.progress import end_offsets
from streams.replay import replay_projection
from streams.runtime import tune_garbage_collection
from streams.sample import sample_memory_stream
from streams.settings import Settings
from streams.worker import memory_projection
from topics.codec import EventCodec, InvalidMessage
from topics.registry import ALL_TOPICS, MEMORY_EVENTS
from topics.schemas import default_schemas

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "ops" / "bench" / "results"


def isolated(base: Settings, name: str) -> tuple[Settings, str]:
    schema = f"bench_{name}"
    sep = "&" if "?" in base.postgres_dsn else "?"
    dsn = f"{base.postgres_dsn}{sep}options=-csearch_path%3D{schema}"
    return (
        base.model_copy(
            update={
                "topic_prefix": f"bench{name}.",
                "group_prefix": f"bench-{name}",
                "postgres_dsn": dsn,
                "metrics_port": 0,
            }
        ),
        schema,
    )


def prepare_schema(base: Settings, settings: Settings, schema: str) -> None:
    with psycopg.connect(base.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")

    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(settings.postgres_dsn) as conn:
            await migrate(conn)

    asyncio.run(run())


def raw_consume(settings: Settings, messages: list[tuple[bytes | None, bytes | None]]) -> float:
    """Reads the stream from a topic of its own: the live pipeline's raw input is deleted
    once sealed (issue 15), so it cannot be read again."""
    count = len(messages)
    produce(settings, messages)
    topic = settings.topics.name(MEMORY_EVENTS)
    ends = end_offsets(settings.kafka_bootstrap, topic)
    consumer = Consumer(
        consumer_config(
            settings.kafka_bootstrap,
            **{"group.id": f"bench-raw-{uuid.uuid4().hex}", "enable.auto.commit": False},
        )
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    seen = 0
    started = time.perf_counter()
    while seen < count:
        seen += len(consumer.consume(min(2000, count - seen), timeout=5))
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed


UPSERT = (
    "INSERT INTO memories (tenant_id, memory_id, subject_type, subject_id, scope, kind, value,"
    " source_type, source_ref, status, version, observed_at, expires_at, verification,"
    " evidence_event_ids, created_at, updated_at, last_event_id, revoked_reason)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
    " ON CONFLICT (tenant_id, memory_id) DO UPDATE SET value = EXCLUDED.value,"
    " source_type = EXCLUDED.source_type, source_ref = EXCLUDED.source_ref,"
    " status = EXCLUDED.status, version = EXCLUDED.version, observed_at = EXCLUDED.observed_at,"
    " expires_at = EXCLUDED.expires_at, verification = EXCLUDED.verification,"
    " updated_at = EXCLUDED.updated_at, last_event_id = EXCLUDED.last_event_id,"
    " revoked_reason = EXCLUDED.revoked_reason"
)
HISTORY = (
    "INSERT INTO memory_versions (tenant_id, memory_id, version, subject_type, subject_id, scope,"
    " kind, value, source_type, source_ref, status, observed_at, expires_at, verification,"
    " evidence_event_ids, revoked_reason, event_id, event_type, occurred_at, actor_type,"
    " actor_id) VALUES (%s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s, %s, %s,"
    " %s, %s, %s, %s, %s)"
)


def baseline_rows(messages: list[tuple[bytes | None, bytes | None]]) -> list[tuple[Any, Any]]:
    """The rows the projection ends up writing for this stream, computed offline."""
    schemas = default_schemas()
    codec = EventCodec(schemas, frozenset(t for t in schemas.event_types() if "memory." in t))
    events = []
    for key, value in messages:
        try:
            events.append(codec.decode(key, value))
        except InvalidMessage:
            continue
    result = reduce_batch(events, {}, {})  # type: ignore[arg-type]
    rows = []
    for version in result.versions:
        r = version.record
        value_json = orjson.dumps(r.value).decode()
        current = (
            r.tenant_id, r.memory_id, r.subject.type, r.subject.id, r.scope, r.kind, value_json,
            r.source.type, r.source.ref, r.status, r.version, r.observed_at, r.expires_at,
            r.verification, list(r.evidence_event_ids), r.created_at, r.updated_at,
            r.last_event_id, r.revoked_reason,
        )  # fmt: skip
        history = (
            r.tenant_id, r.memory_id, r.version, r.subject.type, r.subject.id, r.scope, r.kind,
            value_json, r.source.type, r.source.ref, r.status, r.observed_at, r.expires_at,
            r.verification, list(r.evidence_event_ids), r.revoked_reason, version.event_id,
            version.event_type, r.updated_at, version.actor_type, version.actor_id,
        )  # fmt: skip
        rows.append((current, history))
    return rows


def bare_upsert(dsn: str, rows: list[tuple[Any, Any]], meter: CpuMeter, chunk: int = 1000) -> float:
    with psycopg.connect(dsn) as conn:
        meter.start()
        started = time.perf_counter()
        for start in range(0, len(rows), chunk):
            part = rows[start : start + chunk]
            with conn.transaction(), conn.cursor() as cursor:
                cursor.executemany(UPSERT, [current for current, _ in part])
                cursor.executemany(HISTORY, [history for _, history in part])
        elapsed = time.perf_counter() - started
        meter.stop()
        return elapsed


def faust_noop(settings: Settings, count: int) -> tuple[float, float]:
    """events/s of a faust agent that only acknowledges (the per-event ceiling of faust), and
    the CPU µs it spent per event."""
    output = subprocess.run(
        [
            sys.executable,
            str(REPO / "ops" / "bench" / "faust_noop.py"),
            settings.topics.name(MEMORY_EVENTS),
            str(count),
        ],
        env={**os.environ, "MEMPROJ_METRICS_PORT": "0"},
        capture_output=True,
        timeout=600,
        cwd=REPO,
        check=True,
    )
    rate, cpu = output.stdout.decode().strip().splitlines()[-1].split()
    return float(rate), float(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=40_000)
    parser.add_argument("--workers", type=int, default=1, help="memory worker processes")
    args = parser.parse_args()

    base = Settings()
    name = uuid.uuid4().hex[:8]
    settings, schema = isolated(base, name)
    stages_settings, stages_schema = isolated(base, name + "_stages")
    # The memory workers stay paused while the backlog is produced: no eviction from the group.
    stages_settings = stages_settings.model_copy(update={"kafka_session_timeout_seconds": 60.0})
    baselines = [isolated(base, f"{name}_base{n}") for n in (1, 2)]
    environments = (settings, stages_settings)
    for environment in environments:
        create_topics(environment.kafka_bootstrap, environment.topics, ALL_TOPICS)
    raw_settings = baselines[0][0]  # the raw consume's own topic
    create_topics(raw_settings.kafka_bootstrap, raw_settings.topics, [MEMORY_EVENTS])
    prepare_schema(base, settings, schema)
    prepare_schema(base, stages_settings, stages_schema)
    for baseline_settings, baseline_schema in baselines:
        prepare_schema(base, baseline_settings, baseline_schema)
    messages = [(m.key, m.value) for m in sample_memory_stream(args.memories, 8, seed=3)]
    count = len(messages)
    rows = baseline_rows(messages)
    upsert_cpu = (CpuMeter(), CpuMeter())
    upsert_seconds: list[float] = []
    RESULTS.mkdir(parents=True, exist_ok=True)
    rebuild = None
    try:
        upsert_seconds.append(bare_upsert(baselines[0][0].postgres_dsn, rows, upsert_cpu[0]))
        apply_seconds, apply_cpu = projection_apply(
            settings, messages, RESULTS / f"worker-{name}.log", args.workers
        )
        memory_seconds, memory_cpu = from_backlog(
            stages_settings, messages, RESULTS / f"stages-{name}.log", args.workers
        )
        tune_garbage_collection()  # as ``memproj replay`` does
        rebuild = asyncio.run(
            replay_projection(settings, memory_projection(settings), swap="never")
        )
        consume_seconds = raw_consume(raw_settings, messages)
        noop_rate, noop_cpu = faust_noop(raw_settings, count)
        upsert_seconds.append(bare_upsert(baselines[1][0].postgres_dsn, rows, upsert_cpu[1]))
    finally:
        with psycopg.connect(base.postgres_dsn, autocommit=True) as conn:
            for dropped in (schema, stages_schema, *(named for _, named in baselines)):
                conn.execute(f"DROP SCHEMA IF EXISTS {dropped} CASCADE")
            if rebuild is not None:
                conn.execute(f"DROP SCHEMA IF EXISTS {rebuild.shadow} CASCADE")
        delete_topics(
            base.kafka_bootstrap,
            [e.topics.name(spec) for e in environments for spec in ALL_TOPICS]
            + [raw_settings.topics.name(MEMORY_EVENTS)],
        )

    applied = count - 1  # the warm-up event is applied before any clock starts
    apply_rate = applied / apply_seconds
    memory_rate = applied / memory_seconds
    rebuild_rate = rebuild.rate
    upsert_rates = [count / seconds for seconds in upsert_seconds]
    upsert_rate = sum(upsert_rates) / len(upsert_rates)
    consume_rate = count / consume_seconds
    result = {
        "events": count,
        "rows_written": len(rows) * 2,
        "raw_consume_events_per_s": round(consume_rate),
        "bare_upsert_events_per_s": round(upsert_rate),
        "bare_upsert_first_and_last_events_per_s": [round(rate) for rate in upsert_rates],
        "faust_noop_agent_events_per_s": round(noop_rate),
        "projection_apply_events_per_s": round(apply_rate),
        "memory_projection_alone_events_per_s": round(memory_rate),
        "apply_vs_bare_upsert": round(apply_rate / upsert_rate, 2),
        "memory_projection_alone_vs_bare_upsert": round(memory_rate / upsert_rate, 2),
        "apply_vs_raw_consume": round(apply_rate / consume_rate, 3),
        "apply_vs_faust_noop": round(apply_rate / noop_rate, 2),
        "rebuild_from_earliest_events_per_s": round(rebuild_rate),
        "rebuild_vs_apply": round(rebuild_rate / apply_rate, 2),
        "workers": args.workers,
        "cpus": os.cpu_count(),
        "apply_cpu_us_per_event": apply_cpu.per_event(applied),
        "memory_projection_alone_cpu_us_per_event": memory_cpu.per_event(applied),
        "bare_upsert_cpu_us_per_event": _mean_per_event(upsert_cpu, count),
        "faust_noop_agent_cpu_us_per_event": round(noop_cpu, 1),
    }
    (RESULTS / f"projection-{time.strftime('%Y%m%dT%H%M%S')}.json").write_text(
        json.dumps(result, indent=2)
    )
    print(f"{count} events ({len(rows)} versions) of the sample stream, one run:")
    print(f"  raw confluent-kafka consume   {consume_rate:>10,.0f} events/s")
    print(f"  faust no-op agent             {noop_rate:>10,.0f} events/s")
    first, last = upsert_rates
    print(
        f"  bare pipelined upsert         {upsert_rate:>10,.0f} events/s"
        f" (mean of {first:,.0f} first and {last:,.0f} last)"
    )
    print(f"  projection apply (pipeline)   {apply_rate:>10,.0f} events/s")
    print(f"    from a backlog              {memory_rate:>10,.0f} events/s")
    print(f"  rebuild from earliest         {rebuild_rate:>10,.0f} events/s")
    print(f"  apply / bare upsert           {apply_rate / upsert_rate:>10.2f}")
    print(f"  backlog / bare upsert         {memory_rate / upsert_rate:>10.2f}")
    print(f"  rebuild / live apply          {rebuild_rate / apply_rate:>10.2f}")
    print(f"  apply / raw consume           {apply_rate / consume_rate:>10.3f}")
    print(f"  apply / faust no-op agent     {apply_rate / noop_rate:>10.2f}")
    print(f"  CPU µs per event, faust no-op agent: {noop_cpu:.0f}")
    for label, spent in (
        ("live apply", result["apply_cpu_us_per_event"]),
        ("from a backlog", result["memory_projection_alone_cpu_us_per_event"]),
        ("bare upsert", result["bare_upsert_cpu_us_per_event"]),
    ):
        parts = ", ".join(f"{who} {us:.0f}" for who, us in spent.items())
        print(f"  CPU µs per event, {label}: {parts}")


def _mean_per_event(meters: tuple[CpuMeter, ...], events: int) -> dict[str, float]:
    spent = [meter.per_event(events) for meter in meters]
    return {name: round(sum(s[name] for s in spent) / len(spent), 1) for name in spent[0]}


if __name__ == "__main__":
    main()
