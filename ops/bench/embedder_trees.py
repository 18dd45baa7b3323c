"""The WordLlama embedder of two source trees side by side: memory and speed.

    .venv/bin/python ops/bench/embedder_trees.py A_TREE B_TREE [--texts 20000] [--rounds 2]

Per round and tree (alternated: A B A B, so that the machine's drift falls on both), a fresh
interpreter with ``PYTHONPATH`` at the tree builds ``build_embedder("wordllama", 256)`` and
embeds the same texts in batches of 100 (after one warm batch). Reported: resident memory
before the build, after it and after the texts (``VmRSS``, with its anonymous and file-backed
parts), the peak (``VmHWM``), and texts per second of wall time and CPU microseconds per
text. Texts: the paraphrase set's memories and queries and every memory text of the sample
stream, cycled. No service is needed; read the ratios of one run, the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PARAPHRASES = HERE.parents[1] / "tests" / "projections" / "data" / "paraphrases.json"

CHILD = """
import json, sys, time

def memory() -> dict[str, float]:
    fields = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) / 1024
    return fields

texts = json.load(open(sys.argv[1]))
before = memory()
from projections.embeddings.factory import build_embedder
embedder = build_embedder("wordllama", 256)
built = memory()
embedder.embed(texts[:100])
wall, cpu = time.perf_counter(), time.process_time()
for start in range(0, len(texts), 100):
    embedder.embed(texts[start : start + 100])
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps({"before": before, "built": built, "embedded": memory(),
                  "texts_per_s": len(texts) / wall, "cpu_us_per_text": cpu / len(texts) * 1e6}))
"""


def sample_texts(count: int) -> list[str]:
    from projections.embeddings.embedder import memory_text
    from streams.sample import sample_memory_stream

    data = json.loads(PARAPHRASES.read_text())
    texts = [m["text"] for m in data["memories"]] + [q["text"] for q in data["queries"]]
    for message in sample_memory_stream(memories=5000):
        try:
            payload = json.loads(message.value or b"")["payload"]
        except (ValueError, KeyError, TypeError):
            continue  # the stream's malformed messages
        if isinstance(payload, dict) and isinstance(payload.get("value"), dict):
            texts.append(memory_text(payload["value"], str(payload.get("kind", ""))))
    return [texts[index % len(texts)] for index in range(count)]


def one(tree: Path, texts_file: Path) -> dict[str, Any]:
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(texts_file)],
        env=environment,
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    measured: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("trees", nargs=2, type=Path)
    parser.add_argument("--texts", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    texts_file = Path(f"/tmp/embedder-trees-{os.getpid()}.json")
    texts_file.write_text(json.dumps(sample_texts(args.texts)))
    try:
        print(
            "tree | round | RSS MB before/built/embedded | anon/file | peak | texts/s | CPU us/text"
        )
        for round_ in range(1, args.rounds + 1):
            for label, tree in zip("AB", args.trees, strict=True):
                m = one(tree, texts_file)
                print(
                    f"{label} {tree} | {round_} | {m['before']['VmRSS']:.0f}/"
                    f"{m['built']['VmRSS']:.0f}/{m['embedded']['VmRSS']:.0f} | "
                    f"{m['embedded']['RssAnon']:.0f}/{m['embedded']['RssFile']:.0f} | "
                    f"{m['embedded']['VmHWM']:.0f} | {m['texts_per_s']:,.0f} | "
                    f"{m['cpu_us_per_text']:.1f}",
                    flush=True,
                )
    finally:
        texts_file.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
