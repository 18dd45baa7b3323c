"""The README links the settings reference and documents every topic of the registry."""

from __future__ import annotations

from pathlib import Path

from streams.settings import Settings
from topics.registry import ALL_TOPICS, DLQ_SUFFIX

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_the_configuration_links_the_settings_reference() -> None:
    # The reference documents every setting (tests/streams/test_deployment.py keeps it the
    # settings' own); the README names the few most deployments set.
    assert "[settings reference](docs/settings.md)" in README
    named = [name for name in Settings.model_fields if f"`MEMPROJ_{name.upper()}`" in README]
    assert {"kafka_bootstrap", "postgres_dsn", "master_key_file"} <= set(named)


def test_every_topic_is_documented() -> None:
    for spec in ALL_TOPICS:
        if spec.base_name.endswith(DLQ_SUFFIX):
            continue
        assert f"| `{spec.base_name}` | `{spec.key}` | {spec.partitions} |" in README, spec
    assert "`<input topic>.dlq`" in README
