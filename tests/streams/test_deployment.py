"""The deployment files memproj writes from its registries (``memproj deploy``): what is
committed is what the generators write, so that CI fails on a file edited by hand or a
registry changed without running the command again."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from streams.cli import cli
from streams.deployment.compose import (
    WORKER_SERVICES,
    MissingBlock,
    compose_file,
    replace_block,
)
from streams.deployment.kubernetes import WORKERS_DIRECTORY, kubernetes_files
from streams.deployment.settings_reference import (
    DOCUMENT,
    default_of,
    groups,
    settings_reference,
)
from streams.settings import DEVELOPMENT_MASTER_KEY, SETTING_GROUPS, Settings
from streams.worker import WORKERS

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "ops" / "k8s"
COMPOSE = REPO / "docker-compose.yml"


def test_the_committed_kubernetes_manifests_are_the_registrys() -> None:
    for name, text in kubernetes_files().items():
        assert (K8S / name).read_text() == text, (
            f"ops/k8s/{name} is stale: run memproj deploy k8s --out ops/k8s"
        )
    committed = {f"{WORKERS_DIRECTORY}/{p.name}" for p in (K8S / WORKERS_DIRECTORY).iterdir()}
    assert committed == {name for name in kubernetes_files() if name != "kustomization.yaml"}


def test_the_committed_compose_file_is_the_registrys() -> None:
    text = COMPOSE.read_text()
    assert compose_file(text) == text, "docker-compose.yml is stale: run memproj deploy compose"


def test_the_committed_settings_reference_is_the_settings() -> None:
    assert (REPO / DOCUMENT).read_text() == settings_reference(), (
        "docs/settings.md is stale: run memproj deploy settings-doc"
    )


def test_every_setting_is_in_one_group_in_declaration_order() -> None:
    assert set(SETTING_GROUPS) <= set(Settings.model_fields)
    assert next(iter(Settings.model_fields)) in SETTING_GROUPS
    found = groups()
    assert list(found) == list(SETTING_GROUPS.values())
    assert [name for names in found.values() for name in names] == list(Settings.model_fields)
    page = settings_reference()
    for name in Settings.model_fields:
        assert page.count(f"| `MEMPROJ_{name.upper()}` |") == 1, name


def test_defaults_are_shown_as_a_user_sets_them_and_secrets_not_at_all() -> None:
    fields = Settings.model_fields
    assert default_of("master_key", fields["master_key"].default) == "*(a secret: not shown)*"
    assert DEVELOPMENT_MASTER_KEY not in settings_reference()
    assert default_of("kafka_check_hostname", True) == "`true`"
    assert default_of("rebuild_grace_seconds", 604800.0) == "`604800` (7 d)"
    assert default_of("batch_max_bytes", 32 * 2**20) == "`33554432` (32 MiB)"
    assert default_of("topic_prefix", "") == "*(empty)*"
    assert default_of("kafka_username", None) == "*(unset)*"
    # A bound is part of the description.
    assert "(at least 1024) |" in settings_reference()


def test_the_commands_write_what_the_tests_compare(tmp_path: Path) -> None:
    runner = CliRunner()
    stale = tmp_path / "k8s" / WORKERS_DIRECTORY / "sealer.yaml"
    stale.parent.mkdir(parents=True)
    stale.write_text("a kind that is gone")
    result = runner.invoke(cli, ["deploy", "k8s", "--out", str(tmp_path / "k8s")])
    assert result.exit_code == 0, result.output
    assert not stale.exists()
    for name, text in kubernetes_files().items():
        assert (tmp_path / "k8s" / name).read_text() == text
    compose = tmp_path / "docker-compose.yml"
    compose.write_text(COMPOSE.read_text().replace("memproj-memory", "memproj-old"))
    result = runner.invoke(cli, ["deploy", "compose", "--file", str(compose)])
    assert result.exit_code == 0, result.output
    assert compose.read_text() == COMPOSE.read_text()
    page = tmp_path / "docs" / "settings.md"
    result = runner.invoke(cli, ["deploy", "settings-doc", "--out", str(page)])
    assert result.exit_code == 0, result.output
    assert page.read_text() == settings_reference()


def test_a_compose_file_without_the_markers_is_refused_not_guessed(tmp_path: Path) -> None:
    with pytest.raises(MissingBlock, match="BEGIN worker services"):
        replace_block("services:\n  api:\n    image: x\n", WORKER_SERVICES, "")
    broken = tmp_path / "docker-compose.yml"
    broken.write_text("services: {}\n")
    result = CliRunner().invoke(cli, ["deploy", "compose", "--file", str(broken)])
    assert result.exit_code != 0 and "BEGIN worker services" in result.output
    assert broken.read_text() == "services: {}\n"


def test_the_compose_block_holds_exactly_the_worker_services() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    workers = {name for name in services if name.startswith("memproj-")} - {
        "memproj-init",
        "memproj-api",
        "memproj-cli",
    }
    assert workers == {f"memproj-{kind}" for kind in WORKERS.kinds}


def test_the_demo_starts_every_kind_of_the_registry_on_its_port() -> None:
    listed = CliRunner().invoke(cli, ["deploy", "kinds"])
    assert listed.exit_code == 0
    assert [line.split() for line in listed.output.splitlines()] == [
        [kind, str(port)] for kind, port in WORKERS.metrics_ports.items()
    ]
    demo = (REPO / "ops" / "demo").read_text()
    assert "$memproj deploy kinds" in demo
    # No kind or port of its own: a kind added to the registry is started too.
    for kind, port in WORKERS.metrics_ports.items():
        assert f"start_worker {kind}" not in demo and str(port) not in demo, kind
