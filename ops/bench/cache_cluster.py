"""The Redis cache on a single Redis and on a Redis Cluster of three masters, side by side.

    ops/stack up && ops/stack up redis-cluster && eval "$(ops/stack env)"
    .venv/bin/python ops/bench/cache_cluster.py [--tenants 40] [--entries 2000] [--rounds 3]

On each backend, in a namespace of its own (deleted afterwards), in alternating rounds so that
the shared machine's drift falls on both alike: ``--entries`` recall entries of three memories
each spread over ``--tenants`` tenants are put (``put_recall``: one transaction each) and got
(``get_recall``), then every tenant's subjects are erased as the cache worker does, in batches
of 20 tombstones (``invalidate_each`` then ``indexed_each``), and each tenant's entries are
proved gone by a scan (``reachable``: one SCAN of the keyspace, of every master on the
cluster). Each operation is timed one after the other from one client: latency, not
throughput; beside its wall time, the client's CPU time (redis-py's routing on a cluster) and
the servers' (INFO's used_cpu of every node, summed over each phase). The cluster is the one
``ops/redis/cluster env`` names. The machine is shared: read the CPU columns and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from environment import percentile
from redis.asyncio import RedisCluster

from projections.cache.entries import Holdings
from projections.cache.store import RedisCache, RedisClient, connect
from streams.settings import Settings

REPO = Path(__file__).resolve().parents[2]
BATCH = 20


def cluster_url() -> str:
    exports = subprocess.run(
        [str(REPO / "ops" / "redis" / "cluster"), "env"], capture_output=True, text=True, check=True
    ).stdout
    for line in exports.splitlines():
        if line.startswith("export MEMPROJ_REDIS_URL="):
            return line.split("=", 1)[1]
    raise SystemExit("ops/redis/cluster env names no MEMPROJ_REDIS_URL")


async def timed(samples: list[float], step: Awaitable[Any]) -> None:
    started = time.perf_counter()
    await step
    samples.append((time.perf_counter() - started) * 1000)


async def server_cpu(client: RedisClient) -> float:
    """Seconds of CPU every node of ``client``'s Redis has spent."""
    if isinstance(client, RedisCluster):
        per_node = await client.info("cpu", target_nodes=RedisCluster.PRIMARIES)
        answers = list(per_node.values())
    else:
        answers = [await client.info("cpu")]
    return sum(float(a["used_cpu_user"]) + float(a["used_cpu_sys"]) for a in answers)


class Phase:
    """The client's and the servers' CPU time over one phase of a round, in ms per op."""

    def __init__(self, client: RedisClient, cpu: dict[str, list[float]], name: str) -> None:
        self.client, self.cpu, self.name = client, cpu, name

    async def __aenter__(self) -> Phase:
        self.client_cpu = time.process_time()
        self.server_cpu = await server_cpu(self.client)
        return self

    async def __aexit__(self, *_: object) -> None:
        self.cpu[f"{self.name}_client"].append(time.process_time() - self.client_cpu)
        self.cpu[f"{self.name}_server"].append(await server_cpu(self.client) - self.server_cpu)


async def one_round(
    client: RedisClient,
    tenants: int,
    entries: int,
    samples: dict[str, list[float]],
    cpu: dict[str, list[float]],
) -> None:
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    cache = RedisCache(client, 300, namespace)
    placed = [
        (f"t{n % tenants}", ("user", f"u{n % (tenants * 5)}"), f"q{n}") for n in range(entries)
    ]
    try:
        async with Phase(client, cpu, "put"):
            for n, (tenant, subject, query) in enumerate(placed):
                records = [
                    {"memory_id": f"m{n}-{k}", "value": {"text": "x" * 200}} for k in range(3)
                ]
                await timed(samples["put"], cache.put_recall(tenant, subject, query, records))
        async with Phase(client, cpu, "get"):
            for tenant, subject, query in placed:
                await timed(samples["get"], cache.get_recall(tenant, subject, query))
        async with Phase(client, cpu, "reachable_scan"):
            for n in range(tenants):
                await timed(samples["reachable_scan"], cache.reachable(f"t{n}", memory_ids=["m0"]))
        erasures = sorted({(tenant, subject) for tenant, subject, _ in placed})
        async with Phase(client, cpu, "erase_batch"):
            for start in range(0, len(erasures), BATCH):
                batch = [
                    (t, Holdings.targets(s, [], [])) for t, s in erasures[start : start + BATCH]
                ]
                await timed(samples["erase_batch"], erase(cache, batch))
    finally:
        leftovers = [key async for key in client.scan_iter(match=f"{namespace}:*", count=500)]
        for start in range(0, len(leftovers), 500):
            await client.delete(*leftovers[start : start + 500])


async def erase(cache: RedisCache, batch: list[tuple[str, Holdings]]) -> None:
    """What the cache worker does with a batch of tombstones (``CacheStore.erase_many``)."""
    await cache.invalidate_each(batch)
    await cache.indexed_each(batch)


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "count": len(samples),
        "p50_ms": round(percentile(samples, 0.50), 3),
        "p99_ms": round(percentile(samples, 0.99), 3),
        "mean_ms": round(sum(samples) / len(samples), 3) if samples else float("nan"),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    backends = {
        "single": connect(Settings().redis_url),
        "cluster": connect(cluster_url(), cluster=True),
    }
    operations = ("put", "get", "erase_batch", "reachable_scan")
    samples: dict[str, dict[str, list[float]]] = {
        n: {op: [] for op in operations} for n in backends
    }
    cpu: dict[str, dict[str, list[float]]] = {
        n: {f"{op}_{side}": [] for op in operations for side in ("client", "server")}
        for n in backends
    }
    try:
        for _ in range(args.rounds):
            for name, client in backends.items():
                await one_round(client, args.tenants, args.entries, samples[name], cpu[name])
    finally:
        for client in backends.values():
            await client.aclose()
    results: dict[str, Any] = {}
    for name, ops in samples.items():
        results[name] = {}
        for op, values in ops.items():
            results[name][op] = summary(values)
            for side in ("client", "server"):
                seconds = sum(cpu[name][f"{op}_{side}"])
                results[name][op][f"{side}_cpu_ms_per_op"] = round(seconds * 1000 / len(values), 3)
    return {
        "tenants": args.tenants,
        "entries": args.entries,
        "rounds": args.rounds,
        "erase_batch": BATCH,
        "results": results,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=40)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    arguments = parser.parse_args()
    text = json.dumps(asyncio.run(main(arguments)), indent=2)
    print(text)
    if arguments.out:
        arguments.out.write_text(text + "\n")
