"""What starting a worker costs the test suite: a worker run as ``python -m streams worker
KIND`` (a fresh interpreter that imports memproj) against one forked from the integration
tests' fork server (tests/support/worker_processes.py), in alternating rounds of one run.

    eval "$(ops/stack env)"
    .venv/bin/python ops/bench/worker_start.py [--kinds memory,deletion] [--rounds 5]
        [--seconds 8] [--json PATH]

Per start: the worker's CPU until its /readyz answers 200 (its start-up: imports, clients,
consumer group join) and in its first ``--seconds`` (start-up plus idle polling), and the wall
time until it is ready. The first forked start, which also starts the fork server (one import
of memproj per test process), is reported apart. Each worker has an environment of its own in
the stack (``environment.isolated``: topics, schema, consumer groups, data directory).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cpu_time import REPO, cpu_seconds  # ops/bench/cpu_time.py, beside this script
from environment import drop, isolated, prepare, print_and_save, stack_settings

sys.path.insert(0, str(REPO / "tests"))
from support.ports import free_port  # the tests' support, on the path above
from support.worker_processes import ForkedProcess

Started = Any  # subprocess.Popen or ForkedProcess: pid, terminate, wait


def subprocess_worker(arguments: list[str], environment: dict[str, str], log: Path) -> Started:
    with log.open("ab") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "streams", *arguments],
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )


def forked_worker(arguments: list[str], environment: dict[str, str], log: Path) -> Started:
    return ForkedProcess(arguments, environment, log, REPO)


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def one_start(
    how: Callable[[list[str], dict[str, str], Path], Started], kind: str, seconds: float, tmp: Path
) -> dict[str, float]:
    base = stack_settings()
    name = uuid.uuid4().hex[:8]
    port = free_port()
    environment = isolated(base, "start", name)
    prepare(base, environment)
    variables = dict(os.environ) | environment.settings.as_environment()
    variables["MEMPROJ_METRICS_PORT"] = str(port)
    began = time.monotonic()
    worker = how(["worker", kind], variables, tmp / f"{name}.log")
    try:
        while not ready(port):
            if time.monotonic() - began > 120:
                raise SystemExit(f"{kind} worker not ready in 120 s: {tmp / f'{name}.log'}")
            time.sleep(0.05)
        ready_after = time.monotonic() - began
        cpu_ready = cpu_seconds(worker.pid)
        time.sleep(max(0.0, seconds - (time.monotonic() - began)))
        cpu_window = cpu_seconds(worker.pid)
    finally:
        worker.terminate()
        worker.wait(30)
        drop(base, [environment], [])
    return {"ready_s": ready_after, "cpu_until_ready_s": cpu_ready, "cpu_window_s": cpu_window}


def summary(samples: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(statistics.median(s[key] for s in samples), 3) for key in samples[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default="memory,deletion")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="memproj-worker-start-"))

    # The first forked start starts the fork server (its import of memproj) as well.
    first = one_start(forked_worker, "memory", 0.0, tmp)

    ways = {"subprocess": subprocess_worker, "forked": forked_worker}
    samples: dict[str, dict[str, list[dict[str, float]]]] = {}
    for _ in range(options.rounds):
        for kind in options.kinds.split(","):
            for way, how in ways.items():
                sample = one_start(how, kind, options.seconds, tmp)
                samples.setdefault(kind, {}).setdefault(way, []).append(sample)
    report: dict[str, Any] = {
        "rounds": options.rounds,
        "window_s": options.seconds,
        "first_forked_ready_s": round(first["ready_s"], 2),
        "kinds": {},
    }
    for kind, per_way in samples.items():
        medians = {way: summary(values) for way, values in per_way.items()}
        report["kinds"][kind] = {
            **medians,
            "forked/subprocess": {
                key: round(medians["forked"][key] / medians["subprocess"][key], 2)
                for key in medians["forked"]
            },
        }
    target = options.json or REPO / "ops" / "bench" / "results" / (
        f"worker-start-{time.strftime('%Y%m%dT%H%M')}.json"
    )
    print_and_save(report, target)


if __name__ == "__main__":
    main()
