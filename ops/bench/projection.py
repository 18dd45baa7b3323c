"""Memory projection apply rate, beside its baselines, and every target of the hot path, in one run.

    .venv/bin/python ops/bench/projection.py [--memories 40000] [--workers 1]
        [--no-backlog] [--no-rebuild] [--no-freshness] [--no-every-worker] [--no-erasure]
        [--no-scale-out] [--load-seconds 20] [--load-rate EVENTS_PER_S]

For the same sample stream in the same Kafka and PostgreSQL it measures:

- raw consume: a confluent-kafka consumer reading the topic (no parsing): the broker's ceiling;
- bare upsert: the projection's resulting rows (current record upsert + history insert)
  written with psycopg ``executemany`` in pipeline mode, 1000 rows per transaction, rows built
  before the clock starts: PostgreSQL's ceiling for this work, with no Kafka, workers,
  decoding or reducing. It runs first and again last, each time into an empty schema, and the
  ratios use the mean of the two: on a shared machine the load drifts over a run;
- faust no-op agent: memproj's faust app and a ``noack_take`` loop, acknowledging only: what
  faust's per-event machinery costs the agents that still run on it;
- projection apply: ``memproj worker memory`` (batches from librdkafka, validation, sealing,
  reduce, one transaction per batch, outbox publish of the sealed log and memory.current,
  offsets committed: one stage, ops/decisions/one-hop.md), from the first
  produced event to the last committed row;
- the same stage from a backlog, in an environment of its own: the stream produced while the
  memory workers are paused, timed from their resumption (the stage's own rate from its
  input topic, without the producer beside it);
- rebuild from earliest: ``memproj replay memory --readers <workers>`` of the live apply's
  sealed log into a shadow schema (the same codec, reducer and erasure guard, in large chunks
  held in memory, one reader process per live worker process: ops/decisions/rebuild.md);
- freshness (freshness.py) with the pipeline alone, then freshness and erasure under load
  (erasure_load.py) in an environment running the pipeline, the deletion worker, the four
  store workers and the monitor, each at half the live apply rate (or ``--load-rate``: on a
  shared machine the apply rate, and so the load, moves from run to run);
- scale-out (scale_out.py): memory workers join and leave during an apply of the same stream;
  its checksum against the live apply's, and the rebalance pauses;
- every worker's peak RSS through all of it (rss.py).

Rates are events/s of the same stream, so the ratios compare like with like. The machine is
shared and noisy: read the ratios, not the absolute numbers. Needs ``ops/stack up`` and its
environment (``eval "$(ops/stack env)"``: the workers accept the development master key only
with ``MEMPROJ_ENVIRONMENT=local``).

Each part is a phase (``phases.py``): one that fails is reported as failed, with its error,
and every other phase's figures are still printed and saved (the run then exits 1).

Beside the rates it reports CPU time per event of each process involved (cpu_time.py: the
workers, this run's PostgreSQL backends and the server's shared processes, the broker), for
the live apply and for the bare upsert, and the ratio of their totals: on a machine with few
cores the rate is set by how much CPU each path spends per event.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import psycopg
from confluent_kafka import Consumer, TopicPartition

# ops/bench/*.py, beside this script
from cpu_time import CpuMeter, StackProcesses, total
from environment import counted_stack, drop, isolated, prepare, stack_settings
from erasure_load import STORE_WORKERS, measure_erasure_under_load
from erasure_load import TARGET_P99_MS as ERASURE_TARGET_MS
from freshness import TARGET_P99_MS as FRESHNESS_TARGET_MS
from freshness import Freshness, measure_freshness, versions_made
from phases import Phases
from pipeline import Workers, from_backlog, pipeline_kinds, produce, projection_apply
from rss import LIMIT_MB as RSS_LIMIT_MB
from rss import PeakRss
from scale_out import measure_scale_out

from projections.memory.reducer import reduce_batch
from projections.memory.store import checksums
from streams.kafka import consumer_config
from streams.progress import end_offsets
from streams.replay import ReplayReport, replay_projection
from streams.runtime import tune_garbage_collection
from streams.sample import SampleMessage, sample_memory_stream
from streams.settings import Settings
from streams.worker import memory_projection
from topics.codec import EventCodec, InvalidMessage
from topics.registry import MEMORY_EVENTS
from topics.schemas import default_schemas

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "ops" / "bench" / "results"


def raw_consume(settings: Settings, messages: list[tuple[bytes | None, bytes | None]]) -> float:
    """Reads the stream from a topic of its own: the live pipeline's raw input is deleted
    once sealed, so it cannot be read again."""
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


def bare_upsert(
    settings: Settings,
    rows: list[tuple[Any, Any]],
    events: int,
    stack: StackProcesses,
    chunk: int = 1000,
) -> dict[str, Any]:
    """The stream's rows written by one client in pipeline mode: seconds, and CPU µs per
    event of the stream (``events``)."""
    meter = CpuMeter(stack=stack)
    with psycopg.connect(settings.postgres_conninfo) as conn:
        meter.start()
        started = time.perf_counter()
        for start in range(0, len(rows), chunk):
            part = rows[start : start + chunk]
            with conn.transaction(), conn.cursor() as cursor:
                cursor.executemany(UPSERT, [current for current, _ in part])
                cursor.executemany(HISTORY, [history for _, history in part])
        elapsed = time.perf_counter() - started
        meter.stop()
    return {"seconds": elapsed, "cpu_us_per_event": meter.per_event(events)}


def faust_noop(settings: Settings, count: int) -> dict[str, float]:
    """events/s of a faust agent that only acknowledges (the per-event ceiling of faust), and
    the CPU µs it spent per event."""
    output = subprocess.run(
        [
            sys.executable,
            str(REPO / "ops" / "bench" / "faust_noop.py"),
            settings.topics.name(MEMORY_EVENTS),
            str(count),
        ],
        env={**os.environ, **settings.as_environment(), "MEMPROJ_METRICS_PORT": "0"},
        capture_output=True,
        timeout=600,
        cwd=REPO,
    )
    if output.returncode != 0:
        last = output.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"faust_noop.py exited {output.returncode}: {last[0]}")
    # faust_noop.RESULT (not imported from there: that module imports faust)
    found = re.search(r"^faust-noop (\S+) (\S+)$", output.stdout.decode(errors="replace"), re.M)
    if found is None:
        raise RuntimeError(f"faust_noop.py printed no result: {output.stdout[-200:]!r}")
    return {"events_per_s": float(found[1]), "cpu_us_per_event": float(found[2])}


# The phases, by name (their figures in ``summary``; a phase that fails is reported so).
BARE_UPSERT_FIRST = "bare upsert (first)"
LIVE_APPLY = "projection apply"
BACKLOG = "from a backlog"
REBUILD = "rebuild from earliest"
FRESHNESS = "freshness"
UNDER_LOAD = "freshness and erasure under load"
SCALE_OUT = "scale-out"
RAW_CONSUME = "raw consume"
FAUST_NOOP = "faust no-op agent"
BARE_UPSERT_LAST = "bare upsert (last)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=40_000)
    parser.add_argument("--workers", type=int, default=1, help="memory worker processes")
    parser.add_argument(
        "--no-backlog", "--no-stages", action="store_true", help="skip the run from a backlog"
    )
    parser.add_argument("--no-rebuild", action="store_true", help="skip the rebuild")
    parser.add_argument("--no-freshness", action="store_true", help="skip freshness")
    parser.add_argument(
        "--no-every-worker",
        action="store_true",
        help="skip the freshness with every worker running (freshness with the pipeline alone"
        " stays)",
    )
    parser.add_argument("--no-erasure", action="store_true", help="skip erasure under load")
    parser.add_argument("--no-scale-out", action="store_true", help="skip the scale-out")
    parser.add_argument("--load-seconds", type=float, default=20.0, help="freshness, erasure")
    parser.add_argument(
        "--load-rate",
        type=float,
        help="events/s of freshness and erasure under load (default: half the live apply"
        " rate); fixed, two runs on a shared machine load their workers alike",
    )
    parser.add_argument("--erasures", type=int, default=20, help="erasures under load (≤ 25)")
    args = parser.parse_args()

    base = stack_settings()
    run = uuid.uuid4().hex[:8]
    live = isolated(base, run, "")
    stages = isolated(base, run, "stages")
    # The memory workers stay paused while the backlog is produced: no eviction from the group.
    stages.settings = stages.settings.model_copy(update={"kafka_session_timeout_seconds": 60.0})
    baselines = [isolated(base, run, f"base{n}") for n in (1, 2)]
    fresh = isolated(base, run, "fresh")
    load = isolated(base, run, "load")
    scale = isolated(base, run, "scale")
    environments = [live, stages, *baselines, fresh, load, scale]
    stack = counted_stack(base, run)
    messages = [(m.key, m.value) for m in sample_memory_stream(args.memories, 8, seed=3)]
    count = len(messages)
    rows = baseline_rows(messages)
    RESULTS.mkdir(parents=True, exist_ok=True)
    peak_rss = PeakRss()
    phases = Phases()
    figures: dict[str, Any] = {}
    rebuild: ReplayReport | None = None
    live_checksum: dict[str, Any] = {}

    def phase(name: str, measure: Callable[[], Any], needs: Sequence[str] = ()) -> Any:
        found = phases.run(name, measure, needs)
        if found is not None:
            figures[name] = found
        return found

    def apply_rate() -> float:
        return float((count - 1) / figures[LIVE_APPLY]["seconds"])

    def load_rate() -> float:
        return float(args.load_rate or apply_rate() / 2)

    # Without --load-rate, the load phases are paced at half the live apply's rate.
    paced_by_apply = () if args.load_rate else (LIVE_APPLY,)
    try:
        for environment in (live, stages, fresh, load, scale):
            prepare(base, environment)
        prepare(base, baselines[0], [MEMORY_EVENTS])  # the raw consume's own topic
        prepare(base, baselines[1], [])
        phase(BARE_UPSERT_FIRST, lambda: bare_upsert(baselines[0].settings, rows, count, stack))

        def live_apply() -> dict[str, Any]:
            seconds, cpu = projection_apply(
                live.settings, messages, RESULTS / f"worker-{run}-apply", args.workers, stack,
                peak_rss,
            )  # fmt: skip
            live_checksum.update(projection_checksum(live.settings))
            return {"seconds": seconds, "cpu_us_per_event": cpu.per_event(count - 1)}

        phase(LIVE_APPLY, live_apply)
        if not args.no_backlog:

            def backlog() -> dict[str, Any]:
                seconds, cpu = from_backlog(
                    stages.settings, messages, RESULTS / f"worker-{run}-stages", args.workers,
                    stack,
                )  # fmt: skip
                return {"seconds": seconds, "cpu_us_per_event": cpu.per_event(count - 1)}

            phase(BACKLOG, backlog)
        if not args.no_rebuild:

            def rebuilt() -> dict[str, Any]:
                nonlocal rebuild
                tune_garbage_collection()  # as ``memproj replay`` does
                # One rebuild reader per live worker process: both sides use as many processes.
                rebuild = asyncio.run(
                    replay_projection(
                        live.settings,
                        memory_projection(live.settings),
                        swap="never",
                        readers=args.workers,
                    )
                )
                return {"events_per_s": rebuild.rate}

            phase(REBUILD, rebuilt, needs=[LIVE_APPLY])  # it replays the live apply's log
        if not args.no_freshness:
            phase(
                FRESHNESS,
                lambda: freshness_alone(
                    fresh.settings, RESULTS / f"worker-{run}-fresh", args, load_rate(), peak_rss
                ).as_json(),
                needs=paced_by_apply,
            )
        if not ((args.no_freshness or args.no_every_worker) and args.no_erasure):
            phase(
                UNDER_LOAD,
                lambda: {
                    name: measured.as_json()
                    for name, measured in under_load(
                        load.settings, RESULTS / f"worker-{run}-load", args, load_rate(), peak_rss
                    ).items()
                },
                needs=paced_by_apply,
            )
        if not args.no_scale_out:
            phase(
                SCALE_OUT,
                lambda: measure_scale_out(
                    scale.settings,
                    messages,
                    RESULTS / f"worker-{run}-scale",
                    args.workers,
                    # slow enough that the joins and the leave happen well inside the apply
                    min(apply_rate() / 2, count / 30),
                    live_checksum,
                    projection_checksum,
                    peak_rss,
                ).as_json(),
                needs=[LIVE_APPLY],  # its pace and the checksum it must reach
            )
        raw_settings = baselines[0].settings  # the raw consume's own topic
        phase(RAW_CONSUME, lambda: {"seconds": raw_consume(raw_settings, messages)})
        phase(FAUST_NOOP, lambda: faust_noop(raw_settings, count), needs=[RAW_CONSUME])
        phase(BARE_UPSERT_LAST, lambda: bare_upsert(baselines[1].settings, rows, count, stack))
    finally:
        peak_rss.close()
        drop(base, environments, [rebuild.shadow] if rebuild is not None else [])

    result = summary(
        figures, phases.failed, count, len(rows), args.workers, peak_rss.by_kind(), stack.missing
    )
    saved = save(result, RESULTS)
    report(result, len(rows))
    print(f"  saved: {saved}")
    if phases.failed:
        sys.exit(1)


def summary(
    figures: dict[str, Any],
    failed: dict[str, str],
    count: int,
    versions: int,
    workers: int,
    peak_rss_mb: dict[str, float],
    cpu_not_counted: Sequence[str],
) -> dict[str, Any]:
    """The run's result from the figures of the phases that ran; a ratio only where both of
    its sides were measured; ``failed_phases`` names the others, with their errors."""
    applied = count - 1  # the warm-up event is applied untimed
    result: dict[str, Any] = {
        "events": count,
        "rows_written": versions * 2,
        "workers": workers,
        "cpus": os.cpu_count(),
        "failed_phases": dict(failed),
    }
    upserts = [figures[name] for name in (BARE_UPSERT_FIRST, BARE_UPSERT_LAST) if name in figures]
    upsert_rate = apply_rate = consume_rate = noop_rate = None
    if RAW_CONSUME in figures:
        consume_rate = count / figures[RAW_CONSUME]["seconds"]
        result["raw_consume_events_per_s"] = round(consume_rate)
    if upserts:
        # The mean of the first and the last: on a shared machine the load drifts over a run.
        rates = [count / upsert["seconds"] for upsert in upserts]
        upsert_rate = sum(rates) / len(rates)
        result["bare_upsert_events_per_s"] = round(upsert_rate)
        result["bare_upsert_first_and_last_events_per_s"] = [round(rate) for rate in rates]
    if FAUST_NOOP in figures:
        noop_rate = figures[FAUST_NOOP]["events_per_s"]
        result["faust_noop_agent_events_per_s"] = round(noop_rate)
        result["faust_noop_agent_cpu_us_per_event"] = round(
            figures[FAUST_NOOP]["cpu_us_per_event"], 1
        )
    if LIVE_APPLY in figures:
        apply_rate = applied / figures[LIVE_APPLY]["seconds"]
        result["projection_apply_events_per_s"] = round(apply_rate)
        result["apply_cpu_us_per_event"] = figures[LIVE_APPLY]["cpu_us_per_event"]
        result["apply_cpu_total_us_per_event"] = total(result["apply_cpu_us_per_event"])
    if upserts:
        spent = [upsert["cpu_us_per_event"] for upsert in upserts]
        mean = {name: round(sum(s[name] for s in spent) / len(spent), 1) for name in spent[0]}
        result["bare_upsert_cpu_us_per_event"] = mean
        result["bare_upsert_cpu_total_us_per_event"] = total(mean)
    if apply_rate is not None and upsert_rate is not None:
        result["apply_vs_bare_upsert"] = round(apply_rate / upsert_rate, 2)
        result["apply_vs_bare_upsert_cpu_per_event"] = round(
            result["apply_cpu_total_us_per_event"] / result["bare_upsert_cpu_total_us_per_event"],
            2,
        )
    if apply_rate is not None and consume_rate is not None:
        result["apply_vs_raw_consume"] = round(apply_rate / consume_rate, 3)
    if apply_rate is not None and noop_rate is not None:
        result["apply_vs_faust_noop"] = round(apply_rate / noop_rate, 2)
    result["cpu_not_counted"] = list(cpu_not_counted)
    result["peak_rss_mb"] = peak_rss_mb
    result["peak_rss_limit_mb"] = RSS_LIMIT_MB
    if BACKLOG in figures:  # the one stage from a backlog (the name is the results' own)
        seconds = figures[BACKLOG]["seconds"]
        result["memory_projection_alone_events_per_s"] = round(applied / seconds)
        if upsert_rate is not None:
            result["memory_projection_alone_vs_bare_upsert"] = round(
                applied / seconds / upsert_rate, 2
            )
        result["memory_projection_alone_cpu_us_per_event"] = figures[BACKLOG]["cpu_us_per_event"]
    if REBUILD in figures:
        result["rebuild_from_earliest_events_per_s"] = round(figures[REBUILD]["events_per_s"])
        if apply_rate is not None:
            result["rebuild_vs_apply"] = round(figures[REBUILD]["events_per_s"] / apply_rate, 2)
    if FRESHNESS in figures:
        result["freshness"] = figures[FRESHNESS]
    result.update(figures.get(UNDER_LOAD, {}))
    if SCALE_OUT in figures:
        result["scale_out"] = figures[SCALE_OUT]
    result["targets"] = targets(result)
    return result


def save(result: dict[str, Any], directory: Path) -> Path:
    path = directory / f"projection-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    return path


def load_stream(rate: float, seconds: float, phases: int) -> list[SampleMessage]:
    """A sample stream of its own (the run's stream's memory ids are taken), long enough for
    ``phases`` paced phases of ``seconds`` at ``rate``: about 1.8 events per memory."""
    needed = int(rate * seconds * phases * 1.2) + 1000
    return list(sample_memory_stream(needed * 10 // 16, 8, seed=5))


def freshness_alone(
    settings: Settings, log_path: Path, args: argparse.Namespace, rate: float, peak_rss: PeakRss
) -> Freshness:
    """Freshness with only the pipeline running: the condition its maximum rate was measured
    in."""
    stream = load_stream(rate, args.load_seconds, 1)
    messages = [(m.key, m.value) for m in stream]
    with Workers(settings, log_path, pipeline_kinds(args.workers), peak_rss) as workers:
        workers.warm_up(messages)
        made = versions_made(stream[1:])
        return measure_freshness(settings, messages[1:], made, rate, args.load_seconds)[0]


def under_load(
    settings: Settings,
    log_path: Path,
    args: argparse.Namespace,
    rate: float,
    peak_rss: PeakRss,
) -> dict[str, Any]:
    """Freshness, then erasure under load, in one environment running every worker a memory
    erasure needs (and the monitor), each at ``rate`` for ``args.load_seconds``."""
    measured: dict[str, Any] = {}
    stream = load_stream(rate, args.load_seconds, 2)
    messages = [(m.key, m.value) for m in stream]
    kinds = pipeline_kinds(args.workers) + list(STORE_WORKERS) + ["monitor"]
    with Workers(settings, log_path, kinds, peak_rss) as workers:
        workers.warm_up(messages)
        produced = 1
        if not (args.no_freshness or args.no_every_worker):
            freshness, produced_now = measure_freshness(
                settings, messages[1:], versions_made(stream[1:]), rate, args.load_seconds
            )
            measured["freshness_every_worker"] = freshness
            produced += produced_now
        if not args.no_erasure:
            subjects = [(f"tenant_{n % 8}", f"user_{n}") for n in range(min(args.erasures, 25))]
            measured["erasure_under_load"] = measure_erasure_under_load(
                settings, messages[produced:], subjects, rate, args.load_seconds
            )
    return measured


def projection_checksum(settings: Settings) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        async with await psycopg.AsyncConnection.connect(settings.postgres_conninfo) as conn:
            return dict(await checksums(conn))

    return asyncio.run(run())


def targets(result: dict[str, Any]) -> dict[str, bool | None]:
    """The hot path's targets, met or not (None: not measured in this run)."""
    freshness = result.get("freshness")
    freshness_loaded = result.get("freshness_every_worker")
    erasure = result.get("erasure_under_load")
    scale = result.get("scale_out")
    rebuild = result.get("rebuild_vs_apply")
    apply_ratio = result.get("apply_vs_bare_upsert")
    cpu_ratio = result.get("apply_vs_bare_upsert_cpu_per_event")
    return {
        "live apply >= 0.5x bare upsert": None if apply_ratio is None else apply_ratio >= 0.5,
        "CPU per event <= 2x bare upsert": None if cpu_ratio is None else cpu_ratio <= 2.0,
        "freshness p99 <= 300 ms": None
        if freshness is None or freshness["p99_ms"] is None
        else freshness["p99_ms"] <= FRESHNESS_TARGET_MS,
        "freshness p99 <= 300 ms, every worker": None
        if freshness_loaded is None or freshness_loaded["p99_ms"] is None
        else freshness_loaded["p99_ms"] <= FRESHNESS_TARGET_MS,
        "erasure under load p99 <= 2 s": None
        if erasure is None
        else erasure["completed"] == erasure["requested"]
        and erasure["completed_p99_ms"] is not None
        and erasure["completed_p99_ms"] <= ERASURE_TARGET_MS,
        "rebuild >= 2x live apply": None if rebuild is None else rebuild >= 2.0,
        "every worker's RSS <= 300 MB": all(
            peak <= RSS_LIMIT_MB for peak in result["peak_rss_mb"].values()
        ),
        "scale-out: same checksum": None
        if scale is None
        else bool(scale["same_checksum_as_live_apply"]),
    }


