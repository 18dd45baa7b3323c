"""Worker composition (``streams.worker``): what each kind is built of, without starting it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from streams.metrics import Metrics
from streams.services import BatchConsumers
from streams.settings import Settings
from streams.worker import CONSUMING_KINDS, WORKER_KINDS, consumers_per_worker


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


# A worker with one service that stops it once started, as SIGTERM does.
STOPS_ITSELF = """
import os, signal
from mode import Service
from streams.probes import ShutdownBudget
from streams.services import GracefulShutdown, WorkerState
from streams.worker import GracefulWorker

class StopsAtOnce(Service):
    async def on_started(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

shutdown = GracefulShutdown(WorkerState(None, in_group=False), [], None, ShutdownBudget(10))
GracefulWorker(StopsAtOnce(), shutdown=shutdown, loglevel="info", redirect_stdouts=False)\\
    .execute_from_commandline()
"""


def test_a_stopped_worker_exits_through_its_own_final_wait() -> None:
    """mode ends every exit with a wait of its own; the worker's replaces it (it waits for the
    cancelled tasks and the not-ready hold, not a fixed second)."""
    exited = subprocess.run(
        [sys.executable, "-c", STOPS_ITSELF], capture_output=True, text=True, timeout=60
    )
    output = exited.stdout + exited.stderr
    assert exited.returncode == 0, output
    assert "shutdown (a signal): not ready" in output
    assert "exit: " in output and "tasks unwound" in output
