"""The workers under the benchmark: ``memproj worker KIND`` processes of one benchmark
environment, and the live pipeline: ``memory`` workers, which validate, seal and project the
raw topic in one stage (ops/decisions/one-hop.md), timed while the stream is
produced or from a backlog. The shared base of ops/bench/projection.py and its parts."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import ConsumerGroupState, Producer
from confluent_kafka.admin import AdminClient
from cpu_time import CpuMeter, StackProcesses  # ops/bench/cpu_time.py, beside this script
from rss import PeakRss  # ops/bench/rss.py

from streams.kafka import admin_config, producer_config
from streams.progress import wait_pipeline
from streams.settings import Settings
from streams.worker import consumers_per_worker
from topics.registry import MEMORY_EVENTS, TopicSpec

REPO = Path(__file__).resolve().parents[2]
NO_CONSUMER_GROUP = frozenset({"monitor"})  # it reads lag and audits; it consumes nothing


def produce(
    settings: Settings,
    messages: list[tuple[bytes | None, bytes | None]],
    raw: TopicSpec = MEMORY_EVENTS,
) -> float:
    """``messages`` onto ``raw`` (the memory stream's topic unless said), as fast as the
    producer takes them: seconds until every one is acknowledged."""
    producer = Producer(producer_config(settings.kafka_bootstrap, **{"linger.ms": 20}))
    topic = settings.topics.name(raw)
    started = time.perf_counter()
    for key, value in messages:
        while True:
            try:
                producer.produce(topic, value, key)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)
    return time.perf_counter() - started


def worker_name(kind: str) -> str:
    """What ``Workers.pids`` (and so the CPU meter) names the workers of ``kind``."""
    return f"{kind} worker(s)"


MEMORY_WORKERS = worker_name("memory")


def pipeline_kinds(memory_workers: int) -> list[str]:
    """The live memory pipeline: ``memory_workers`` memory workers, each sealing and
    projecting its share of the raw topic (the sealed log is one of their outputs)."""
    return ["memory"] * memory_workers


class Workers:
    """``memproj worker KIND`` processes for one benchmark environment, stopped (SIGTERM)
    when the block ends. More can join (``start``) and leave (``stop``) on the way."""

    def __init__(
        self,
        settings: Settings,
        log_path: Path,
        kinds: list[str],
        peak_rss: PeakRss | None = None,
    ) -> None:
        self.settings = settings
        self.log_path = log_path
        self.peak_rss = peak_rss
        self.environment = {**os.environ, **settings.as_environment()}
        self.kinds: list[str] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        self.stopped: set[int] = set()  # indexes of the workers that left on purpose
        for kind in kinds:
            self.start(kind)

    def start(self, kind: str) -> int:
        """Start one more worker of ``kind``; its index in ``processes``."""
        number = len(self.processes)
        with self.log_path.with_suffix(f".{kind}.{number}.log").open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "streams", "worker", kind],
                env=self.environment,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        self.kinds.append(kind)
        self.processes.append(process)
        if self.peak_rss is not None:
            self.peak_rss.watch(process.pid, kind)
        return number

    def stop(self, number: int) -> None:
        """One worker leaves gracefully (SIGTERM: it commits and leaves its group)."""
        process = self.processes[number]
        self.stopped.add(number)
        if self.peak_rss is not None:
            self.peak_rss.sample([process.pid])
        process.terminate()
        process.wait(60)

    def running(self, kind: str) -> list[int]:
        return [
            number
            for number, (named, process) in enumerate(zip(self.kinds, self.processes, strict=True))
            if named == kind and number not in self.stopped and process.poll() is None
        ]

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *_: object) -> None:
        if self.peak_rss is not None:
            self.peak_rss.sample([process.pid for process in self.processes])
        for process in self.processes:
            process.send_signal(signal.SIGCONT)
            process.terminate()
        for process in self.processes:
            process.wait(60)

    def pids(self) -> dict[str, list[int]]:
        pids: dict[str, list[int]] = {}
        for kind, process in zip(self.kinds, self.processes, strict=True):
            pids.setdefault(worker_name(kind), []).append(process.pid)
        return pids

    def signal_memory_workers(self, number: signal.Signals) -> None:
        for kind, process in zip(self.kinds, self.processes, strict=True):
            if kind == "memory":
                process.send_signal(number)

    def wait(self) -> None:
        """Until the memory workers have applied everything produced so far (and published
        what it produced, the sealed log among it)."""
        settings = self.settings

        async def caught_up() -> None:
            bootstrap = settings.kafka_bootstrap
            async with await psycopg.AsyncConnection.connect(settings.postgres_conninfo) as conn:
                await wait_pipeline(
                    conn, bootstrap, settings.topics, MEMORY_EVENTS, "memory", 900, 0.05
                )

        async def unless_a_worker_exits() -> None:
            waiting = asyncio.ensure_future(caught_up())
            while not waiting.done():
                await asyncio.wait((waiting,), timeout=0.5)
                for number, (kind, process) in enumerate(
                    zip(self.kinds, self.processes, strict=True)
                ):
                    if number in self.stopped:
                        continue
                    if process.poll() is not None and not waiting.done():
                        waiting.cancel()
                        raise RuntimeError(f"the {kind} worker exited: see {self.log_path}.*")
            waiting.result()

        asyncio.run(unless_a_worker_exits())

    def warm_up(self, messages: list[Any]) -> None:
        """Every worker has joined its group and applied a batch before any clock starts."""
        produce(self.settings, messages[:1])
        self.wait()
        for kind in set(self.kinds) - NO_CONSUMER_GROUP:
            self.wait_until_stable(kind, len(self.running(kind)) * consumers_per_worker(kind))

    def wait_until_stable(self, kind: str, members: int, deadline_seconds: float = 120) -> None:
        """Until ``kind``'s group is stable with ``members`` members, each one assigned
        partitions. The first worker to join can apply the warm-up batch while a second is
        still joining: a rebalance left pending would otherwise happen inside a timed stage
        (or, for paused workers, right after they resume)."""
        admin = AdminClient(admin_config(self.settings.kafka_bootstrap))
        group = self.settings.group_id(kind)
        deadline = time.monotonic() + deadline_seconds
        while True:
            description = admin.describe_consumer_groups([group], request_timeout=10)[
                group
            ].result()
            if (
                description.state == ConsumerGroupState.STABLE
                and len(description.members) == members
                and all(m.assignment.topic_partitions for m in description.members)
            ):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"group {group} did not settle with {members} members")
            time.sleep(0.1)


def timed(
    workers: Workers, stack: StackProcesses | None, run: Callable[[], None]
) -> tuple[float, CpuMeter]:
    meter = CpuMeter(workers.pids(), stack)
    meter.start()
    started = time.perf_counter()
    run()
    elapsed = time.perf_counter() - started
    meter.stop()
    return elapsed, meter


def projection_apply(
    settings: Settings,
    messages: list[Any],
    log_path: Path,
    memory_workers: int,
    stack: StackProcesses | None = None,
    peak_rss: PeakRss | None = None,
) -> tuple[float, CpuMeter]:
    """The live pipeline: from the first produced event to the last committed row."""
    with Workers(settings, log_path, pipeline_kinds(memory_workers), peak_rss) as workers:
        workers.warm_up(messages)

        def produce_and_apply() -> None:
            produce(settings, messages[1:])
            workers.wait()

        return timed(workers, stack, produce_and_apply)


def from_backlog(
    settings: Settings,
    messages: list[Any],
    log_path: Path,
    memory_workers: int,
    stack: StackProcesses | None = None,
    peak_rss: PeakRss | None = None,
) -> tuple[float, CpuMeter]:
    """The one stage alone, from a backlog: the stream is produced while the memory workers
    are paused (SIGSTOP), then timed from their resumption to the last committed row (the
    stage's own rate from its input topic, without the producer beside it)."""
    with Workers(settings, log_path, pipeline_kinds(memory_workers), peak_rss) as workers:
        workers.warm_up(messages)
        workers.signal_memory_workers(signal.SIGSTOP)
        produce(settings, messages[1:])
        workers.signal_memory_workers(signal.SIGCONT)
        return timed(workers, stack, workers.wait)
