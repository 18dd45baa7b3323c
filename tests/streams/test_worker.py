"""Worker composition (``streams.worker``): what each kind is built of, without starting it."""

from __future__ import annotations

import asyncio
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
