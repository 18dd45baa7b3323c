"""The README links the settings reference, documents every topic of the registry, and states
the deletion milestones' bounds as the code sets them."""

from __future__ import annotations

from pathlib import Path

from projections.stores import STORES
from streams.compaction import compaction_bound_ms
from streams.settings import Settings
from topics.registry import ALL_TOPICS, COMPACTION_MAX_LAG_MS, COMPACTION_SEGMENT_MS, DLQ_SUFFIX

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


def test_the_deletion_milestones_state_the_codes_bounds() -> None:
    # The guarantees section states each milestone's bound with its defaults: they are the
    # settings', the store registry's and the compaction bound's (streams.compaction).
    defaults = Settings.model_fields
    deadline = defaults["deletion_deadline_seconds"].default
    redelivery = defaults["deletion_redelivery_seconds"].default
    purge_round = defaults["deletion_purge_check_seconds"].default
    trim = defaults["raw_input_trim_seconds"].default
    roll_check = defaults["compaction_roll_check_seconds"].default
    assert f"`MEMPROJ_DELETION_DEADLINE_SECONDS` (default {deadline:.0f} s" in README
    assert f"`MEMPROJ_DELETION_REDELIVERY_SECONDS` (default {redelivery:.0f} s)" in README
    assert f"`MEMPROJ_DELETION_PURGE_CHECK_SECONDS`, default {purge_round:.0f} s" in README
    assert f"`MEMPROJ_RAW_INPUT_TRIM_SECONDS` ({trim:.0f} s)" in README
    assert f"(`MEMPROJ_COMPACTION_ROLL_CHECK_SECONDS`, {roll_check:.0f} s)" in README
    bound_ms = compaction_bound_ms(
        COMPACTION_SEGMENT_MS, COMPACTION_MAX_LAG_MS, int(roll_check * 1000)
    )
    assert f"`memory.current`'s compaction, about {round(bound_ms / 60_000)} min" in README
    assert f"{COMPACTION_SEGMENT_MS // 60_000} min, with\n    `max.compaction.lag.ms` " in README
    # Both places that state the stores' SLOs (the alerts, the completed milestone) say this.
    stated = "embeddings 15 min, summaries and context 10 min, cache 5 min"
    assert " ".join(README.split()).count(stated) == 2
    slos = {store.name: store.deletion_slo_seconds // 60 for store in STORES}
    assert slos == {"embeddings": 15, "summaries": 10, "context": 10, "cache": 5}, stated
