"""Two sides of a benchmark measured in alternating rounds (on a shared machine the load drifts
over a run, and alternating spreads the drift over both): each side's means over its rounds,
and the ratios of one side to the other. The shared base of governed_writes.py and
tenant_lookups.py."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

# ops/bench/*.py, beside this script
from cpu_time import POSTGRES_BACKENDS, total
from environment import Environment, drop, isolated
from phases import Phases

from streams.settings import Settings

# measure(environment, side, worker log path) -> the round's figures, "events_per_s" among them
Measure = Callable[[Environment, str, Path], dict[str, Any]]


def alternating_rounds(
    base: Settings,
    run: str,
    phases: Phases,
    sides: tuple[str, str],
    pairs: int,
    logs: Path,
    measure: Measure,
    title: str = "",
) -> list[dict[str, Any]]:
    """The figures of ``measure`` for side a then side b, ``pairs`` times: each round in an
    environment of its own (its part of the run named ``<title>a1``, ``<title>b2``, ...),
    dropped after it; a round that fails is recorded in ``phases`` and left out."""
    rounds = []
    for number, side in enumerate(sides * pairs, 1):
        part = f"{title}{'ab'[sides.index(side)]}{number}"
        environment = isolated(base, run, part)
        name = f"{title} round {number} ({side})".strip()
        try:
            log_path = logs / f"worker-{run}-{part}"
            found = phases.run(name, partial(measure, environment, side, log_path))
        finally:
            drop(base, [environment], [])
        if found is not None:
            rounds.append(found)
            print(f"{name}: {found['events_per_s']:,.0f} events/s", flush=True)
    return rounds


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def side_means(rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The mean rate and CPU per event of one side's rounds (each with ``events_per_s`` and
    ``cpu_us_per_event``), and each round's rate."""
    cpu = [r["cpu_us_per_event"] for r in rounds]
    names = sorted({name for spent in cpu for name in spent})
    mean_cpu = {n: round(_mean([spent.get(n, 0.0) for spent in cpu]), 1) for n in names}
    return {
        "rounds": len(rounds),
        "events_per_s": round(_mean([r["events_per_s"] for r in rounds]), 1),
        "events_per_s_each": [r["events_per_s"] for r in rounds],
        "cpu_us_per_event": mean_cpu,
        "cpu_total_us_per_event": total(mean_cpu),
    }


def _ratio(of: float, to: float) -> float | None:
    return round(of / to, 3) if to else None


def side_ratios(a: Mapping[str, Any], b: Mapping[str, Any], worker: str) -> dict[str, Any]:
    """Side ``b`` over side ``a`` (both ``side_means``): the rate, and the CPU per event of
    ``worker``, of this run's PostgreSQL backends and of all counted processes."""
    return {
        "events_per_s": _ratio(b["events_per_s"], a["events_per_s"]),
        "cpu_worker": _ratio(
            b["cpu_us_per_event"].get(worker, 0.0), a["cpu_us_per_event"].get(worker, 0.0)
        ),
        "cpu_postgres_backends": _ratio(
            b["cpu_us_per_event"].get(POSTGRES_BACKENDS, 0.0),
            a["cpu_us_per_event"].get(POSTGRES_BACKENDS, 0.0),
        ),
        "cpu_total": _ratio(b["cpu_total_us_per_event"], a["cpu_total_us_per_event"]),
    }
