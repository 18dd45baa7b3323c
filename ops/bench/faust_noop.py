"""A faust agent that does nothing but acknowledge: faust's own per-event ceiling, the
reference memproj's workers left for a batch consumer (ops/decisions/batch-consumer.md).

    python ops/bench/faust_noop.py TOPIC COUNT   (run by ops/bench/projection.py)

The app settings and the ``noack_take`` loop memproj's agents used while they ran on faust,
with the batch work removed; prints a line ``faust-noop RATE CPU``: the events/s from the first
batch to the COUNT-th event, then the process's CPU time per event over the same span (µs).
Marked, since faust's console (its start-up spinner) writes to the same stdout.
"""

from __future__ import annotations

import os
import sys
import time
import uuid

import faust

from streams.settings import Settings

RESULT = "faust-noop"


def build_app(settings: Settings, worker: str) -> faust.App:
    """The app of a worker kind, as memproj built it for faust (plaintext local stack)."""
    datadir = settings.data_dir / "faust" / worker
    datadir.mkdir(parents=True, exist_ok=True)
    return faust.App(
        settings.group_id(worker),
        broker=f"kafka://{settings.kafka_bootstrap}",
        key_serializer="raw",
        value_serializer="raw",
        topic_allow_declare=False,
        topic_disable_leader=True,
        web_enabled=False,
        autodiscover=False,
        datadir=str(datadir),
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=1.0,
        broker_max_poll_records=settings.batch_max_events,
        stream_buffer_maxsize=settings.batch_max_events * 4,
        stream_ack_exceptions=False,
        stream_ack_cancelled_tasks=False,
        stream_wait_empty=False,
    )


def main() -> None:
    topic_name, count = sys.argv[1], int(sys.argv[2])
    settings = Settings().model_copy(update={"group_prefix": f"bench-noop-{uuid.uuid4().hex}"})
    app = build_app(settings, "noop")
    topic = app.topic(topic_name, key_type=bytes, value_type=bytes, allow_empty=True)
    seen = 0
    started = 0.0
    cpu_started = 0.0

    async def noop(stream: faust.StreamT[bytes]) -> None:
        nonlocal seen, started, cpu_started
        async for batch in stream.noack_take(  # type: ignore[attr-defined]
            settings.batch_max_events, within=settings.batch_max_wait_seconds
        ):
            if not started:
                started = time.perf_counter()
                cpu_started = time.process_time()
            for event in batch:
                await stream.ack(event)
            seen += len(batch)
            if seen >= count:
                counted = seen - len(batch)
                rate = counted / (time.perf_counter() - started)
                cpu = 1e6 * (time.process_time() - cpu_started) / counted
                os.write(1, f"\n{RESULT} {rate:.0f} {cpu:.1f}\n".encode())
                os._exit(0)

    app.agent(topic, name="noop")(noop)
    faust.Worker(app, loglevel="warn", redirect_stdouts=False).execute_from_commandline()


if __name__ == "__main__":
    main()
