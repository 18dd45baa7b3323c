"""The alert rules, the dashboards and the metrics against a real Prometheus scraping real
workers: rules and config pass promtool, every expression evaluates and names metrics the
workers export, and a ghost scenario moves the metrics and the alerts both ways."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from click.testing import CliRunner

from projections.embeddings.vectors import VectorEntry, memory_entry_id
from streams.cli import cli
from streams.sample import EventFactory
from streams.worker import CONSUMING_KINDS
from support.deletion_scenario import wait_verified
from support.embedders import embedder_of, vectors_of
from support.ports import free_port
from topics.registry import CONVERSATION_EVENTS, DELETION_REQUESTS, MEMORY_EVENTS

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "ops" / "prometheus" / "alerts.yml"
DASHBOARDS = sorted((REPO / "ops" / "grafana" / "dashboards").glob("*.json"))


def binary(name: str) -> str:
    found = shutil.which(name)
    assert found, f"{name} is not installed: ops/stack up installs Debian's prometheus package"
    return found


def test_promtool_accepts_the_rules_and_both_configs() -> None:
    promtool = binary("promtool")
    for command in (
        [promtool, "check", "rules", str(RULES)],
        [promtool, "check", "config", str(REPO / "ops/prometheus/prometheus.yml")],
        [promtool, "check", "config", str(REPO / "ops/prometheus/prometheus.docker.yml")],
    ):
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    promtool = binary("promtool")
    unit_tests = sorted((REPO / "ops" / "prometheus" / "tests").glob("*.yml"))
    assert unit_tests
    result = subprocess.run(
        [promtool, "test", "rules", *map(str, unit_tests)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.get("/api/v1/query", query=expr)["result"]  # type: ignore[no-any-return]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def alert_state(self, name: str, **labels: str) -> str | None:
        for alert in self.get("/api/v1/alerts")["alerts"]:
            if alert["labels"]["alertname"] == name and all(
                alert["labels"].get(k) == v for k, v in labels.items()
            ):
                return str(alert["state"])
        return None


def rules_for_tests(tmp: Path) -> Path:
    """The shipped rules with test timings: every ``for`` 1s, the embeddings SLO 2s."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "1s"
            if rule.get("record") == "memproj:deletion_slo_seconds":
                # The exported SLO series, the embeddings store's replaced by 2 s.
                rule["expr"] = (
                    'label_replace(vector(2), "store", "embeddings", "", "") or ' + rule["expr"]
                )
    path = tmp / "alerts.yml"
    path.write_text(yaml.safe_dump(rules))
    return path


