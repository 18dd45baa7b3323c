"""The benchmark's own arithmetic (ops/bench): percentiles, pauses, the versions freshness
waits for, peak RSS and the discovery of the stack's processes. No services needed, except
by the paced producer's test (integration)."""

from __future__ import annotations

import math
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from projections.deletion import probes as deletion_probes
from streams.progress import end_offsets
from streams.sample import sample_memory_stream
from streams.settings import Settings
from streams.worker import WORKER_KINDS
from topics.registry import MEMORY_EVENTS

# The benchmark's modules import each other as scripts do, from their own directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ops" / "bench"))

import capacity_inputs
import cpu_time
import environment
import erasure_load
import freshness
import governed_stream
import governed_writes
import http_api
import phases
import pipeline
import projection
import rss
import scale_out
import store_memory
import tenant_lookups


def test_percentiles_are_nearest_rank() -> None:
    values = [float(n) for n in range(100, 0, -1)]
    assert environment.percentile(values, 0.50) == 50.0
    assert environment.percentile(values, 0.99) == 99.0
    assert environment.percentile([7.0], 0.99) == 7.0
    assert math.isnan(environment.percentile([], 0.5))


def test_the_longest_stall_counts_the_window_edges() -> None:
    assert scale_out.longest_stall([1.0, 2.0, 5.0], 0.0, 6.0) == 3.0
    assert scale_out.longest_stall([1.0, 2.0, 5.0], 1.5, 2.5) == 0.5
    assert scale_out.longest_stall([], 10.0, 14.0) == 4.0


def test_progress_advances_per_partition_and_in_total() -> None:
    sampler = scale_out.ProgressSampler(Settings())
    sampler.samples = [
        (0.0, {0: 10, 1: 10}),
        (1.0, {0: 12, 1: 10}),
        (2.0, {0: 12, 1: 10}),
        (3.0, {0: 12, 1: 15}),
    ]
    total, partitions = sampler.advances()
    assert total == [0.0, 1.0, 3.0]
    assert partitions == {0: [0.0, 1.0], 1: [0.0, 3.0]}


def test_freshness_waits_for_the_versions_events_make() -> None:
    stream = list(sample_memory_stream(300, 4, seed=11))
    made = freshness.versions_made(stream)
    assert made
    for index in made:
        assert stream[index].expectation == "applied"
    latest: dict[tuple[str, str], int] = {}
    for index in sorted(made):
        tenant, memory, version = made[index]
        assert version > latest.get((tenant, memory), 0)
        latest[(tenant, memory)] = version


class UnsupportedCodecError(Exception):
    """As aiokafka raises it for lz4 batches without its compression extra."""


NO_LZ4 = "Libraries for lz4 compression codec not found"


def test_a_failing_phase_is_reported_and_every_other_phases_figures_are_printed_and_saved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def faust_without_lz4() -> dict[str, float]:
        raise UnsupportedCodecError(NO_LZ4)

    cpu = {"memory workers": 120.0, "postgres backends": 50.0}
    run = phases.Phases()
    figures: dict[str, Any] = {}

    def phase(name: str, measure: Any, needs: tuple[str, ...] = ()) -> None:
        found = run.run(name, measure, needs)
        if found is not None:
            figures[name] = found

    phase(projection.BARE_UPSERT_FIRST, lambda: {"seconds": 1.0, "cpu_us_per_event": cpu})
    phase(projection.LIVE_APPLY, lambda: {"seconds": 2.0, "cpu_us_per_event": cpu})
    phase(projection.RAW_CONSUME, lambda: {"seconds": 0.01})
    phase(projection.FAUST_NOOP, faust_without_lz4)
    phase("after it", lambda: {"figure": 1}, needs=(projection.FAUST_NOOP,))
    phase(projection.BARE_UPSERT_LAST, lambda: {"seconds": 1.0, "cpu_us_per_event": cpu})
    assert run.failed == {
        projection.FAUST_NOOP: f"UnsupportedCodecError: {NO_LZ4}",
        "after it": f"not run: {projection.FAUST_NOOP} failed",
    }
    assert "UnsupportedCodecError" in capsys.readouterr().err  # its traceback, as it happened

    result = projection.summary(figures, run.failed, 2001, 1000, 1, {"memory": 120.0}, [])
    saved = orjson.loads(projection.save(result, tmp_path).read_text())
    projection.report(result, 1000)
    printed = capsys.readouterr().out

    assert saved["projection_apply_events_per_s"] == 1000
    assert saved["bare_upsert_events_per_s"] == 2001
    assert saved["apply_vs_bare_upsert"] == 0.5 and saved["apply_vs_raw_consume"] == 0.005
    assert "faust_noop_agent_events_per_s" not in saved and "apply_vs_faust_noop" not in saved
    assert saved["failed_phases"] == run.failed
    assert saved["targets"]["live apply >= 0.5x bare upsert"] is True
    assert saved["targets"]["rebuild >= 2x live apply"] is None
    assert "projection apply (pipeline)" in printed and "1,000 events/s" in printed
    assert "raw confluent-kafka consume" in printed
    assert not [line for line in printed.splitlines() if "faust" in line and "events/s" in line]
    assert "FAILED phases" in printed
    assert f"UnsupportedCodecError: {NO_LZ4}" in printed


