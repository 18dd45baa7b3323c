"""What replication costs: memproj's producer and its memory pipeline on the single broker
(replication factor 1) and on the three-broker cluster (``ops/stack up kafka-cluster``) with
replication factor 1 and with 3 and ``min.insync.replicas`` 2, side by side, with the same
sample stream.

    .venv/bin/python ops/bench/replication.py --cluster-bootstrap HOST:PORT,... [--memories 10000]

For each target, in an environment of its own (topics, schema, groups):

- produce: memproj's producer (``acks=all``, idempotent; ``producer_config``) writing the
  stream into the raw topic, from the first message to the last acknowledgement;
- apply from a backlog: one ``memproj worker memory`` (validate, seal, project, publish the
  sealed log and memory.current with the same producer) from its resumption to the last
  committed row (``pipeline.from_backlog``).

The single broker is the stack's (``eval "$(ops/stack env)"``); the cluster's address is
``ops/stack env kafka-cluster``'s. The machine is shared and noisy: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

from environment import Environment, drop, isolated, prepare  # ops/bench/environment.py
from pipeline import from_backlog, produce  # ops/bench/pipeline.py

from streams.sample import sample_memory_stream
from streams.settings import Settings
from topics.registry import MEMORY_EVENTS

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "ops" / "bench" / "results"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster-bootstrap", required=True)
    parser.add_argument("--memories", type=int, default=10_000)
    args = parser.parse_args()
    base = Settings()
    targets = {
        "single broker, RF 1": base,
        # The cluster without replication: what the three brokers cost apart from it.
        "three brokers, RF 1": base.model_copy(update={"kafka_bootstrap": args.cluster_bootstrap}),
        "three brokers, RF 3, min.insync 2": base.model_copy(
            update={
                "kafka_bootstrap": args.cluster_bootstrap,
                "topic_replication_factor": 3,
                "topic_min_insync_replicas": 2,
            }
        ),
    }
    messages = [(m.key, m.value) for m in sample_memory_stream(args.memories, 8, seed=3)]
    run = uuid.uuid4().hex[:8]
    RESULTS.mkdir(parents=True, exist_ok=True)
    result: dict[str, object] = {"events": len(messages)}
    for number, (name, settings) in enumerate(targets.items()):
        environments: list[Environment] = []
        try:
            for part in ("produce", "apply"):
                environment = isolated(settings, run, f"{part}{number}")
                if part == "produce":
                    prepare(settings, environment, [MEMORY_EVENTS])
                else:
                    prepare(settings, environment)
                environments.append(environment)
            started = time.perf_counter()
            produced_in = produce(environments[0].settings, messages)
            applied_in, _ = from_backlog(
                environments[1].settings, messages, RESULTS / f"worker-{run}-replication{number}", 1
            )
            result[name] = {
                "produce_events_per_s": round(len(messages) / produced_in),
                "apply_events_per_s": round((len(messages) - 1) / applied_in),
                "seconds": round(time.perf_counter() - started, 1),
            }
            print(name, result[name], flush=True)
        finally:
            drop(settings, environments, [])
    out = RESULTS / f"replication-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
