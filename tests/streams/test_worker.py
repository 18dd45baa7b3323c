"""Worker composition (``streams.worker``): what each kind is built of, without starting it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from streams.metrics import Metrics
from streams.services import BatchConsumers
from streams.settings import Settings
from streams.worker import CONSUMING_KINDS, WORKER_KINDS, GracefulWorker, consumers_per_worker


@pytest.mark.parametrize("kind", sorted(WORKER_KINDS))
def test_each_agent_of_a_worker_has_a_consumer_of_its_own(kind: str, tmp_path: Path) -> None:
    """A store's tombstones never share a consumer with its feed, and the benchmark's and an
    operator's count of group members per worker (``consumers_per_worker``) is what is built."""
    # LanceDB: the embeddings worker opens its vector store as it is built, and this test
    # needs no service.
    settings = Settings(data_dir=tmp_path, environment="local", vector_store="lancedb")

    async def build() -> list[BatchConsumers]:
        parts = WORKER_KINDS[kind](settings, Metrics(CollectorRegistry()))
        return [s for s in parts.services if isinstance(s, BatchConsumers)]

    consumers = asyncio.run(build())
    built = sum(len(each.runs) for each in consumers)
    assert built == consumers_per_worker(kind)
    assert (built > 0) == (kind in CONSUMING_KINDS)


def test_a_stopping_worker_waits_for_the_tasks_it_cancelled_not_a_fixed_time() -> None:
    """mode's last step slept a fixed second; the worker's waits for what is still unwinding
    (within that second), so a stopped worker's process ends as soon as it has unwound. Run
    as mode runs it: a task of its own on the loop, once the services have stopped."""
    unwound = asyncio.Event()

    async def cancelled_by_mode() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # unwinding takes a step of its own
            unwound.set()

    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(cancelled_by_mode())
        loop.run_until_complete(asyncio.sleep(0))
        task.cancel()
        sentinel = loop.create_task(GracefulWorker._sentinel_task(cast(Any, None)))
        for _ in range(10):  # a few steps of the loop, no time of its own
            loop.run_until_complete(asyncio.sleep(0))
        assert sentinel.done()
    finally:
        loop.close()
    assert task.cancelled() and unwound.is_set()