def test_peak_rss_is_read_per_kind() -> None:
    peaks = rss.PeakRss(interval_seconds=60)
    peaks.watch(os.getpid(), "this test")
    peaks.watch(2**22 + 12345, "gone")  # no such process: no figure, no error
    peaks.close()
    measured = peaks.by_kind()
    assert list(measured) == ["this test"]
    assert measured["this test"] > 0


def test_the_listening_process_is_found_by_port() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert cpu_time.listening_pid(listener.getsockname()[1]) == os.getpid()


def test_cpu_totals_add_every_process() -> None:
    assert cpu_time.total({"worker": 10.25, cpu_time.BROKER: 2.5, cpu_time.THIS_PROCESS: 1}) == (
        13.8
    )


def test_erasure_cpu_is_what_the_workers_spend_beyond_idle() -> None:
    busy = {"deletion worker(s)": 2.5, cpu_time.BROKER: 0.5, cpu_time.THIS_PROCESS: 0.1}
    idle = {"deletion worker(s)": 0.5, cpu_time.BROKER: 0.75}
    assert capacity_inputs.beyond_idle(busy, idle) == {
        "deletion worker(s)": 2.0,
        cpu_time.BROKER: 0.0,
        cpu_time.THIS_PROCESS: 0.1,
    }


def test_the_benchmark_starts_only_real_worker_kinds() -> None:
    # one hop (ops/decisions/one-hop.md): the memory workers seal, there is no sealer kind
    assert pipeline.pipeline_kinds(2) == ["memory", "memory"]
    started = {
        *pipeline.pipeline_kinds(1),
        *erasure_load.STORE_WORKERS,
        "monitor",
        "conversation",  # capacity_inputs.py's conversation stage
    }
    assert started <= set(WORKER_KINDS)


def test_the_api_bench_asks_about_every_subject_once_per_phase() -> None:
    subjects = {
        orjson.loads(value)["payload"]["subject"]["id"]
        for _, value in http_api.memory_events(400, 8, seed=1)
    }
    assert len(subjects) == 8
    recall, cached, search = http_api.phases(8, recall_rate=4, search_rate=2, seconds=2, seed=1)
    assert [phase.rate for phase in (recall, cached, search)] == [4, 4, 2]
    assert cached.paths == recall.paths
    assert sorted(path for path, _ in recall.paths) == sorted(
        f"/v1/subjects/user/{s}/memories" for s in subjects
    )
    assert len({path for path, _ in search.paths}) == len(search.paths) == 4
    assert all(query["text"] and query["purpose"] for _, query in search.paths)


@pytest.mark.integration
def test_the_paced_producer_is_connected_before_its_pace_starts(env: Any) -> None:
    messages = [(f"k{n}".encode(), b"v") for n in range(3)]
    producer = environment.PacedProducer(env.settings, messages, rate=1e-6)  # one per ~11 days
    producer.start()
    # The warm-up is delivered when start returns: no sampled message waits for the client's
    # connection and producer id (freshness skips the warm-up's indexes).
    assert producer.sent == environment.PacedProducer.WARM_UP == 1
    delivered = end_offsets(env.settings.kafka_bootstrap, env.topic(MEMORY_EVENTS))
    assert sum(delivered.values()) == 1
    producer.stop()
    assert producer.sent == 1


