"""The embeddings worker with each embedder, side by side in one run.

    .venv/bin/python ops/bench/embedder.py [--memories 4000] [--rounds 2]
        [--embedders hashing,wordllama]

Per round and embedder (alternated: A B A B, so that the machine's drift falls on both), in an
environment of its own: the sample memory stream is projected by ``memproj worker memory``
into ``memory.current``; then ``memproj worker embeddings`` starts with ``MEMPROJ_EMBEDDER``
set to the embedder and indexes that backlog. Reported for the embeddings worker:

- start-up: CPU seconds from its start until it has joined its consumer group (imports, the
  model's load, the group join), and its resident memory then;
- indexing: CPU seconds per ``memory.current`` record from then until its group has committed
  the end of the topic, the wall time of it, and the peak resident memory (``VmHWM``) at the
  end;
- the embedder alone, in this process: CPU microseconds per text of the stream's texts,
  embedded in batches of 100 (the model's own cost, without Kafka, PostgreSQL or LanceDB).

Read the ratios between embedders of the same run; the machine is shared. Needs ``ops/stack
up``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any, cast

import orjson
import psycopg
from confluent_kafka import Consumer, TopicPartition
from cpu_time import cpu_seconds  # ops/bench/cpu_time.py, beside this script
from environment import Environment, drop, isolated, prepare
from pipeline import Workers, produce
from rss import peak_rss_mb

from projections.embeddings.embedder import memory_text
from projections.embeddings.factory import EMBEDDER_KINDS, EmbedderKind, build_embedder
from streams.kafka import consumer_config
from streams.progress import committed_offsets, end_offsets, wait_pipeline
from streams.replay_embeddings import group_members
from streams.sample import sample_memory_stream
from streams.settings import Settings
from topics.registry import MEMORY_CURRENT, MEMORY_EVENTS


def resident_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def current_records(settings: Settings) -> tuple[int, list[str]]:
    """How many records ``memory.current`` holds (committed ones), and the texts the indexer
    embeds of them (kind, then value)."""
    topic = settings.topics.name(MEMORY_CURRENT)
    ends = end_offsets(settings.kafka, topic)
    consumer = Consumer(
        consumer_config(
            settings.kafka,
            **{
                "group.id": f"bench-count-{uuid.uuid4().hex[:6]}",
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
            },
        )
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in ends if ends[p] > 0])
    left = {p for p in ends if ends[p] > 0}
    count, texts = 0, []
    try:
        while left:
            message = consumer.poll(5)
            if message is None:
                continue
            if message.error():
                left.discard(message.partition())
                continue
            count += 1
            raw = message.value()
            if raw:
                record = orjson.loads(raw)
                value = record.get("value")
                if isinstance(value, dict):
                    texts.append(memory_text(value, str(record.get("kind", ""))))
    finally:
        consumer.close()
    return count, texts


def indexed_all(settings: Settings, group: str) -> bool:
    topic = settings.topics.name(MEMORY_CURRENT)
    ends = end_offsets(settings.kafka, topic)
    committed = committed_offsets(settings.kafka, group, topic)
    # Transaction markers sit at the end: a committed offset at or past the last record's
    # offset + 1 may still be one marker short of the end offset.
    return all(committed.get(p, 0) >= end - 1 for p, end in ends.items() if end > 0)


def wait(check: Any, what: str, seconds: float = 600) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.1)


def embed_alone(kind: EmbedderKind, texts: list[str]) -> float:
    embedder = build_embedder(kind, 256)
    embedder.embed(texts[:100])  # warm
    began = time.process_time()
    for start in range(0, len(texts), 100):
        embedder.embed(texts[start : start + 100])
    return (time.process_time() - began) / max(1, len(texts)) * 1e6


def one(base: Settings, run: str, part: str, kind: EmbedderKind, memories: int) -> dict[str, Any]:
    environment: Environment = isolated(base, run, part)
    settings = environment.settings.model_copy(update={"embedder": kind})
    environment.settings = settings
    prepare(base, environment)
    logs = environment.data_dir / "worker"
    try:
        produce(settings, [(m.key, m.value) for m in sample_memory_stream(memories, 4, 7)])
        with Workers(settings, logs, ["memory"]):

            async def projected() -> None:
                async with await psycopg.AsyncConnection.connect(settings.postgres_conninfo) as c:
                    await wait_pipeline(
                        c, settings.kafka, settings.topics, MEMORY_EVENTS, "memory", 600
                    )

            asyncio.run(projected())
        records, texts = current_records(settings)
        group = settings.group_id("embeddings")
        with Workers(settings, logs, ["embeddings"]) as workers:
            pid = workers.processes[0].pid
            began = time.monotonic()
            wait(lambda: bool(group_members(settings, group)), "the embeddings worker to join")
            startup_cpu, startup_rss = cpu_seconds(pid), resident_mb(pid)
            joined = time.monotonic()
            wait(lambda: indexed_all(settings, group), "the backlog to be indexed")
            done = time.monotonic()
            index_cpu = cpu_seconds(pid) - startup_cpu
            peak = peak_rss_mb(pid) or 0.0
        return {
            "embedder": kind,
            "memory_current_records": records,
            "startup_cpu_s": round(startup_cpu, 2),
            "startup_wall_s": round(joined - began, 2),
            "startup_rss_mb": round(startup_rss, 1),
            "index_cpu_ms_per_record": round(index_cpu / max(1, records) * 1e3, 3),
            "index_wall_s": round(done - joined, 2),
            "peak_rss_mb": round(peak, 1),
            "embed_alone_us_per_text": round(embed_alone(kind, texts), 1),
        }
    finally:
        drop(base, [environment], [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--embedders", default="hashing,wordllama")
    arguments = parser.parse_args()
    named = [kind for kind in arguments.embedders.split(",") if kind]
    for kind in named:
        if kind not in EMBEDDER_KINDS:
            parser.error(f"unknown embedder {kind!r}: one of {', '.join(EMBEDDER_KINDS)}")
    kinds = [cast(EmbedderKind, kind) for kind in named]
    base = Settings()
    run = uuid.uuid4().hex[:8]
    results = [
        one(base, run, f"{kind}{number}", kind, arguments.memories)
        for number in range(arguments.rounds)
        for kind in kinds
    ]
    print(json.dumps({"memories": arguments.memories, "runs": results}, indent=2))


if __name__ == "__main__":
    main()
