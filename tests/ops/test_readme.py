"""The README documents every setting and every topic of the registry."""

from __future__ import annotations

from pathlib import Path

from streams.settings import Settings
from topics.registry import ALL_TOPICS, DLQ_SUFFIX

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_setting_is_documented() -> None:
    missing = [
        f"MEMPROJ_{name.upper()}"
        for name in Settings.model_fields
        if f"`MEMPROJ_{name.upper()}`" not in README
    ]
    assert not missing, f"README lacks {missing}"


def test_every_topic_is_documented() -> None:
    for spec in ALL_TOPICS:
        if spec.base_name.endswith(DLQ_SUFFIX):
            continue
        assert f"| `{spec.base_name}` | `{spec.key}` | {spec.partitions} |" in README, spec
    assert "`<input topic>.dlq`" in README
