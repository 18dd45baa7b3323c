"""docker-compose.yml cannot run here (no Docker engine), so its consistency with the native
stack is checked by reading it: ports, variables, workers and scrape targets."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from streams.cli.deployment import scrape_targets
from streams.settings import Settings
from streams.worker import METRICS_PORTS, WORKER_KINDS

REPO = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
STACK = (REPO / "ops" / "stack").read_text()


def stack_default(variable: str) -> int:
    match = re.search(rf"\${{{variable}:-(\d+)}}", STACK)
    assert match, f"ops/stack has no default for {variable}"
    return int(match.group(1))


def host_ports(service: str) -> set[int]:
    ports = set()
    for mapping in SERVICES[service].get("ports", []):
        host_ip, host_port, _container = mapping.split(":")
        assert host_ip == "127.0.0.1", f"{service} publishes {mapping} beyond loopback"
        ports.add(int(host_port))
    return ports


def test_service_ports_match_the_native_stack_and_the_settings_defaults() -> None:
    defaults = Settings()
    assert host_ports("kafka") == {stack_default("MEMPROJ_KAFKA_PORT")}
    assert host_ports("postgres") == {stack_default("MEMPROJ_PG_PORT")}
    assert host_ports("redis") == {stack_default("MEMPROJ_REDIS_PORT")}
    assert int(defaults.kafka_bootstrap.rsplit(":", 1)[1]) == stack_default("MEMPROJ_KAFKA_PORT")
    assert urlsplit(defaults.postgres_dsn).port == stack_default("MEMPROJ_PG_PORT")
    assert urlsplit(defaults.redis_url).port == stack_default("MEMPROJ_REDIS_PORT")
    kafka_env = SERVICES["kafka"]["environment"]
    assert "HOST://127.0.0.1:9092" in kafka_env["KAFKA_ADVERTISED_LISTENERS"]
    assert SERVICES["kafka"]["image"].startswith("apache/kafka:")
    assert kafka_env["KAFKA_PROCESS_ROLES"] == "broker,controller"


def test_every_memproj_variable_is_a_setting_and_points_at_a_compose_service() -> None:
    fields = {f"MEMPROJ_{name.upper()}" for name in Settings.model_fields}
    for name, service in SERVICES.items():
        environment = service.get("environment") or {}
        for variable in environment:
            if variable.startswith("MEMPROJ_"):
                assert variable in fields, f"{name}: {variable} is not a memproj setting"
    environment = SERVICES["memproj-memory"]["environment"]
    assert urlsplit(f"kafka://{environment['MEMPROJ_KAFKA_BOOTSTRAP']}").hostname in SERVICES
    assert urlsplit(environment["MEMPROJ_POSTGRES_DSN"]).hostname in SERVICES
    assert urlsplit(environment["MEMPROJ_REDIS_URL"]).hostname in SERVICES
    # Topic names are the contract's own: no prefix unless a user sets one.
    assert "MEMPROJ_TOPIC_PREFIX" not in environment


def test_every_worker_kind_runs_with_its_metrics_port_and_is_scraped() -> None:
    prometheus = yaml.safe_load((REPO / "ops/prometheus/prometheus.docker.yml").read_text())
    discovered = [job["file_sd_configs"][0]["files"] for job in prometheus["scrape_configs"]]
    assert discovered == [["targets/*.json"]]
    mounted = {c["source"]: c["target"] for c in SERVICES["prometheus"]["configs"]}
    assert mounted == {"memproj-targets": "/etc/prometheus/targets/memproj.json"}
    targets = json.loads(COMPOSE["configs"]["memproj-targets"]["content"])
    # The same list as the registry's, which ops/stack writes for the local Prometheus.
    assert targets == scrape_targets(None)
    for kind in WORKER_KINDS:
        service = SERVICES[f"memproj-{kind}"]
        assert service["command"] == ["worker", kind]
        assert host_ports(f"memproj-{kind}") == {METRICS_PORTS[kind]}
    init = " ".join(SERVICES["memproj-init"]["entrypoint"])
    assert "memproj topics create" in init and "memproj db migrate" in init


def test_grafana_and_prometheus_are_provisioned_from_ops() -> None:
    volumes = " ".join(SERVICES["grafana"]["volumes"])
    assert "./ops/grafana/provisioning" in volumes
    for volume in SERVICES["prometheus"]["volumes"] + SERVICES["grafana"]["volumes"]:
        source = volume.split(":")[0]
        assert (REPO / source).exists(), f"{source} is mounted but missing"
