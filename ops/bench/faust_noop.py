"""A faust agent that does nothing but acknowledge: faust's own per-event ceiling.

    python ops/bench/faust_noop.py TOPIC COUNT   (run by ops/bench/projection.py)

Same app settings and the same ``noack_take`` loop as memproj's projection agent, with the
batch work removed; prints the events/s from the first batch to the COUNT-th event, then the
process's CPU time per event over the same span (µs).
"""

from __future__ import annotations

import os
import sys
import time
import uuid

import faust

from streams.app import build_app
from streams.settings import Settings


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
                os.write(1, f"{rate:.0f} {cpu:.1f}\n".encode())
                os._exit(0)

    app.agent(topic, name="noop")(noop)
    faust.Worker(app, loglevel="warn", redirect_stdouts=False).execute_from_commandline()


if __name__ == "__main__":
    main()
