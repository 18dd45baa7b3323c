"""Peak resident memory of what the vector-store workers do with a large store.

    .venv/bin/python ops/bench/store_memory.py [--vectors 80000] [--baseline TREE]

It builds one LanceDB store of ``--vectors`` entries (8 tenants, 25 subjects each, memories
and messages, 256 dimensions like the hashing embedder) and then runs, each in a fresh
process on its own copy of the store, what one worker kind does with it:

- monitor: the ghost audit of 20 subject erasures (their memories and conversations too,
  as the ledger records them) and of revoked memories, before the store has erased them: the
  audit finds ghosts;
- deletion: the verification probe of those 20 erasures, after the store erased them: each
  with one probe vector per erased entry (the ledger keeps one per item);
- embeddings: 200 index updates of 100 entries (merge_insert) and the 20 erasures.

Each process reports its peak RSS (``VmHWM``) after opening the store and at the end, and
its CPU time. With ``--baseline`` the same scenarios also run on another source tree (e.g.
``git archive`` of main unpacked somewhere), side by side in one run, on the same store.
The store parts are imported the way a worker imports them, and the workers' own start-up
(``limit_malloc_arenas``, ``use_system_arrow_pool``) is applied where the tree has it; the
rest of a worker (faust, librdkafka, the agents) is not in these numbers:
ops/bench/projection.py measures the workers whole.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
KINDS = ("monitor", "deletion", "embeddings")
DIM = 256
MODEL = "bench/random-256"  # random vectors: of no embedder
TENANTS = 8
SUBJECTS = 25
ERASURES = 20


def subject_of(index: int) -> str:
    return f"user_{(index * 7919) % SUBJECTS}"


def conversation_of(index: int, subject: str) -> str:
    # A conversation belongs to one subject, as the conversation projection's owner does.
    return f"conv_{subject}_{(index // TENANTS) % 6}"


def erased_subjects() -> list[tuple[str, str]]:
    return [(f"tenant_{n % TENANTS}", f"user_{n}") for n in range(ERASURES)]


def open_store(store_class: Any, path: Path) -> Any:
    """The store of the tree being measured: one from before embedders were named (a
    ``--baseline``) takes no model."""
    import inspect

    if "model" in inspect.signature(store_class).parameters:
        return store_class(path, DIM, model=MODEL)
    return store_class(path, DIM)


def build(path: Path, vectors: int) -> None:
    """The store, written in batches the way the indexer writes, then compacted."""
    from datetime import UTC, datetime, timedelta

    import numpy as np

    from projections.embeddings.lance import LanceVectorStore
    from projections.embeddings.vectors import VectorEntry, memory_entry_id, message_entry_id

    store = open_store(LanceVectorStore, path)
    rng = np.random.default_rng(7)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    batch: list[VectorEntry] = []
    for index in range(vectors):
        tenant, subject = f"tenant_{index % TENANTS}", subject_of(index)
        conversation = conversation_of(index, subject)
        vector = tuple(rng.standard_normal(DIM, dtype=np.float32).tolist())
        at = start + timedelta(seconds=index)
        if index % 2 == 0:
            memory = f"mem_{index:06d}"
            entry = VectorEntry(
                memory_entry_id(tenant, memory), "memory", tenant, "user", subject, memory,
                conversation, None, "message", f"{conversation}/msg_1",
                f"preference {index} of {subject}", 1, at, vector, "preference", "user",
            )  # fmt: skip
        else:
            message = f"msg_{index:06d}"
            entry = VectorEntry(
                message_entry_id(tenant, conversation, message), "message", tenant, "user",
                subject, None, conversation, message, "message", f"{conversation}/{message}",
                f"message {index} from {subject} about the weekend plans", 1, at, vector,
                None, None,
            )  # fmt: skip
        batch.append(entry)
        if len(batch) == 1000:
            store.upsert(batch)
            batch = []
    store.upsert(batch)
    store.purge_history()


@dataclass(frozen=True)
class Target:
    rows: list[dict[str, Any]]  # id, kind, memory_id, message_id, conversation_id
    vectors: Any  # numpy, one row per entry


def status() -> dict[str, float]:
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            found[key] = int(value.split()[0]) / 1024
    return found


def erase_subjects(path: Path) -> None:
    """The erased subjects' entries removed and the history purged, as the embeddings worker
    leaves the store before the verification probe runs."""
    from projections.embeddings.lance import LanceVectorStore
    from projections.embeddings.vectors import Match

    store = open_store(LanceVectorStore, path)
    for tenant, subject_id in erased_subjects():
        store.remove(Match(tenant, subject=("user", subject_id)))
    store.purge_history()


def run_kind(kind: str, path: Path, original: Path | None = None) -> dict[str, Any]:
    """One worker kind's part, in this process (``--run``); the erased subjects are read from
    ``original`` (the store before ``erase_subjects``) if given."""
    import asyncio
    import time

    try:
        from streams.runtime import limit_malloc_arenas
    except ImportError:  # a tree from before it
        pass
    else:
        limit_malloc_arenas()
    try:
        from streams.runtime import use_system_arrow_pool
    except ImportError:  # a tree from before it
        pass
    else:
        use_system_arrow_pool()
    from datetime import UTC, datetime

    try:
        from projections.deletion import probes as deletion_probes
    except ImportError:  # a tree from before it: the probe vectors were the ledger store's
        from projections.deletion import store as deletion_probes  # type: ignore[no-redef]
    from projections.deletion.erasure import Erasure, ErasureIndex
    from projections.deletion.erasure import conversation_key as conversation
    from projections.deletion.erasure import memory_key as memory
    from projections.deletion.erasure import subject_key as subject
    from projections.embeddings.lance import LanceVectorStore
    from projections.sealing.crypto import new_data_key
    from projections.sealing.probes import ProbeSealer
    from projections.stores.embeddings import EmbeddingsStore
    from topics.deletion import DeletionTarget, Tombstone, TombstoneItem

    cpu = time.process_time()
    vectors = open_store(LanceVectorStore, path)
    store = EmbeddingsStore(vectors, asyncio.Lock(), ProbeSealer(new_data_key()))
    opened = status()
    cut_off = datetime(2027, 1, 1, tzinfo=UTC)

    before = vectors.table if original is None else open_store(LanceVectorStore, original).table

    def erased(tenant: str, subject_id: str) -> Target:
        """What the subject has in the store, read compactly: the scenario's own bookkeeping
        must not be what is measured."""
        where = f"tenant_id = '{tenant}' AND subject_id = '{subject_id}'"
        columns = ["id", "kind", "memory_id", "message_id", "conversation_id", "vector"]
        rows = before.search().where(where).select(columns).limit(None).to_arrow()
        found = rows.drop_columns(["vector"]).to_pylist()
        probes = rows.column("vector").combine_chunks().flatten().to_numpy().reshape(-1, DIM)
        return Target(found, probes.copy())

    targets = {(tenant, s): erased(tenant, s) for tenant, s in erased_subjects()}

    def tombstone(number: int, tenant: str, subject_id: str) -> Tombstone:
        entries = targets[(tenant, subject_id)].rows
        items = [
            TombstoneItem(type="memory", id=e["memory_id"])
            if e["memory_id"] is not None
            else TombstoneItem(
                type="message", id=e["message_id"], conversation_id=e["conversation_id"]
            )
            for e in entries
        ]
        items += [
            TombstoneItem(type="conversation", id=c)
            for c in sorted({e["conversation_id"] for e in entries if e["conversation_id"]})
        ]
        return Tombstone(
            deletion_id=f"del-{number}", tenant_id=tenant, kind="erasure",
            target=DeletionTarget(type="subject", subject_type="user", id=subject_id),
            items=tuple(items), issued_at=cut_off, cut_off=cut_off, deadline_at=cut_off,
            required_stores=("embeddings",),
        )  # fmt: skip

    tombstones = [tombstone(n, t, s) for n, (t, s) in enumerate(erased_subjects())]
    if kind == "monitor":
        keys: dict[str, dict[Any, Erasure]] = {}
        for (tenant, subject_id), target in targets.items():
            found = keys.setdefault(tenant, {})
            found[subject(tenant, "user", subject_id)] = Erasure("d", cut_off)
            for e in target.rows:
                if e["memory_id"] is not None:
                    found[memory(tenant, e["memory_id"])] = Erasure("d", cut_off)
                if e["conversation_id"] is not None:
                    found[conversation(tenant, e["conversation_id"])] = Erasure("d", cut_off)
        for index in range(0, vectors.count(), 32):  # revoked: one memory in 16 (sample: 6%)
            tenant = f"tenant_{index % TENANTS}"
            keys.setdefault(tenant, {})[memory(tenant, f"mem_{index:06d}")] = Erasure("r", cut_off)
        covered = {tenant: ErasureIndex(found) for tenant, found in keys.items()}
        ghosts = asyncio.run(store.ghosts(None, covered))  # type: ignore[arg-type]
        result: dict[str, Any] = {"ghosts": len(ghosts)}
    elif kind == "deletion":
        probes = {t.deletion_id: targets[(t.tenant_id, t.target.id)] for t in tombstones}

        async def load_probes(conn: Any, tenant: str, deletion: str, _: Any) -> list[Any]:
            target = probes[deletion]  # as the ledger keeps them: one per item, opened
            return [
                (e["kind"], e["id"], vector.tolist())
                for e, vector in zip(target.rows, target.vectors, strict=True)
            ]

        deletion_probes.load_probes = load_probes  # type: ignore[assignment]
        cpu = time.process_time()
        reached = [asyncio.run(store.reachable(None, t)) for t in tombstones]  # type: ignore[arg-type]
        result = {
            "probes": sum(len(p.rows) for p in probes.values()),
            "reachable": sum(map(len, reached)),
        }
    else:
        from dataclasses import replace

        sample = vectors.get("tenant_0", [targets[erased_subjects()[0]].rows[0]["id"]])[0]
        for number in range(200):
            batch = [
                replace(
                    sample, id=f"memory:tenant_0:new_{number}_{n}", memory_id=f"new_{number}_{n}"
                )
                for n in range(100)
            ]
            vectors.upsert(batch)
            if number % 10 == 9:
                asyncio.run(store.erase(tombstones[number // 10]))
        result = {"entries": vectors.count()}
    return {
        "kind": kind,
        "opened_mb": round(opened["VmHWM"], 1),
        "peak_mb": round(status()["VmHWM"], 1),
        "cpu_s": round(time.process_time() - cpu, 2),
        **result,
    }


def measure(tree: Path, kind: str, store: Path, scratch: Path) -> dict[str, Any]:
    """``kind`` in a process of its own on a copy of the store (of the erased one for the
    verification probe, which runs once the store erased)."""
    copy = scratch / f"{kind}-{tree.name}"
    shutil.copytree(scratch / "erased" if kind == "deletion" else store, copy)
    command = [sys.executable, __file__, "--run", kind, "--store", str(copy), "--tree", str(tree)]
    try:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        out = subprocess.run(
            [*command, "--original", str(store)],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    finally:
        shutil.rmtree(copy)
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vectors", type=int, default=80_000)
    parser.add_argument("--baseline", type=Path, help="another source tree to run beside")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=KINDS)
    parser.add_argument("--run", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--tree", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--original", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        sys.path.insert(0, str(args.tree))
        print(json.dumps(run_kind(args.run, args.store, args.original)))
        return
    trees = [REPO] + ([args.baseline.resolve()] if args.baseline else [])
    with tempfile.TemporaryDirectory(prefix="memproj-store-memory-") as scratch:
        store = Path(scratch) / "store"
        build(store, args.vectors)
        shutil.copytree(store, Path(scratch) / "erased")
        erase_subjects(Path(scratch) / "erased")
        results = {
            kind: {str(tree): measure(tree, kind, store, Path(scratch)) for tree in trees}
            for kind in args.kinds
        }
    print(json.dumps(results, indent=2))
    print(f"peak RSS MB with {args.vectors} vectors (after opening the store -> at the end):")
    for kind, by_tree in results.items():
        cells = [
            f"{Path(tree).name}: {r['opened_mb']:.0f} -> {r['peak_mb']:.0f} ({r['cpu_s']} s CPU)"
            for tree, r in by_tree.items()
        ]
        print(f"  {kind:<11} " + " | ".join(cells))


if __name__ == "__main__":
    main()
