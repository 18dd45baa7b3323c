"""The embeddings store's erasure, one tombstone at a time against a batch, in one run.

    .venv/bin/python ops/bench/erasure_batch.py [--vectors 80000] [--tombstones 50]

A LanceDB vector store on a temporary disk path is filled with ``--vectors`` entries (in
writes of 10,000, as the indexer leaves them: several data files), then ``--tombstones``
revocations of one memory each are erased one after the other (``EmbeddingsStore.erase``,
the path of every tombstone before batches), and as many others in one
``EmbeddingsStore.erase_many``. Each side reports wall and CPU time per tombstone and how
many old-version purges it ran; the ratio of the two is what a batch saves. No services
needed. The machine is shared: read the ratio, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from projections.embeddings.lance import LanceVectorStore
from projections.embeddings.vectors import VectorEntry, memory_entry_id
from projections.sealing.crypto import new_data_key
from projections.sealing.probes import ProbeSealer
from projections.stores.embeddings import EmbeddingsStore
from topics.deletion import DeletionTarget, Tombstone, TombstoneItem

DIM = 256  # the default embedder's
MODEL = "bench/random-256"  # random vectors: of no embedder
WRITE = 10_000
T0 = datetime(2026, 1, 1, tzinfo=UTC)


class CountingPurges(LanceVectorStore):
    purges = 0

    def purge_history(self) -> None:
        self.purges += 1
        super().purge_history()


def entry(number: int, rng: random.Random) -> VectorEntry:
    memory_id = f"m{number}"
    return VectorEntry(
        id=memory_entry_id(f"tenant_{number % 8}", memory_id),
        kind="memory",
        tenant_id=f"tenant_{number % 8}",
        subject_type="user",
        subject_id=f"user_{number % 500}",
        memory_id=memory_id,
        conversation_id=None,
        message_id=None,
        source_type="conversation",
        source_ref=f"conv/{memory_id}",
        text=f"memory {number}",
        version=1,
        occurred_at=T0,
        vector=tuple(rng.random() for _ in range(DIM)),
        memory_kind="preference",
        scope="user",
    )


def revocation(number: int) -> Tombstone:
    memory_id = f"m{number}"
    return Tombstone(
        deletion_id=f"rev-{number}",
        tenant_id=f"tenant_{number % 8}",
        kind="revocation",
        target=DeletionTarget(type="memory", id=memory_id),
        items=(TombstoneItem(type="memory", id=memory_id),),
        issued_at=T0 + timedelta(days=1),
        cut_off=T0 + timedelta(days=1),
        deadline_at=T0 + timedelta(days=2),
        required_stores=("embeddings",),
    )


def measured(
    work: Callable[[], Coroutine[Any, Any, int]], count: int, store: CountingPurges
) -> dict[str, float]:
    purges_before = store.purges
    wall, cpu = time.perf_counter(), time.process_time()
    removed = asyncio.run(work())
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "tombstones": count,
        "removed": removed,
        "purges": store.purges - purges_before,
        "wall_ms_per_tombstone": round(1000 * wall / count, 1),
        "cpu_ms_per_tombstone": round(1000 * cpu / count, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vectors", type=int, default=80_000)
    parser.add_argument("--tombstones", type=int, default=50)
    args = parser.parse_args()
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as directory:
        vectors = CountingPurges(Path(directory) / "vectors", dim=DIM, model=MODEL)
        for start in range(0, args.vectors, WRITE):
            vectors.upsert([entry(n, rng) for n in range(start, min(args.vectors, start + WRITE))])
        store = EmbeddingsStore(vectors, asyncio.Lock(), ProbeSealer(new_data_key()))
        count = args.tombstones
        # Every 7th memory, far apart: the revocations touch many data files.
        one_by_one = [revocation(n) for n in range(0, 7 * count, 7)]
        batch = [revocation(n) for n in range(3, 7 * count + 3, 7)]

        async def each() -> int:
            return sum([(await store.erase(tombstone)).removed for tombstone in one_by_one])

        async def together() -> int:
            return sum(erased.removed for erased in await store.erase_many(batch))

        alone = measured(each, count, vectors)
        batched = measured(together, count, vectors)
    result = {
        "vectors": args.vectors,
        "one_at_a_time": alone,
        "batch": batched,
        "one_at_a_time_vs_batch_wall": round(
            alone["wall_ms_per_tombstone"] / batched["wall_ms_per_tombstone"], 1
        ),
        "one_at_a_time_vs_batch_cpu": round(
            alone["cpu_ms_per_tombstone"] / batched["cpu_ms_per_tombstone"], 1
        ),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
