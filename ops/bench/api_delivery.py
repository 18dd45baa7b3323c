"""The API's producer against the workers' publisher, for one message per request.

    flock /tmp/bench.lock .venv/bin/python ops/bench/api_delivery.py [--requests 200]

``--requests`` concurrent writes, each one message awaited alone as a route awaits it:
``DeliveringProducer.deliver`` (a future per message, resolved by a poll thread) and
``KafkaPublisher.publish`` (a worker thread per call, each waiting in ``flush`` for every
message of the producer), alternated A B A B in one run. Per message: latency p50 and p99,
and this process's CPU (all threads).
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

# ops/bench/*.py, beside this script
from environment import drop, isolated, percentile, prepare

from projections.outbox import OutboxMessage
from streams.kafka import DeliveringProducer, KafkaPublisher
from streams.settings import Settings
from topics.registry import DELETION_REQUESTS

Write = Callable[[int], Awaitable[None]]
WARM_UP = 10


async def timed(write: Write, requests: int) -> list[float]:
    await asyncio.gather(*(write(-1 - index) for index in range(WARM_UP)))

    async def one(index: int) -> float:
        began = time.perf_counter()
        await write(index)
        return (time.perf_counter() - began) * 1000

    return list(await asyncio.gather(*(one(index) for index in range(requests))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    base = Settings()
    environment = isolated(base, uuid.uuid4().hex[:8], "delivery")
    prepare(base, environment, specs=[DELETION_REQUESTS])
    settings = environment.settings
    topic = settings.topics.name(DELETION_REQUESTS)
    delivering = DeliveringProducer(settings.kafka)
    publisher = KafkaPublisher(settings.kafka)

    async def deliver(index: int) -> None:
        await delivering.deliver(topic, f"k{index}".encode(), b"v")

    async def publish(index: int) -> None:
        await publisher.publish([OutboxMessage(topic, f"k{index}".encode(), b"v")])

    try:
        for name, write in [("DeliveringProducer", deliver), ("KafkaPublisher", publish)] * 2:
            cpu = time.process_time()
            latencies = asyncio.run(timed(write, args.requests))
            spent = (time.process_time() - cpu) / (args.requests + WARM_UP)
            print(
                f"{name:18} {args.requests} concurrent: p50 {percentile(latencies, 0.5):.1f} ms,"
                f" p99 {percentile(latencies, 0.99):.1f} ms, CPU {spent * 1e6:.0f} µs a message"
            )
    finally:
        delivering.close()
        publisher.close()
        drop(base, [environment], [])


if __name__ == "__main__":
    main()
