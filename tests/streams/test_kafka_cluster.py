"""memproj on three Kafka brokers (``ops/stack up kafka-cluster``): its topics replicated three
times with ``min.insync.replicas`` 2, and the leader of the busiest partitions killed while
events are produced and applied. Nothing is lost and nothing is applied twice: the raw topic
holds every produced event once, and the projection equals one made on the single broker.

The cluster is started for this module only, with the project's ops script, and stopped
after it (left running if it was running before): the rest of the suite keeps its broker."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType  # type: ignore[attr-defined]

from streams.kafka import admin_config, producer_config
from streams.progress import end_offsets
from streams.sample import sample_memory_stream
from streams.settings import Settings
from support.environment import REPO, Env, isolated_env
from topics.registry import ALL_TOPICS, MEMORY_EVENTS

# One process of a session runs this module: its fixture starts the cluster and stops it after.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("kafka-cluster")]

STACK = str(REPO / "ops" / "stack")


def ops_stack(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STACK, *arguments], capture_output=True, text=True, timeout=300, check=False
    )


@dataclass(frozen=True)
class KafkaClusterUnderTest:
    bootstrap: str
    replication_factor: int
    min_insync_replicas: int

    def broker_pid(self, node_id: int) -> int:
        """The JVM of broker ``node_id``, as ``ops/stack status kafka-cluster`` names it."""
        for line in ops_stack("status", "kafka-cluster").stdout.splitlines():
            fields = line.split()
            if fields[:2] == [f"broker-{node_id}", "up"]:
                return int(fields[fields.index("pid") + 1])
        raise AssertionError(f"broker {node_id} is not running")


@pytest.fixture(scope="module")
def kafka_cluster() -> Iterator[KafkaClusterUnderTest]:
    was_running = ops_stack("status", "kafka-cluster").returncode == 0
    started = ops_stack("up", "kafka-cluster")
    if started.returncode != 0:
        pytest.fail(f"ops/stack up kafka-cluster failed:\n{started.stdout}\n{started.stderr}")
    exports = dict(
        line.removeprefix("export ").split("=", 1)
        for line in ops_stack("env", "kafka-cluster").stdout.splitlines()
    )
    try:
        yield KafkaClusterUnderTest(
            exports["MEMPROJ_KAFKA_BOOTSTRAP"],
            int(exports["MEMPROJ_TOPIC_REPLICATION_FACTOR"]),
            int(exports["MEMPROJ_TOPIC_MIN_INSYNC_REPLICAS"]),
        )
    finally:
        # A developer's cluster gets back the broker the test killed; CI's is stopped.
        ops_stack("up" if was_running else "down", "kafka-cluster")


def leaders(admin: AdminClient, topic: str) -> dict[int, int]:
    """Partition -> the node id leading it."""
    metadata = admin.list_topics(topic, timeout=10).topics[topic]
    return {partition.id: partition.leader for partition in metadata.partitions.values()}


def test_topics_are_replicated_and_a_leader_kill_loses_and_repeats_nothing(
    stack: Settings, kafka_cluster: KafkaClusterUnderTest, tmp_path: Path
) -> None:
    on_cluster = stack.model_copy(
        update={
            "kafka_bootstrap": kafka_cluster.bootstrap,
            "topic_replication_factor": kafka_cluster.replication_factor,
            "topic_min_insync_replicas": kafka_cluster.min_insync_replicas,
        }
    )
    messages = [(m.key, m.value) for m in sample_memory_stream(3000, tenants=4, seed=13)]
    first, rest = messages[:1000], messages[1000:]
    for name in ("single", "cluster"):
        (tmp_path / name).mkdir()
    with (
        isolated_env(stack, tmp_path / "single") as reference,
        isolated_env(on_cluster, tmp_path / "cluster") as env,
    ):
        admin = AdminClient(admin_config(kafka_cluster.bootstrap))
        names = [env.topic(spec) for spec in ALL_TOPICS]
        metadata = admin.list_topics(timeout=10).topics
        assert {
            len(partition.replicas)
            for name in names
            for partition in metadata[name].partitions.values()
        } == {3}
        configs = admin.describe_configs([ConfigResource(ResourceType.TOPIC, n) for n in names])
        assert {future.result()["min.insync.replicas"].value for future in configs.values()} == {
            "2"
        }

        # The reference: the same stream projected on the single broker.
        reference.produce(reference.topic(MEMORY_EVENTS), messages)
        reference.worker()

        raw = env.topic(MEMORY_EVENTS)
        env.produce(raw, first)
        env.worker(batch_max_events=200)
        env.wait_until(lambda: applied(env) > 0, "the worker applying events")

        # The broker that leads most partitions of the raw topic: its producer's and the
        # worker's consumer's leader, and the sealed log's writer's for some of its keys.
        busiest = Counter(leaders(admin, raw).values()).most_common(1)[0][0]
        producer = Producer(producer_config(kafka_cluster.bootstrap, **{"linger.ms": 5}))
        failures: list[str] = []

        def on_delivery(error: object, _message: object) -> None:
            if error is not None:
                failures.append(str(error))

        killed_at = None
        for index, (key, value) in enumerate(rest):
            producer.produce(raw, value, key, on_delivery=on_delivery)
            producer.poll(0)
            if index % 100 == 99:
                time.sleep(0.02)  # a stream, not one burst: the kill lands in the middle
            if index == 300:
                os.kill(kafka_cluster.broker_pid(busiest), signal.SIGKILL)
                killed_at = applied(env)
        assert producer.flush(90) == 0
        assert failures == []
        assert killed_at is not None and killed_at > 0  # mid-stream: applying, not done
        assert busiest not in set(leaders(admin, raw).values())

        env.wait_caught_up(seconds=180)
        reference.wait_caught_up(seconds=180)

        # Nothing lost, nothing written twice: the raw topic took each produced event once
        # (its end offsets count every write; the worker trims what it has sealed).
        assert sum(end_offsets(kafka_cluster.bootstrap, raw).values()) == len(messages)
        # Nothing applied twice (nor skipped): the same projection as on the single broker.
        on_three, on_one = env.checksums(), reference.checksums()
        assert on_three == on_one
        assert sum(c.versions for c in on_three.values()) > 2000


def applied(env: Env) -> int:
    """Events the projection has applied (its offsets in PostgreSQL)."""
    with env.connect() as conn:
        row = conn.execute(
            "SELECT coalesce(sum(next_offset), 0) FROM projection_offsets"
        ).fetchone()
    assert row is not None
    return int(row[0])
