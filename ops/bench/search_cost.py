"""What a semantic search reads from the vector store: whole entries, or ids and versions only.

    .venv/bin/python ops/bench/search_cost.py [--memories 20000] [--limit 1000] [--rounds 5]

One subject's ``--memories`` memories (texts of about 300 characters, the hashing embedder's
256-dimension vectors) in a LanceDB table of its own (a temporary directory, no services).
Each round asks the ``limit`` x ``CANDIDATES_PER_RESULT`` nearest entries of that subject, as
a search with ``limit`` does, both ways, alternated (A B A B, so that the shared machine's
drift falls on both): ``search`` (every column: text and vector included, what search read
before) and ``search_candidates`` (id, kind, tenant, memory and version: what it reads now).
Reported per way: the median wall and CPU milliseconds of a ranking, its results included.
The hydration that follows reads ``limit`` records from PostgreSQL where it read ``limit`` x 4
(when every candidate is eligible): counted by tests/streams/test_semantic_recall.py, not
timed here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from projections.embeddings.embedder import HashingEmbedder
from projections.embeddings.lance import LanceVectorStore
from projections.embeddings.vectors import MemoryOnly, VectorEntry, memory_entry_id
from streams.reads import CANDIDATES_PER_RESULT

TENANT = "acme"
SUBJECT = ("user", "alice")
WORDS = ("tea", "coffee", "morning", "flights", "window", "seat", "Lisbon", "bakery", "cats")


def text_of(n: int) -> str:
    words = [WORDS[(n * 7 + i * 3) % len(WORDS)] for i in range(40)]
    return f"memory {n}: " + " ".join(words)


def entries(
    count: int,
    embedder: HashingEmbedder,
    subject: tuple[str, str] = SUBJECT,
    text: Callable[[int], str] = text_of,
) -> list[VectorEntry]:
    """``count`` memories of ``subject`` (ids unique to it), their texts ``text(n)``."""
    texts = [text(n) for n in range(count)]
    vectors = embedder.embed(texts)
    now = datetime.now(UTC)
    prefix = "" if subject == SUBJECT else f"{subject[1]}-"
    return [
        VectorEntry(
            id=memory_entry_id(TENANT, f"{prefix}m{n}"),
            kind="memory",
            tenant_id=TENANT,
            subject_type=subject[0],
            subject_id=subject[1],
            memory_id=f"{prefix}m{n}",
            conversation_id=None,
            message_id=None,
            source_type="message",
            source_ref=f"conv/{n}",
            text=text,
            version=1,
            occurred_at=now,
            vector=tuple(vector),
            memory_kind="preference",
            scope="user",
        )
        for n, (text, vector) in enumerate(zip(texts, vectors, strict=True))
    ]


def measure(run: Callable[[], object]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=20000)
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    embedder = HashingEmbedder(256)
    asked = args.limit * CANDIDATES_PER_RESULT
    with tempfile.TemporaryDirectory() as directory:
        store = LanceVectorStore(Path(directory), embedder.dim, model=embedder.name)
        store.upsert(entries(args.memories, embedder))
        (query,) = embedder.embed(["tea in the morning"])
        only = MemoryOnly(kinds=frozenset({"preference"}), scopes=frozenset({"user"}))
        ways: dict[str, Callable[[], object]] = {
            "search (whole entries)": lambda: store.search(TENANT, query, asked, SUBJECT, only),
            "search_candidates (ids, versions)": lambda: store.search_candidates(
                TENANT, query, asked, SUBJECT, only
            ),
        }
        for run in ways.values():
            run()  # warm: the table's files in the page cache, the indexes loaded
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, run in ways.items():
                samples[name].append(measure(run))
    results = {
        name: {
            "wall_ms": round(statistics.median(s[0] for s in runs), 1),
            "cpu_ms": round(statistics.median(s[1] for s in runs), 1),
        }
        for name, runs in samples.items()
    }
    report = {"memories": args.memories, "limit": args.limit, "ranked": asked, "ways": results}
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