def report(result: dict[str, Any], versions: int) -> None:
    """The run as a table, in the order of the hot path's targets: what was measured, and which
    phases failed, with their errors."""
    count = result["events"]
    print(f"{count} events ({versions} versions) of the sample stream, one run:")
    lines: list[tuple[str, str]] = []

    def rate(label: str, key: str, extra: str = "") -> None:
        if key in result:
            lines.append((label, f"{result[key]:>10,} events/s{extra}"))

    def ratio(label: str, key: str, extra: str = "", digits: int = 2) -> None:
        if key in result:
            lines.append((label, f"{result[key]:>10.{digits}f}{extra}"))

    rate("raw confluent-kafka consume", "raw_consume_events_per_s")
    rate("faust no-op agent", "faust_noop_agent_events_per_s")
    if "bare_upsert_first_and_last_events_per_s" in result:
        runs = " and ".join(f"{r:,}" for r in result["bare_upsert_first_and_last_events_per_s"])
        rate("bare pipelined upsert", "bare_upsert_events_per_s", f" (mean of {runs})")
    rate("projection apply (pipeline)", "projection_apply_events_per_s")
    rate("  from a backlog", "memory_projection_alone_events_per_s")
    rate("rebuild from earliest", "rebuild_from_earliest_events_per_s")
    ratio("apply / bare upsert", "apply_vs_bare_upsert", "   (target >= 0.5)")
    if "apply_vs_bare_upsert_cpu_per_event" in result:
        ratio(
            "CPU per event, apply / bare upsert",
            "apply_vs_bare_upsert_cpu_per_event",
            f"   (target <= 2; {result['apply_cpu_total_us_per_event']:.0f} against"
            f" {result['bare_upsert_cpu_total_us_per_event']:.0f} µs)",
        )
    ratio("backlog / bare upsert", "memory_projection_alone_vs_bare_upsert")
    ratio("rebuild / live apply", "rebuild_vs_apply", "   (target >= 2)")
    ratio("apply / raw consume", "apply_vs_raw_consume", digits=3)
    ratio("apply / faust no-op agent", "apply_vs_faust_noop")
    for key, label in (
        ("freshness", "freshness, produced -> recall"),
        ("freshness_every_worker", "  the same, every worker running"),
    ):
        if key in result:
            f = result[key]
            lines.append(
                (
                    label,
                    f"p50 {_ms(f['p50_ms'])}, p99 {_ms(f['p99_ms'])} (target p99 <= 300) at"
                    f" {f['rate_events_per_s']:,} events/s, {f['visible']} of {f['sampled']}"
                    " samples",
                )
            )
    if "erasure_under_load" in result:
        e = result["erasure_under_load"]
        lines.append(
            (
                "erasure under load, -> every store",
                f"p50 {_ms(e['completed_p50_ms'])}, p99 {_ms(e['completed_p99_ms'])}"
                f" (target p99 <= 2000) at {e['ingest_rate_events_per_s']:,} events/s,"
                f" {e['completed']} of {e['requested']} completed (waiting up to"
                f" {e['waited_s']:.0f} s after the load)",
            )
        )
        for store, acknowledged in e["store_acknowledged"].items():
            lines.append(
                (
                    f"  {store} acknowledged",
                    f"p50 {_ms(e['store_acknowledged_p50_ms'][store])},"
                    f" p99 {_ms(e['store_acknowledged_p99_ms'][store])},"
                    f" {acknowledged} of {e['requested']}",
                )
            )
        for hop, (p50, p99) in e["hops_p50_p99_ms"].items():
            lines.append((f"  {hop}", f"p50 {_ms(p50)}, p99 {_ms(p99)}"))
    for label, text in lines:
        print(f"  {label:<36} {text}")
    if "faust_noop_agent_cpu_us_per_event" in result:
        print(
            "  CPU µs per event, faust no-op agent:"
            f" {result['faust_noop_agent_cpu_us_per_event']:.0f}"
        )
    for label, key in (
        ("live apply", "apply_cpu_us_per_event"),
        ("from a backlog", "memory_projection_alone_cpu_us_per_event"),
        ("bare upsert", "bare_upsert_cpu_us_per_event"),
    ):
        if key in result:
            spent = result[key]
            parts = ", ".join(f"{who} {us:.0f}" for who, us in spent.items())
            print(f"  CPU µs per event, {label}: {parts}; total {total(spent):.0f}")
    if result["cpu_not_counted"]:
        print(f"  (not counted: {', '.join(result['cpu_not_counted'])})")
    peaks = ", ".join(f"{kind} {mb:.0f}" for kind, mb in result["peak_rss_mb"].items())
    print(f"  peak RSS per worker kind, MB (limit {RSS_LIMIT_MB:.0f}): {peaks}")
    if "scale_out" in result:
        scale = result["scale_out"]
        same = "same" if scale["same_checksum_as_live_apply"] else "DIFFERENT"
        print(
            f"  scale-out at {scale['rate_events_per_s']:,} events/s: {same} checksum as the"
            " live apply; longest pause, all partitions / one partition:"
        )
        for pause in scale["pauses"]:
            settled = pause["until_group_stable_s"]
            stable = "" if settled is None else f", group stable after {settled:.1f} s"
            print(
                f"    {pause['what']:<26} {pause['longest_pause_all_partitions_ms']:>6} ms"
                f" / {pause['longest_pause_one_partition_ms']:>6} ms"
                f" over {pause['window_s']:.1f} s{stable}"
            )
    print("  targets:")
    for target, met in result["targets"].items():
        verdict = "not measured" if met is None else ("met" if met else "NOT met")
        print(f"    {target:<40} {verdict}")
    if result["failed_phases"]:
        print("  FAILED phases (their figures are missing above):")
        for name, error in result["failed_phases"].items():
            print(f"    {name:<36} {error}")


def _ms(value: float | None) -> str:
    return "none" if value is None else f"{value:,.0f} ms"


if __name__ == "__main__":
    main()