# LanceDB on disk, a real backend: seconds of building and copying stores.
@pytest.mark.integration
def test_the_store_memory_scenarios_run_on_a_small_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each kind's part, in this process, on a store where every erased subject has entries:
    the audit finds their ghosts, the verification finds nothing once they are erased."""
    monkeypatch.setattr(deletion_probes, "load_probes", deletion_probes.load_probes)
    store = tmp_path / "store"
    store_memory.build(store, 400)
    shutil.copytree(store, tmp_path / "erased")
    store_memory.erase_subjects(tmp_path / "erased")
    for kind in store_memory.KINDS:
        copy = tmp_path / kind
        shutil.copytree(tmp_path / "erased" if kind == "deletion" else store, copy)
        result = store_memory.run_kind(kind, copy, store)
        assert result["kind"] == kind and result["peak_mb"] >= result["opened_mb"] > 0
        if kind == "monitor":
            assert result["ghosts"] > 0
        elif kind == "deletion":
            assert result["probes"] > 0 and result["reachable"] == 0


def test_governed_writes_proposals_cite_their_tenants_evidence_and_one_kind_in_ten() -> None:
    conversations = governed_stream.conversation_stream(per_tenant=5)
    assert conversations.message_count == 2 * governed_stream.TENANTS * 5
    stream = [(m.key, m.value) for m in sample_memory_stream(600, governed_stream.TENANTS, 3)]
    rewritten = governed_stream.citing_evidence(stream, conversations.evidence)
    assert len(rewritten) == len(stream)
    kinds: list[str] = []
    missing = 0
    for (key, before), (same_key, after) in zip(stream, rewritten, strict=True):
        assert key == same_key
        try:
            event = orjson.loads(after or b"")
        except orjson.JSONDecodeError:
            assert before == after
            continue
        if event["event_type"] != "memory.proposed" or "memory_id" not in event["payload"]:
            assert before == after
            continue
        kinds.append(event["payload"]["kind"])
        (cited,) = event["payload"]["evidence_event_ids"]
        if cited.startswith("never-sent-"):
            missing += 1
        else:
            assert cited in conversations.evidence[event["tenant_id"]]
    reviewed = kinds.count(governed_stream.REVIEWED_KIND) / len(kinds)
    assert set(kinds) == set(governed_stream.KINDS)
    assert 0.05 < reviewed < 0.15
    assert 0 < missing < len(kinds) / 20
    # A redelivered duplicate is rewritten as its original was: still a duplicate.
    assert governed_stream.citing_evidence(stream, conversations.evidence) == rewritten
    policy = governed_stream.governing_policy().policy("tenant_0", 1)
    assert all(rule.evidence_required for rule in policy.rules)
    assert [r.kind for r in policy.rules if r.decision == "review"] == ["kind_0"]


def test_governed_writes_summary_compares_the_sides_means() -> None:
    def round_of(side: str, rate: float, worker: float, held: int) -> dict[str, Any]:
        decisions = governed_writes.decision_counts(
            {False: 90, True: held}, {"evidence_unavailable": held // 10, "version_conflict": 4}
        )
        cpu = {pipeline.MEMORY_WORKERS: worker, cpu_time.POSTGRES_BACKENDS: 100.0}
        return {"side": side, "events_per_s": rate, "cpu_us_per_event": cpu, "decisions": decisions}

    a, b = governed_writes.NO_POLICY, governed_writes.GOVERNED
    rounds = [round_of(a, 1000, 300, 0), round_of(b, 800, 360, 10), round_of(a, 1200, 300, 0)]
    rounds.append(round_of(b, 1000, 380, 10))
    result = governed_writes.summary(rounds, 2000)
    assert result["sides"][a]["events_per_s"] == 1100
    assert result["sides"][b]["events_per_s"] == 900
    assert result["b_over_a"]["events_per_s"] == round(900 / 1100, 3)
    assert result["b_over_a"]["cpu_worker"] == 1.233
    assert result["b_over_a"]["cpu_postgres_backends"] == 1.0
    assert result["sides"][b]["decisions_per_round"]["held_for_review"] == 10
    assert result["sides"][b]["decisions_per_round"]["refused_by_policy"] == 1
    assert result["sides"][a]["decisions_per_round"]["other_refusals"] == 4
    lines = governed_writes.table(result)
    assert lines[0] == f"|  | {a} | {b} | b/a |"
    assert "| 1,100 (1,000, 1,200) | 900 (800, 1,000) | 0.82 |" in lines[2]


def test_tenant_lookups_summary_compares_the_modes_and_their_projections() -> None:
    def round_of(side: str, rate: float, worker: float, checksum: str) -> dict[str, Any]:
        cpu = {pipeline.MEMORY_WORKERS: worker, cpu_time.POSTGRES_BACKENDS: 100.0}
        return {"side": side, "events_per_s": rate, "cpu_us_per_event": cpu, "checksum": checksum}

    off, on = tenant_lookups.OFF, tenant_lookups.ON
    rounds = [round_of(off, 1000, 300, "x"), round_of(on, 800, 400, "x")]
    rounds += [round_of(off, 1200, 300, "x"), round_of(on, 1000, 380, "x")]
    result = tenant_lookups.summary(rounds)
    assert result["on_over_off"]["events_per_s"] == round(900 / 1100, 3)
    assert result["on_over_off"]["cpu_worker"] == 1.3
    assert result["same_projection"]
    lines = tenant_lookups.table({100: result})
    assert "| 100 | 1,100 (1,000, 1,200) | 900 (800, 1,000) | 0.82 | 300 → 390 |" in lines[2]
    assert lines[2].endswith("| yes |")
    assert not tenant_lookups.summary([*rounds, round_of(on, 900, 390, "y")])["same_projection"]
