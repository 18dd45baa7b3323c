"""One benchmark environment: its own topics, PostgreSQL schema, consumer groups and worker
data directory, so that the parts of one run never read each other's data. The shared base
of ops/bench/projection.py and its parts, with the paced producer and the percentiles they
report."""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from confluent_kafka import Producer
from cpu_time import StackProcesses  # ops/bench/cpu_time.py, beside this script

from projections.migrate import migrate
from streams.kafka import create_topics, delete_topics, producer_config
from streams.settings import DevelopmentKeyRefused, Settings
from topics.registry import ALL_TOPICS, MEMORY_EVENTS, TopicSpec

Message = tuple[bytes | None, bytes | None]


def application_prefix(run: str) -> str:
    """What every PostgreSQL connection of one benchmark run is named after
    (``application_name``): how the CPU meter tells this run's backends from others'."""
    return f"memproj-bench-{run}"


def stack_settings() -> Settings:
    """The local stack's settings, or the run stopped with how to load them: every phase's
    workers would refuse the development master key outside its environment (said once,
    before anything runs)."""
    base = Settings()
    try:
        base.worker_master_keys()
    except DevelopmentKeyRefused as refused:
        sys.exit(f'{refused}; the local stack\'s environment: eval "$(ops/stack env)"')
    return base


def counted_stack(base: Settings, run: str) -> StackProcesses:
    """PostgreSQL's and the broker's processes for the CPU meter, said when one is not found."""
    stack = StackProcesses(base.postgres_conninfo, base.kafka_bootstrap, application_prefix(run))
    if stack.missing:
        print(f"warning: {' and '.join(stack.missing)} not found: their CPU is not counted")
    return stack


@dataclass
class Environment:
    settings: Settings
    schema: str
    data_dir: Path
    topics: list[str] = field(default_factory=list)


def isolated(base: Settings, run: str, part: str) -> Environment:
    """Settings of their own for one part of the run (nothing is created yet)."""
    name = f"{run}_{part}" if part else run
    schema = f"bench_{name}"
    sep = "&" if "?" in base.postgres_dsn else "?"
    dsn = (
        f"{base.postgres_dsn}{sep}options=-csearch_path%3D{schema}"
        f"&application_name={application_prefix(run)}-{part or 'main'}"
    )
    data_dir = Path(tempfile.mkdtemp(prefix=f"memproj-bench-{name}-"))
    settings = base.model_copy(
        update={
            "topic_prefix": f"bench{name}.",
            "group_prefix": f"bench-{name}",
            "postgres_dsn": dsn,
            "metrics_port": 0,
            "data_dir": data_dir,
        }
    )
    return Environment(settings, schema, data_dir)


def prepare(
    base: Settings, environment: Environment, specs: Sequence[TopicSpec] = ALL_TOPICS
) -> None:
    """Create the environment's topics (``specs``) and its migrated schema."""
    settings = environment.settings
    if specs:
        create_topics(settings.kafka_bootstrap, settings.topics, specs, settings.topic_replication)
    environment.topics = [settings.topics.name(spec) for spec in specs]
    with psycopg.connect(base.postgres_conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {environment.schema}")

    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(settings.postgres_conninfo) as conn:
            await migrate(conn)

    asyncio.run(run())


def drop(base: Settings, environments: Sequence[Environment], extra_schemas: Sequence[str]) -> None:
    with psycopg.connect(base.postgres_conninfo, autocommit=True) as conn:
        for schema in [*(e.schema for e in environments), *extra_schemas]:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    topics = [topic for environment in environments for topic in environment.topics]
    if topics:
        delete_topics(base.kafka_bootstrap, topics)
    for environment in environments:
        shutil.rmtree(environment.data_dir, ignore_errors=True)


def print_and_save(report: object, target: Path) -> None:
    """A run's figures on stdout, and as a JSON file at ``target``."""
    text = json.dumps(report, indent=2)
    print(text)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text + "\n")


def percentile(values: Sequence[float], share: float) -> float:
    """The nearest-rank percentile (``share`` 0.99 for p99); NaN without values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(share * len(ordered)))
    return ordered[rank - 1]


def rounded_ms(value: float) -> float | None:
    """A latency for the JSON result: None for none measured (JSON has no NaN)."""
    return None if math.isnan(value) else round(value, 1)


class PacedProducer:
    """Produces ``messages`` to the raw memory topic at ``rate`` events/s in a thread of its
    own, and records when each was handed to the client (``time.monotonic``): the start of
    an event's journey. Stops at the end of the messages or at ``stop``.

    The first ``WARM_UP`` messages are produced and delivered in ``start``, before the pace
    (and the callers' clocks) start: a new client spends its first few hundred milliseconds
    connecting, reading metadata and obtaining its idempotent producer id, and every message
    handed to it meanwhile waits. Measured, that put 1 to 4 % of a 20 s freshness run's
    samples 250 to 1,000 ms late: the p99 of the benchmark's own start, not of the pipeline
    (ops/decisions/freshness.md)."""

    WARM_UP = 1

    def __init__(self, settings: Settings, messages: Sequence[Message], rate: float) -> None:
        # A short linger: a paced event should not wait for a full batch of others.
        self._producer = Producer(producer_config(settings.kafka, **{"linger.ms": 5}))
        self._topic = settings.topics.name(MEMORY_EVENTS)
        self._messages = messages
        self._rate = rate
        self._stopping = threading.Event()
        self.produced_at: list[float] = []
        self._thread = threading.Thread(target=self._run, name="paced-producer", daemon=True)

    @property
    def sent(self) -> int:
        return len(self.produced_at)

    def start(self) -> PacedProducer:
        for key, value in self._messages[: self.WARM_UP]:
            self.produced_at.append(time.monotonic())
            self._producer.produce(self._topic, value, key)
        if self._producer.flush(60):
            raise RuntimeError("the paced producer's warm-up messages were not delivered")
        self._thread.start()
        return self

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stopping.is_set() and self.sent < len(self._messages):
            due = min(len(self._messages), int((time.monotonic() - started) * self._rate) + 1)
            while self.sent < due:
                key, value = self._messages[self.sent]
                moment = time.monotonic()
                try:
                    self._producer.produce(self._topic, value, key)
                except BufferError:
                    self._producer.poll(0.01)
                    continue
                self.produced_at.append(moment)
            self._producer.poll(0)
            time.sleep(0.002)
        self._producer.flush(60)

    def stop(self) -> None:
        """Stop producing, and return once everything produced is delivered."""
        self._stopping.set()
        self._thread.join()

    def join(self) -> None:
        """Until every message is produced and delivered."""
        self._thread.join()