@pytest.fixture
def prometheus_for(tmp_path: Path) -> Iterator[Any]:
    processes: list[subprocess.Popen[bytes]] = []

    def start(targets: dict[str, int]) -> Prometheus:
        port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules_for_tests(tmp_path))],
            "scrape_configs": [
                {
                    "job_name": "memproj",
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{p}"], "labels": {"worker": kind}}
                        for kind, p in targets.items()
                    ],
                }
            ],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        log = (tmp_path / "prometheus.log").open("wb")
        processes.append(
            subprocess.Popen(
                [
                    binary("prometheus"),
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:  # readiness: Prometheus answers /-/ready once its storage and rules load
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return Prometheus(url)
            except OSError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.1)

    yield start
    for process in processes:
        process.terminate()
        process.wait(20)


def exported_names(ports: dict[str, int]) -> set[str]:
    """Every metric name the workers export, with the suffixes Prometheus stores."""
    names: set[str] = set()
    for port in ports.values():
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        for line in text.decode().splitlines():
            match = re.match(r"# TYPE (\S+) (\S+)", line)
            if match:
                name, kind = match.groups()
                names.add(name)
                if kind == "counter":
                    names.add(name + "_total")
                if kind == "histogram":
                    names.update(name + suffix for suffix in ("_bucket", "_sum", "_count"))
    return names


def expressions() -> list[tuple[str, str]]:
    found = []
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            found.append((rule.get("alert") or rule["record"], rule["expr"]))
    for dashboard in DASHBOARDS:
        for panel in json.loads(dashboard.read_text())["panels"]:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append((f"{dashboard.name}: {panel.get('title')}", target["expr"]))
    return found


def grafana_to_promql(expr: str) -> str:
    expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "15s")
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def seed(env: Any, f: EventFactory) -> None:
    alice = ("user", "alice")
    env.produce_events(
        [
            f.started("acme", "c1", alice),
            f.message("acme", "c1", "m1", "user", "my password is hunter22, I like jazz"),
        ],
        CONVERSATION_EVENTS,
    )
    env.produce_events(
        [
            f.proposed(
                "acme", "mem_jazz", alice, {"text": "likes jazz"}, source=("message", "c1/m1")
            ),
            f.proposed("acme", "mem_city", alice, {"text": "lives in Oslo"}),
        ]
    )
    env.produce(env.topic(MEMORY_EVENTS), [(b"acme:broken", b"{not json")])


def test_dashboards_alerts_and_a_ghost_scenario_in_prometheus(
    env: Any, prometheus_for: Any
) -> None:
    ports = {kind: free_port() for kind in (*CONSUMING_KINDS, "monitor")}
    overrides = {"monitor_interval_seconds": 1.0, "audit_interval_seconds": 1.0}
    workers = {
        kind: env.worker(kind, metrics_port=port, **overrides) for kind, port in ports.items()
    }
    start = datetime.now(UTC) - timedelta(minutes=5)
    f = EventFactory(id_prefix="p", clock=start)
    seed(env, f)
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation")
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    prometheus = prometheus_for(ports)

    def all_up() -> bool:
        return bool(prometheus.value('count(up{job="memproj"} == 1)') == len(ports))

    env.wait_until(all_up, "Prometheus to scrape every worker")
    env.wait_until(
        lambda: prometheus.value('sum(memproj_events_applied_total{projection="memory"})') == 2,
        "the applied events in Prometheus",
    )

    # Every expression of the rules and dashboards evaluates, and names exported metrics.
    exported = exported_names(ports)
    recorded = {name for name, _ in expressions() if name.startswith("memproj:")}
    for name, expr in expressions():
        prometheus.query(grafana_to_promql(expr))  # raises on an invalid expression
        for metric in re.findall(r"\b(memproj[_:][a-z_:]+)", expr):
            assert metric in exported | recorded, f"{name}: {metric} is not exported"
    assert prometheus.value('sum(memproj_dead_letters_total{error="malformed_json"})') == 1

    # The ghost scenario: a store is down while an erasure is on its way.
    workers["embeddings"].stop()
    env.produce_events(
        [
            f.deletion(
                "acme",
                "d1",
                {"type": "subject", "id": "alice", "subject_type": "user"},
                deadline_at=datetime.now(UTC) + timedelta(minutes=10),
            )
        ],
        DELETION_REQUESTS,
    )
    pending = 'memproj_deletions_pending{store="embeddings"}'
    env.wait_until(lambda: prometheus.value(pending) == 1, "pending deletions to rise")
    env.wait_until(
        lambda: (
            (prometheus.value('memproj_deletion_oldest_pending_seconds{store="embeddings"}') or 0)
            > 2
        ),
        "the oldest pending age to rise",
    )
    env.wait_until(
        lambda: (
            prometheus.alert_state("MemprojDeletionPendingTooLong", store="embeddings") == "firing"
        ),
        "the pending-deletion alert to fire",
    )
    assert prometheus.alert_state("MemprojDeletionPendingTooLong", store="summaries") is None
    env.wait_until(
        lambda: prometheus.alert_state("MemprojWorkerDown", worker="embeddings") == "firing",
        "the worker-down alert to fire",
    )

    env.worker("embeddings", metrics_port=ports["embeddings"], **overrides)
    env.wait_until(lambda: prometheus.value(pending) == 0, "pending deletions to fall to 0")
    env.wait_until(
        lambda: (
            prometheus.value('memproj_deletion_oldest_pending_seconds{store="embeddings"}') == 0
        ),
        "the oldest pending age to fall to 0",
    )
    env.wait_until(
        lambda: prometheus.alert_state("MemprojDeletionPendingTooLong", store="embeddings") is None,
        "the pending-deletion alert to resolve",
    )
    assert (prometheus.value("sum(memproj_deletion_completion_seconds_count)") or 0) >= 1
    # Verified first: a verification still to run would find the vector written below and
    # have the store erase it again, before the alert's minute is up.
    wait_verified(env, "acme", "d1")

    # A vector for the erased memory, written behind memproj's back, is found by the audit.
    vectors = vectors_of(env.settings)
    (vector,) = embedder_of(env.settings).embed(["likes jazz"])
    vectors.upsert(
        [
            VectorEntry(
                id=memory_entry_id("acme", "mem_jazz"),
                kind="memory",
                tenant_id="acme",
                subject_type="user",
                subject_id="alice",
                memory_id="mem_jazz",
                conversation_id="c1",
                message_id=None,
                source_type="message",
                source_ref="c1/m1",
                text="likes jazz",
                version=1,
                occurred_at=start,  # as old as the erased memory: a ghost, not new data
                vector=tuple(vector),
                memory_kind="preference",
                scope="user",
            )
        ]
    )
    ghosts = 'memproj_ghost_items{store="embeddings"}'
    env.wait_until(lambda: prometheus.value(ghosts) == 1, "the audit to report the ghost")
    environment = env.settings.as_environment()
    on_demand = CliRunner().invoke(cli, ["audit", "ghosts", "--json"], env=environment)
    assert on_demand.exit_code == 1, on_demand.output  # scripts can act on the exit status
    assert orjson.loads(on_demand.output)["embeddings"]["ghost_items"] == 1
    env.wait_until(
        lambda: prometheus.alert_state("MemprojGhostItemsPresent", store="embeddings") == "firing",
        "the ghost alert to fire",
    )
