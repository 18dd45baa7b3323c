"""Every producer memproj builds asks for ``acks=all`` and idempotence: the configuration
function fixes them, and every ``Producer(...)`` in the code is built from it. Pure, no
broker."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, ClassVar

import pytest

from streams import kafka
from streams.kafka import (
    DURABLE_PRODUCER,
    DeliveringProducer,
    KafkaPublisher,
    WeakerDurability,
    producer_config,
)
from streams.kafka_security import KafkaCluster

REPO = Path(__file__).resolve().parents[2]
# Every directory with Python that builds Kafka clients: the packages, the benchmarks and the
# tests' own producers (transactional ones included).
SOURCES = ("streams", "projections", "topics", "ops", "tests")


def producer_calls() -> list[tuple[str, ast.Call]]:
    calls = []
    for root in SOURCES:
        for path in sorted((REPO / root).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                name = node.func.attr if isinstance(node.func, ast.Attribute) else None
                if isinstance(node.func, ast.Name):
                    name = node.func.id
                if name == "Producer":
                    where = f"{path.relative_to(REPO)}:{node.lineno}"
                    calls.append((where, node))
    return calls


def builds_its_config(call: ast.Call) -> bool:
    """``Producer(producer_config(...))`` (under any alias of ``producer_config``)."""
    if len(call.args) != 1 or call.keywords:
        return False
    argument = call.args[0]
    if not isinstance(argument, ast.Call):
        return False
    func = argument.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name.endswith("producer_config")


def test_every_producer_in_the_code_is_built_from_producer_config() -> None:
    calls = producer_calls()
    assert len(calls) > 10  # the scan finds them
    assert [where for where, call in calls if not builds_its_config(call)] == []


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"linger.ms": 20},
        {"transactional.id": "memproj-tx"},
        {"acks": "all", "enable.idempotence": True},
    ],
)
def test_every_producer_config_acknowledges_from_all_in_sync_replicas(
    overrides: dict[str, object],
) -> None:
    for target in ("127.0.0.1:9092", KafkaCluster("a:1,b:2,c:3")):
        config = producer_config(target, **overrides)
        assert config["acks"] == "all"
        assert config["enable.idempotence"] is True


@pytest.mark.parametrize(
    "weaker", [{"acks": 1}, {"acks": "0"}, {"enable.idempotence": False}, {"acks": -1}]
)
def test_a_weaker_producer_is_refused(weaker: dict[str, object]) -> None:
    with pytest.raises(WeakerDurability):
        producer_config("127.0.0.1:9092", **weaker)


class RecordingProducer:
    configs: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, config: dict[str, Any]) -> None:
        RecordingProducer.configs.append(config)

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0


def test_the_publisher_and_the_apis_producer_are_durable(monkeypatch: pytest.MonkeyPatch) -> None:
    RecordingProducer.configs = []
    monkeypatch.setattr(kafka, "Producer", RecordingProducer)
    KafkaPublisher("127.0.0.1:9092", **{"linger.ms": 1}).close()
    DeliveringProducer(KafkaCluster("127.0.0.1:9092"), delivery_timeout=5).close(0)
    assert len(RecordingProducer.configs) == 2
    for config in RecordingProducer.configs:
        assert {name: config[name] for name in DURABLE_PRODUCER} == DURABLE_PRODUCER
