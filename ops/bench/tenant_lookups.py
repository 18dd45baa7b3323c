"""What per-tenant lookups cost: the memory stage's apply rate and CPU per event with
``MEMPROJ_LOOKUPS_PER_TENANT`` off (one statement per lookup for all a batch's tenants) and
on (one statement per tenant, pipelined: the Citus mode), side by side, for streams of 1, 10
and 100 tenants, in one run.

    .venv/bin/python ops/bench/tenant_lookups.py [--memories 3000] [--pairs 2] [--tenants 1,10,100]

The stream is the sample memory stream (streams/sample.py: proposals, verifications,
corrections, revocations, duplicates, conflicts), its memories dealt to the tenants in turn,
so that every batch holds events of min(tenants, events in the batch) tenants. Each round is
an environment of its own (environment.py: topics, schema, groups) and times ``memproj worker
memory`` from a backlog (pipeline.from_backlog: produced while the worker is paused, timed
from its resumption to the last committed row), so that its batches are full (up to
``MEMPROJ_BATCH_MAX_EVENTS``) whatever the producer's pace. For each tenant count the rounds
alternate, off then on, ``--pairs`` times: on a shared machine the load drifts over a run, and
alternating spreads the drift over both sides.

Reported per tenant count: events/s and CPU µs per event of the memory worker, this run's
PostgreSQL backends and all counted processes (cpu_time.py), the mean of each side's rounds,
the ratios on/off, and each round's checksum of the projection (``memories`` and
``memory_versions``): the two modes must make the same one. Needs ``ops/stack up`` and its
environment (``eval "$(ops/stack env)"``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

# ops/bench/*.py, beside this script
from cpu_time import POSTGRES_BACKENDS, StackProcesses
from environment import (
    Environment,
    counted_stack,
    prepare,
    stack_settings,
)
from phases import Phases
from pipeline import MEMORY_WORKERS, from_backlog
from sides import alternating_rounds, side_means, side_ratios

from streams.sample import sample_memory_stream
from streams.settings import Settings

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "ops" / "bench" / "results"
OFF = "off: one statement"
ON = "on: per tenant"
Message = tuple[bytes | None, bytes | None]


def checksum(settings: Settings) -> str:
    """The projection a round made, in one hash (the event ids are the stream's own)."""
    with psycopg.connect(settings.postgres_conninfo) as conn:
        row = conn.execute(
            "SELECT md5(coalesce(string_agg(r, ',' ORDER BY r), '')) FROM ("
            " SELECT concat_ws('|', tenant_id, memory_id, status, version, last_event_id) AS r"
            " FROM memories UNION ALL"
            " SELECT concat_ws('|', tenant_id, memory_id, version, status, event_id)"
            " FROM memory_versions) AS rows"
        ).fetchone()
    return str(row[0]) if row else ""


def measure_round(
    base: Settings,
    environment: Environment,
    side: str,
    log_path: Path,
    *,
    messages: list[Message],
    stack: StackProcesses,
) -> dict[str, Any]:
    prepare(base, environment)
    settings = environment.settings.model_copy(update={"lookups_per_tenant": side == ON})
    seconds, meter = from_backlog(settings, messages, log_path, 1, stack)
    applied = len(messages) - 1  # the warm-up event is applied untimed
    return {
        "side": side,
        "seconds": round(seconds, 3),
        "events_per_s": round(applied / seconds, 1),
        "cpu_us_per_event": meter.per_event(applied),
        "checksum": checksum(settings),
    }


def summary(rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each side's mean rate and CPU per event over its rounds, the ratios on/off, and
    whether every round made the same projection."""
    sides = {
        side: side_means(mine)
        for side in (OFF, ON)
        if (mine := [r for r in rounds if r["side"] == side])
    }
    result: dict[str, Any] = {
        "sides": sides,
        "same_projection": len({r["checksum"] for r in rounds}) == 1,
    }
    if OFF in sides and ON in sides:
        result["on_over_off"] = side_ratios(sides[OFF], sides[ON], MEMORY_WORKERS)
    return result


def table(by_tenants: Mapping[int, Mapping[str, Any]]) -> list[str]:
    """The run as a Markdown table: one row per tenant count."""

    def fmt(value: float | None, spec: str = ",.0f") -> str:
        return "—" if value is None else format(value, spec)

    header = [
        "tenants",
        "events/s off",
        "events/s on",
        "on/off",
        "worker µs/event off → on",
        "PostgreSQL backends µs/event off → on",
        "all µs/event off → on",
        "on/off (all)",
        "same projection",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for tenants, result in by_tenants.items():
        sides, ratios = result["sides"], result.get("on_over_off", {})
        if OFF not in sides or ON not in sides:
            continue
        off, on = sides[OFF], sides[ON]

        def cpu(name: str, off: Mapping[str, Any] = off, on: Mapping[str, Any] = on) -> str:
            before = off["cpu_us_per_event"].get(name, 0.0)
            return f"{fmt(before)} → {fmt(on['cpu_us_per_event'].get(name, 0.0))}"

        lines.append(
            "| "
            + " | ".join(
                [
                    str(tenants),
                    f"{fmt(off['events_per_s'])} ({', '.join(map(fmt, off['events_per_s_each']))})",
                    f"{fmt(on['events_per_s'])} ({', '.join(map(fmt, on['events_per_s_each']))})",
                    fmt(ratios.get("events_per_s"), ".2f"),
                    cpu(MEMORY_WORKERS),
                    cpu(POSTGRES_BACKENDS),
                    f"{fmt(off['cpu_total_us_per_event'])} → {fmt(on['cpu_total_us_per_event'])}",
                    fmt(ratios.get("cpu_total"), ".2f"),
                    "yes" if result["same_projection"] else "NO",
                ]
            )
            + " |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=3000, help="memories per round")
    parser.add_argument("--pairs", type=int, default=2, help="rounds of each side, alternating")
    parser.add_argument("--tenants", default="1,10,100", help="tenant counts, comma-separated")
    args = parser.parse_args()
    base = stack_settings()
    run = uuid.uuid4().hex[:8]
    stack = counted_stack(base, run)
    RESULTS.mkdir(parents=True, exist_ok=True)
    phases = Phases()
    by_tenants: dict[int, dict[str, Any]] = {}
    for tenants in (int(count) for count in args.tenants.split(",")):
        stream = sample_memory_stream(args.memories, tenants, seed=5)
        messages: list[Message] = [(m.key, m.value) for m in stream]
        measure = partial(measure_round, base, messages=messages, stack=stack)
        rounds = alternating_rounds(
            base, run, phases, (OFF, ON), args.pairs, RESULTS, measure, f"t{tenants}"
        )
        by_tenants[tenants] = {"events": len(messages), "rounds": rounds, **summary(rounds)}
    result = {
        "memories_per_round": args.memories,
        "cpus": os.cpu_count(),
        "by_tenants": by_tenants,
        "failed_rounds": dict(phases.failed),
    }
    path = RESULTS / f"tenant-lookups-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    print("\n".join(table(by_tenants)))
    for name, error in phases.failed.items():
        print(f"failed: {name}: {error}")
    print(f"saved {path.relative_to(REPO)}")
    if phases.failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
