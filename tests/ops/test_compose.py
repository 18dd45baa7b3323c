"""docker-compose.yml cannot run here (no Docker engine), so its consistency with the native
stack is checked by reading it: the Compose Specification's schema, ports, variables, workers,
the API and scrape targets. The health checks are commands: those run here, against a real
``memproj serve`` and a real embeddings worker on the stack.

compose-spec.json is the Compose Specification's JSON schema (github.com/compose-spec/
compose-spec, schema/compose-spec.json of 2025-10-28, commit 170098b; Apache License 2.0,
compose-spec.LICENSE beside it): what ``docker compose config`` validates a file against."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import click
import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml

from streams.api.app import create_app
from streams.api.services import build_services
from streams.cli import cli
from streams.cli.deployment import scrape_targets
from streams.services import open_vector_store
from streams.settings import Settings
from streams.worker import METRICS_PORTS, WORKER_KINDS
from support.api_server import serving
from support.environment import Env
from support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
STACK = (REPO / "ops" / "stack").read_text()
COMPOSE_SPEC = json.loads((Path(__file__).parent / "compose-spec.json").read_text())
API = SERVICES["memproj-api"]


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
    # The settings' own defaults, whatever this shell exports.
    fields = Settings.model_fields
    defaults = SimpleNamespace(
        **{name: fields[name].default for name in ("kafka_bootstrap", "postgres_dsn", "redis_url")}
    )
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


def scrape_jobs(config: str) -> dict[str, dict[str, Any]]:
    prometheus = yaml.safe_load((REPO / "ops" / "prometheus" / config).read_text())
    return {job["job_name"]: job for job in prometheus["scrape_configs"]}


def test_the_file_validates_against_the_compose_specification() -> None:
    # As `docker compose config` would: a misspelt key or a value of the wrong shape fails.
    jsonschema.Draft7Validator.check_schema(COMPOSE_SPEC)
    errors = [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in jsonschema.Draft7Validator(COMPOSE_SPEC).iter_errors(COMPOSE)
    ]
    assert not errors, errors
    # The schema catches what a typo makes of a service (the test of this test).
    broken = {"services": {"api": {"image": "memproj:local", "helthcheck": {}}}}
    assert not jsonschema.Draft7Validator(COMPOSE_SPEC).is_valid(broken)


def test_the_citus_profile_runs_a_coordinator_and_workers_and_distributes_the_tables() -> None:
    citus = {name for name, service in SERVICES.items() if "citus" in service.get("profiles", [])}
    assert citus == {"citus-coordinator", "citus-worker-1", "citus-worker-2", "citus-init"}
    for name in citus:
        assert SERVICES[name]["image"].startswith("citusdata/citus:")
    init = SERVICES["citus-init"]
    script = " ".join(init["entrypoint"])
    for worker in ("citus-worker-1", "citus-worker-2"):
        assert f"citus_add_node('{worker}', 5432)" in script
        assert init["depends_on"][worker] == {"condition": "service_healthy"}
    # The tables exist (memproj db migrate) before they are distributed, by the committed script.
    assert init["depends_on"]["memproj-init"] == {"condition": "service_completed_successfully"}
    assert "./ops/citus:/citus:ro" in init["volumes"]
    assert "-f /citus/distribute.sql" in script
    assert (REPO / "ops" / "citus" / "distribute.sql").is_file()
    # Beside the default stack, never in its way: its own published port.
    assert host_ports("citus-coordinator").isdisjoint(host_ports("postgres"))
    # The memproj services take the per-tenant lookups from the shell (true on Citus).
    lookups = COMPOSE["x-memproj-env"]["MEMPROJ_LOOKUPS_PER_TENANT"]
    assert lookups == "${MEMPROJ_LOOKUPS_PER_TENANT:-false}"


def test_every_worker_kind_runs_with_its_metrics_port_and_is_scraped() -> None:
    jobs = scrape_jobs("prometheus.docker.yml")
    assert jobs["memproj"]["file_sd_configs"] == [{"files": ["targets/*.json"]}]
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


# -- the HTTP API (memproj serve) ------------------------------------------------------------


def container_ports(service: dict[str, Any]) -> set[int]:
    return {int(mapping.rsplit(":", 1)[1]) for mapping in service.get("ports", [])}


def healthcheck_script(service: dict[str, Any]) -> str:
    """The Python a health check runs (the image has Python, not curl)."""
    cmd, python, flag, script = service["healthcheck"]["test"]
    assert (cmd, python, flag) == ("CMD", "python", "-c")
    return str(script)


def test_the_api_serves_beyond_loopback_on_its_published_port_and_is_scraped() -> None:
    environment = API["environment"]
    assert API["command"] == ["serve"]
    assert cli.get_command(click.Context(cli), "serve") is not None
    # Inside its container: 127.0.0.1 would refuse every connection from outside it.
    assert environment["MEMPROJ_API_HOST"] == "0.0.0.0"
    port = int(environment["MEMPROJ_API_PORT"])
    assert container_ports(API) == {port}
    assert host_ports("memproj-api") == {port}
    # The workers' settings too (the same anchor), and so the same services.
    assert environment.items() >= SERVICES["memproj-memory"]["environment"].items()
    (api_job,) = scrape_jobs("prometheus.docker.yml")["memproj-api"]["dns_sd_configs"]
    # Every replica of the service, on the API's port (its /metrics).
    assert api_job == {"names": ["memproj-api"], "type": "A", "port": port}
    local_job = scrape_jobs("prometheus.yml")["memproj-api"]["static_configs"]
    default_port = Settings.model_fields["api_port"].default
    assert local_job == [{"targets": [f"127.0.0.1:{default_port}"]}]


def test_replicas_of_the_api_share_the_rate_limit_in_redis() -> None:
    environment = API["environment"]
    assert environment["MEMPROJ_API_RATE_LIMIT_STORAGE"] == "redis"
    assert urlsplit(environment["MEMPROJ_REDIS_URL"]).hostname == "redis"


def test_the_api_reads_the_vector_store_once_the_embeddings_worker_made_it() -> None:
    # The vectors are in PostgreSQL: the API mounts no worker's files.
    assert "volumes" not in API
    assert API["depends_on"] == {
        "memproj-init": {"condition": "service_completed_successfully"},
        # A reader never creates the store: the worker has, once it is healthy
        # (test_the_embeddings_worker_is_healthy_once_its_vector_store_exists).
        "memproj-embeddings": {"condition": "service_healthy"},
    }
    # memproj-init waits for healthy Kafka, PostgreSQL and Redis, as for every worker.
    assert SERVICES["memproj-init"]["depends_on"] == {
        name: {"condition": "service_healthy"} for name in ("kafka", "postgres", "redis")
    }


def test_the_health_checks_probe_routes_that_exist() -> None:
    # The API's is run for real below (ready or not); here, that its route exists.
    assert "/readyz" in healthcheck_script(API) and "MEMPROJ_API_PORT" in healthcheck_script(API)
    app = create_app(build_services(Settings()))
    routes = {getattr(route, "path", None) for route in app.routes}
    assert {"/readyz", "/healthz", "/metrics"} <= routes
    embeddings = healthcheck_script(SERVICES["memproj-embeddings"])
    assert f"http://127.0.0.1:{METRICS_PORTS['embeddings']}/healthz" in embeddings


def run_healthcheck(service: dict[str, Any], environment: dict[str, str]) -> int:
    """The service's health check as Docker runs it in the container, with this venv's python
    (the image's is on PATH as `python`)."""
    command = [sys.executable, "-c", healthcheck_script(service)]
    return subprocess.run(
        command, env=environment, capture_output=True, check=False, timeout=30
    ).returncode


@pytest.mark.integration
def test_the_api_health_check_passes_only_while_the_api_is_ready(env: Env) -> None:
    with serving(env) as server:
        assert run_healthcheck(API, {"MEMPROJ_API_PORT": str(server.port)}) == 0
    # Nothing listening: a container whose server died is unhealthy.
    assert run_healthcheck(API, {"MEMPROJ_API_PORT": str(server.port)}) != 0
    # Serving, but Kafka is unreachable: /readyz answers 503, which fails the check.
    with serving(env, kafka_bootstrap="127.0.0.1:1") as unready:
        assert run_healthcheck(API, {"MEMPROJ_API_PORT": str(unready.port)}) != 0


@pytest.mark.integration
def test_the_embeddings_worker_is_healthy_once_its_vector_store_exists(env: Env) -> None:
    port = free_port()
    worker = env.worker("embeddings", metrics_port=port)
    # The compose command, on this worker's port instead of the kind's fixed one.
    script = healthcheck_script(SERVICES["memproj-embeddings"])
    fixed = f":{METRICS_PORTS['embeddings']}/"
    assert fixed in script
    service = {"healthcheck": {"test": ["CMD", "python", "-c", script.replace(fixed, f":{port}/")]}}

    def healthy() -> bool:
        assert worker.alive(), f"the embeddings worker exited:\n{worker.log_tail()}"
        return run_healthcheck(service, {}) == 0

    env.wait_until(healthy, "the embeddings worker's health check")
    # A reader's opening refuses a store nothing created yet (VectorStoreMissing), whichever
    # backend MEMPROJ_VECTOR_STORE names: healthy means the store exists.
    open_vector_store(env.settings, create=False)
