"""The Kubernetes manifests (ops/k8s, a kustomize base) checked without a cluster: every
manifest against the Kubernetes schemas that kubernetes-validate ships, every worker kind
of the registry against its Deployment (command, port, probes, settings, shutdown bound), and
the HTTP API's Deployment, Service and budget against ``memproj serve`` and its settings."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from kubernetes_validate.utils import latest_version  # type: ignore[import-untyped]

from streams.api.app import create_app
from streams.api.services import build_services
from streams.cli import cli
from streams.settings import SECRET_FILE_SETTINGS, Settings, split_dsn_password
from streams.worker import METRICS_PORTS, WORKER_KINDS, WORKERS

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "ops" / "k8s"
KUSTOMIZATION: dict[str, Any] = yaml.safe_load((BASE / "kustomization.yaml").read_text())
RESOURCE_FILES: list[str] = KUSTOMIZATION["resources"]

# The oldest Kubernetes release the manifests are meant for, and the newest the package knows.
KUBERNETES_VERSIONS = ("1.30.0", latest_version())

# The kinds that run one at a time (the registry says why); none with the default settings.
SINGLE_KINDS = {name for name, kind in WORKERS.kinds.items() if kind.single is not None}
SECRETS_MOUNT = "/var/run/secrets/memproj"
API = "memproj-api"  # the HTTP API's Deployment, Service and PodDisruptionBudget (api.yaml)
MEMORY_LIMIT_BYTES = 512 * 2**20  # a worker's RSS target is 300 MB
# The API is no worker: its bound is its measured peak (803 MB at 100,000 memories) and a margin.
API_MEMORY_LIMIT_BYTES = 2**30


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


MANIFESTS: dict[str, list[dict[str, Any]]] = {
    name: documents(BASE / name) for name in RESOURCE_FILES
}
ALL = [doc for docs in MANIFESTS.values() for doc in docs]


def the(kind: str, name: str) -> dict[str, Any]:
    found = [doc for doc in ALL if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} named {name} in ops/k8s"
    return found[0]


def deployment(worker: str) -> dict[str, Any]:
    return the("Deployment", f"memproj-{worker}")


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in ALL:
        if doc["kind"] in ("Deployment", "Job"):
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


CONFIG: dict[str, str] = the("ConfigMap", "memproj-settings")["data"]
SECRET_KEYS = set(the("Secret", "memproj-secrets")["stringData"])


def variable(field: str) -> str:
    return f"MEMPROJ_{field.upper()}"


# Every setting is an environment variable; each secret also has its <NAME>_FILE setting.
SETTINGS = {variable(name) for name in Settings.model_fields}
SECRETS = {variable(name) for name in SECRET_FILE_SETTINGS}


def memory_bytes(quantity: str) -> int:
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", quantity)
    assert match, f"unexpected memory quantity {quantity}"
    return int(match.group(1)) * {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}[match.group(2)]


def test_the_kustomization_lists_every_manifest() -> None:
    on_disk = {
        str(path.relative_to(BASE))
        for path in BASE.rglob("*.yaml")
        if path.name != "kustomization.yaml"
    }
    assert sorted(RESOURCE_FILES) == sorted(on_disk)
    assert len(set(RESOURCE_FILES)) == len(RESOURCE_FILES)
    identities = [(doc["kind"], doc["metadata"]["name"]) for doc in ALL]
    assert len(set(identities)) == len(identities), "two manifests share a kind and name"
    # The placeholder image that `kustomize edit set image memproj=...` replaces.
    assert [image["name"] for image in KUSTOMIZATION["images"]] == ["memproj"]
    for name, pod in pod_specs():
        for container in containers(pod):
            assert container["image"] == "memproj:latest", name


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", RESOURCE_FILES)
def test_every_manifest_validates_against_the_kubernetes_schemas(name: str, version: str) -> None:
    for doc in MANIFESTS[name]:
        # strict: an unknown (misspelt) field fails too; a kind without a schema raises.
        kubernetes_validate.validate(doc, version, strict=True)


def metrics_container_port(container: dict[str, Any]) -> int:
    (port,) = [port for port in container["ports"] if port["name"] == "metrics"]
    return int(port["containerPort"])


def probe_port(container: dict[str, Any], probe: str) -> int:
    port = container[probe]["httpGet"]["port"]
    if isinstance(port, int):
        return port
    (named,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return int(named)


def test_every_worker_kind_has_a_deployment_with_its_command_port_and_probes() -> None:
    deployed = {doc["metadata"]["name"] for doc in ALL if doc["kind"] == "Deployment"}
    assert deployed == {f"memproj-{kind}" for kind in WORKER_KINDS} | {API}
    for kind in WORKER_KINDS:
        spec = deployment(kind)["spec"]
        assert (
            spec["selector"]["matchLabels"].items()
            <= spec["template"]["metadata"]["labels"].items()
        )
        assert spec["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == kind
        (container,) = spec["template"]["spec"]["containers"]
        assert container["command"] == ["memproj", "worker", kind]
        port = METRICS_PORTS[kind]
        assert metrics_container_port(container) == port
        for probe, path in [
            ("startupProbe", "/healthz"),
            ("livenessProbe", "/healthz"),
            ("readinessProbe", "/readyz"),
        ]:
            assert container[probe]["httpGet"]["path"] == path, (kind, probe)
            assert probe_port(container, probe) == port, (kind, probe)
        assert spec["template"]["metadata"]["annotations"] == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(port),
            "prometheus.io/path": "/metrics",
        }


def skeleton(kind: str) -> dict[str, Any]:
    """The Deployment of ``kind`` less what is its own (name, port, command, rollout, the
    vector store's volume and placement): what every worker's Deployment shares."""
    doc = copy.deepcopy(deployment(kind))
    doc["metadata"]["name"] = "memproj-KIND"
    spec = doc["spec"]
    del spec["strategy"], spec["replicas"]
    template = spec["template"]
    for labels in (doc["metadata"]["labels"], spec["selector"]["matchLabels"]):
        labels["app.kubernetes.io/component"] = "KIND"
    template["metadata"]["labels"]["app.kubernetes.io/component"] = "KIND"
    template["metadata"]["annotations"]["prometheus.io/port"] = "PORT"
    pod = template["spec"]
    pod.pop("affinity", None)
    pod["volumes"] = [v for v in pod["volumes"] if "persistentVolumeClaim" not in v]
    (container,) = pod["containers"]
    container["command"][-1] = "KIND"
    container["ports"][0]["containerPort"] = "PORT"
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "vectors"]
    return doc


def test_every_worker_deployment_is_the_same_but_for_its_own_parts() -> None:
    # Hand-written, one file per kind: this keeps the copies from drifting apart.
    for kind in WORKER_KINDS:
        assert skeleton(kind) == skeleton("memory"), kind
    # The kinds that scale by partition roll over without a gap; the single ones stop the old
    # pod before the new one starts.
    for kind in WORKER_KINDS:
        rolling = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
        expected = {"type": "Recreate"} if kind in SINGLE_KINDS else rolling
        assert deployment(kind)["spec"]["strategy"] == expected, kind


def test_every_worker_kind_runs_two_replicas_and_no_claim_with_the_default_store() -> None:
    assert not SINGLE_KINDS
    for kind in WORKER_KINDS:
        spec = deployment(kind)["spec"]
        assert spec["replicas"] == 2, kind
        claims = [v for v in spec["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v]
        assert not claims, kind
    # The LanceDB option keeps one embeddings writer: its manifest says so.
    assert "MEMPROJ_VECTOR_STORE=lancedb: one replica" in " ".join(
        line.lstrip("# ")
        for line in (BASE / "workers" / "embeddings.yaml").read_text().splitlines()
    )


def test_every_worker_kind_has_a_disruption_budget_for_its_pods() -> None:
    budgets = {doc["metadata"]["name"] for doc in ALL if doc["kind"] == "PodDisruptionBudget"}
    assert budgets == {f"memproj-{kind}" for kind in WORKER_KINDS} | {API}
    for kind in WORKER_KINDS:
        budget = the("PodDisruptionBudget", f"memproj-{kind}")["spec"]
        assert budget["selector"] == deployment(kind)["spec"]["selector"]
        # Never 0 unavailable: a budget that allows no eviction blocks every node drain.
        assert budget["maxUnavailable"] >= 1


def environment_names(container: dict[str, Any]) -> set[str]:
    names = {entry["name"] for entry in container.get("env", [])}
    for source in container.get("envFrom", []):
        # Settings come from the ConfigMap only; a secret in the environment would be one
        # `env` or crash dump away from a log.
        assert set(source) == {"configMapRef"}, source
        assert source["configMapRef"]["name"] == "memproj-settings"
        names |= set(CONFIG)
    return names


def test_the_environment_names_only_real_settings() -> None:
    assert set(CONFIG) <= SETTINGS, f"not memproj settings: {sorted(set(CONFIG) - SETTINGS)}"
    for name, pod in pod_specs():
        for container in containers(pod):
            names = environment_names(container)
            assert names <= SETTINGS, f"{name}: not settings: {sorted(names - SETTINGS)}"


def test_secrets_are_read_from_the_mounted_secret_files_only() -> None:
    assert {f"{name}_FILE" for name in SECRETS} <= SETTINGS
    assert not SECRETS & set(CONFIG), "a secret's value is in the ConfigMap"
    assert split_dsn_password(CONFIG["MEMPROJ_POSTGRES_DSN"])[1] is None, "a password in the DSN"
    files = {name: path for name, path in CONFIG.items() if name.endswith("_FILE")}
    wanted = {"MEMPROJ_POSTGRES_PASSWORD", "MEMPROJ_MASTER_KEY", "MEMPROJ_KAFKA_PASSWORD"}
    assert {f"{name}_FILE" for name in wanted} <= set(files)
    for path in files.values():
        directory, key = path.rsplit("/", 1)
        assert directory == SECRETS_MOUNT and key in SECRET_KEYS, path
    for name, pod in pod_specs():
        (volume,) = [v for v in pod["volumes"] if "secret" in v]
        assert volume["secret"]["secretName"] == "memproj-secrets"
        for container in containers(pod):
            mounts = {m["name"]: m for m in container["volumeMounts"]}
            mount = mounts[volume["name"]]
            assert mount["mountPath"] == SECRETS_MOUNT and mount["readOnly"] is True, name


def test_the_settings_are_production_ones() -> None:
    # 'local' would let a worker run with the published development master key.
    assert CONFIG["MEMPROJ_ENVIRONMENT"] == "production"
    assert CONFIG["MEMPROJ_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"


def test_workers_serve_beyond_loopback_each_on_its_own_port() -> None:
    assert CONFIG["MEMPROJ_METRICS_HOST"] == "0.0.0.0"
    # Set, it would move every kind onto one port, away from its probes and annotations.
    assert "MEMPROJ_METRICS_PORT" not in CONFIG


def test_the_grace_period_outlasts_the_shutdown_bound() -> None:
    default = Settings.model_fields["shutdown_timeout_seconds"].default
    configured = float(CONFIG.get("MEMPROJ_SHUTDOWN_TIMEOUT_SECONDS", default))
    for kind in WORKER_KINDS:
        grace = deployment(kind)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace > max(default, configured), kind


def test_every_pod_runs_unprivileged_on_a_read_only_root_within_its_limits() -> None:
    account = the("ServiceAccount", "memproj")
    assert account["automountServiceAccountToken"] is False
    data_dir = CONFIG["MEMPROJ_DATA_DIR"]
    for name, pod in pod_specs():
        assert pod["serviceAccountName"] == "memproj"
        assert pod["automountServiceAccountToken"] is False
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] > 0, name
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in containers(pod):
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, name
            assert security["readOnlyRootFilesystem"] is True, name
            assert security["capabilities"] == {"drop": ["ALL"]}, name
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), name
            assert {"cpu", "memory"} <= set(resources["limits"]), name
            limit = memory_bytes(resources["limits"]["memory"])
            bound = API_MEMORY_LIMIT_BYTES if name == API else MEMORY_LIMIT_BYTES
            assert memory_bytes(resources["requests"]["memory"]) <= limit <= bound, name
            # The root is read-only: the data directory and /tmp are writable volumes.
            paths = {mount["mountPath"] for mount in container["volumeMounts"]}
            assert {data_dir, "/tmp"} <= paths, name


def test_no_pod_keeps_state_on_a_volume_claim() -> None:
    """The vectors are in PostgreSQL (MEMPROJ_VECTOR_STORE, postgres in configmap.yaml): no
    claim, no pod bound to another's node, and the embeddings worker scales by partition."""
    assert CONFIG["MEMPROJ_VECTOR_STORE"] == "postgres"
    assert not [doc for doc in ALL if doc["kind"] == "PersistentVolumeClaim"]
    pods = {kind: deployment(kind)["spec"]["template"]["spec"] for kind in WORKER_KINDS}
    pods[API] = api_pod()
    for name, pod in pods.items():
        assert not [v for v in pod["volumes"] if "persistentVolumeClaim" in v], name
        assert "podAffinity" not in pod.get("affinity", {}), name
    assert "embeddings" not in SINGLE_KINDS


def test_the_init_job_creates_the_topics_then_applies_the_migrations() -> None:
    pod = the("Job", "memproj-init")["spec"]["template"]["spec"]
    commands = [container["command"] for container in containers(pod)]
    assert commands == [["memproj", "topics", "create"], ["memproj", "db", "migrate"]]
    assert pod["restartPolicy"] == "Never"
    context = click.Context(cli)
    for _memproj, group, name in commands:
        command = cli.get_command(context, group)
        assert isinstance(command, click.Group) and command.get_command(context, name), group


# -- the HTTP API (api.yaml) ----------------------------------------------------------------


def api_pod() -> dict[str, Any]:
    return the("Deployment", API)["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def api_container() -> dict[str, Any]:
    (container,) = api_pod()["containers"]
    return container  # type: ignore[no-any-return]


def http_port(container: dict[str, Any]) -> int:
    (port,) = [port for port in container["ports"] if port["name"] == "http"]
    return int(port["containerPort"])


def test_the_api_runs_memproj_serve_beyond_loopback_on_the_configured_port() -> None:
    container = api_container()
    assert container["command"] == ["memproj", "serve"]
    assert cli.get_command(click.Context(cli), "serve") is not None
    # From the ConfigMap, as every setting: serve reads MEMPROJ_API_HOST and _PORT.
    assert "env" not in container
    assert CONFIG["MEMPROJ_API_HOST"] == "0.0.0.0"
    port = int(CONFIG["MEMPROJ_API_PORT"])
    assert http_port(container) == port
    template = the("Deployment", API)["spec"]["template"]
    assert template["metadata"]["labels"]["app.kubernetes.io/component"] == "api"
    # The API serves its own /metrics on its port (the same pod-role scrape as the workers).
    assert template["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": "/metrics",
    }


def test_the_api_probes_its_own_health_routes() -> None:
    container = api_container()
    routes = {
        getattr(route, "path", None) for route in create_app(build_services(Settings())).routes
    }
    for probe, path in [
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ]:
        assert container[probe]["httpGet"]["path"] == path, probe
        assert probe_port(container, probe) == http_port(container), probe
        assert path in routes
    assert "/metrics" in routes


def test_the_api_has_replicas_that_roll_over_and_drain_one_at_a_time() -> None:
    spec = the("Deployment", API)["spec"]
    assert spec["replicas"] >= 2
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    budget = the("PodDisruptionBudget", API)["spec"]
    assert budget["selector"] == spec["selector"]
    # A drain may evict, and one replica always keeps serving.
    assert 1 <= budget["maxUnavailable"] < spec["replicas"]


def test_replicas_of_the_api_share_the_rate_limit_in_redis() -> None:
    assert CONFIG["MEMPROJ_API_RATE_LIMIT_STORAGE"] == "redis"
    assert "MEMPROJ_REDIS_URL" in CONFIG
    # A value the limits library parses (as the API does at start).
    services = build_services(
        Settings(api_rate_limit=CONFIG["MEMPROJ_API_RATE_LIMIT"], api_rate_limit_storage="memory")
    )
    assert services.rate_limit is not None


def test_the_service_sends_its_port_to_the_api_pods() -> None:
    service = the("Service", API)["spec"]
    assert service["type"] == "ClusterIP"
    assert service["selector"] == the("Deployment", API)["spec"]["selector"]["matchLabels"]
    (port,) = service["ports"]
    named = {p["name"]: p["containerPort"] for p in api_container()["ports"]}
    assert named[port["targetPort"]] == int(CONFIG["MEMPROJ_API_PORT"])
    services = [doc["metadata"]["name"] for doc in ALL if doc["kind"] == "Service"]
    assert services == [API]


def test_the_api_grace_period_outlasts_its_longest_request() -> None:
    pod = api_pod()
    stop_delay = api_container()["lifecycle"]["preStop"]["sleep"]["seconds"]
    default = Settings.model_fields["api_delivery_timeout_seconds"].default
    delivery = float(CONFIG.get("MEMPROJ_API_DELIVERY_TIMEOUT_SECONDS", default))
    assert pod["terminationGracePeriodSeconds"] > stop_delay + delivery
