"""Two replicas of every worker kind give the result of one: the same mixed stream (memories,
conversations, erasures of subjects, memories and conversations, tombstones to every store),
applied once by one worker of each kind and once by two of each with one of every pair
SIGKILLed mid-stream (the leader, where the kind has duties that run once), ends with the same
projections, deletion outcomes and acknowledgements; the survivors take the duties over."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest

from projections.embeddings.vectors import Match
from projections.shadow import SPECS
from projections.shadow import checksums as table_checksums
from projections.stores import STORES
from streams.sample import EventFactory
from streams.settings import Settings
from support.deletion_scenario import recent_factory, vectors
from support.environment import Env, isolated_env, stop_all
from support.ports import free_port
from support.probes import metric_sample, metric_total, probe
from topics.registry import (
    CONVERSATION_EVENTS,
    DELETION_ACKS,
    DELETION_REQUESTS,
    MEMORY_EVENTS,
)
from topics.schemas import RawEvent

pytestmark = pytest.mark.integration

KINDS = ("memory", "conversation", "deletion", *STORES.names, "monitor")
# The kinds whose duties run once: their victim is the replica that leads them.
LEASES = {"deletion": "deletion-maintenance", "monitor": "monitor"}
SUBJECTS_PER_PHASE, ERASED_PER_PHASE = 16, 6
TENANT = "acme"
OPTIONS: dict[str, Any] = {
    "batch_max_events": 8,  # small batches: a SIGKILL lands within some
    "monitor_interval_seconds": 0.5,
    "audit_interval_seconds": 1.0,
    "deletion_redelivery_seconds": 5.0,
}


def subject_of(phase: int, index: int) -> tuple[str, str]:
    return ("user", f"u{phase}_{index}")


def phase_events(f: EventFactory, phase: int) -> tuple[list[RawEvent], list[RawEvent]]:
    """Each subject: two memories (one learned in its conversation) and a conversation with
    two messages and a summary; the phase's first subject's second memory is revoked."""
    memories, conversations = [], []
    for index in range(SUBJECTS_PER_PHASE):
        subject = subject_of(phase, index)
        conversation = f"c{phase}_{index}"
        conversations += [
            f.started(TENANT, conversation, subject),
            f.message(TENANT, conversation, "m1", "user", f"hello from {subject[1]}"),
            f.message(TENANT, conversation, "m2", "assistant", "hello"),
            f.summary(TENANT, conversation, 1, f"{subject[1]} said hello", ["m1", "m2"]),
        ]
        memories += [
            f.proposed(TENANT, f"m{phase}_{index}_0", subject, {"text": f"fact of {subject[1]}"}),
            f.proposed(
                TENANT,
                f"m{phase}_{index}_1",
                subject,
                {"text": f"what {subject[1]} said"},
                source=("message", f"{conversation}/m1"),
            ),
        ]
    memories.append(f.revoked(TENANT, f"m{phase}_0_1", "no longer true"))
    return memories, conversations


def phase_erasures(f: EventFactory, phase: int) -> list[RawEvent]:
    """Subjects erased whole, a kept subject's memory, a kept subject's conversation."""
    erasures = [
        f.deletion(TENANT, f"d{phase}_{index}", {"type": "subject", "id": name, "subject_type": k})
        for index in range(1, ERASED_PER_PHASE + 1)
        for k, name in [subject_of(phase, index)]
    ]
    kept = SUBJECTS_PER_PHASE - 1
    erasures.append(
        f.deletion(TENANT, f"dm{phase}", {"type": "memory", "id": f"m{phase}_{kept}_0"})
    )
    erasures.append(
        f.deletion(TENANT, f"dc{phase}", {"type": "conversation", "id": f"c{phase}_{kept}"})
    )
    return erasures


def stream() -> list[tuple[list[RawEvent], list[RawEvent], list[RawEvent]]]:
    """The two phases of the stream, the same bytes for both runs: each phase's memories and
    conversations, and the erasures of some of them (``produce`` sends a phase's erasures with
    the next phase's data, once what they erase is applied: an erasure racing its target's
    own events is not what this test is about)."""
    f = recent_factory()
    phases = []
    for phase in range(2):
        memories, conversations = phase_events(f, phase)
        phases.append((memories, conversations, phase_erasures(f, phase)))
    return phases


Phase = tuple[list[RawEvent], list[RawEvent], list[RawEvent]]


def produce(env: Env, data: Phase | None, erasures: Phase | None) -> None:
    """``data``'s memories and conversations, with the erasures of ``erasures`` between them."""
    if data is not None:
        memories, conversations, _ = data
        env.produce_events(conversations, CONVERSATION_EVENTS)
    if erasures is not None:
        env.produce_events(erasures[2], DELETION_REQUESTS)
    if data is not None:
        env.produce_events(memories, MEMORY_EVENTS)


def requested(phases: list[Any]) -> set[str]:
    return {event["payload"]["deletion_id"] for phase in phases for event in phase[2]}


def ledger_outcome(env: Env) -> dict[str, tuple[str, bool | None, frozenset[str]]]:
    """Per deletion: its status, whether its verification found nothing (None: not verified
    yet), and the stores that acknowledged it done."""
    with env.connect() as conn:
        rows = conn.execute(
            "SELECT r.deletion_id, r.status, (r.verification->>'clean')::boolean,"
            " array_agg(a.store ORDER BY a.store) FILTER (WHERE a.status = 'done')"
            " FROM deletion_requests r LEFT JOIN deletion_store_acks a"
            " USING (tenant_id, deletion_id) GROUP BY 1, 2, 3"
        ).fetchall()
    return {row[0]: (row[1], row[2], frozenset(row[3] or ())) for row in rows}


def settled(env: Env, deletions: set[str]) -> dict[str, tuple[str, bool | None, frozenset[str]]]:
    """Once every requested deletion is completed and verified (the revocations' too)."""
    last: list[Any] = []

    def done() -> dict[str, Any] | None:
        outcome = ledger_outcome(env)
        last[:] = [outcome]
        finished = {
            d
            for d, (status, clean, _) in outcome.items()
            if status == "completed" and clean is not None
        }
        return outcome if deletions <= set(outcome) and set(outcome) == finished else None

    try:
        outcome: dict[str, tuple[str, bool | None, frozenset[str]]] = env.wait_until(
            done, "every deletion completed and verified", 180
        )
    except AssertionError:
        print("ledger when it timed out:", last)
        raise
    return outcome


def caught_up(env: Env) -> None:
    env.wait_caught_up(CONVERSATION_EVENTS, "conversation", 150)
    env.wait_caught_up(MEMORY_EVENTS, "memory", 150)


def acknowledged(env: Env) -> set[tuple[str, str, str]]:
    """Every acknowledgement on deletion.acks, once each (a SIGKILLed store may send one
    again: its offset was not committed)."""
    return {
        (value["deletion_id"], value["store"], value["status"])
        for _, value in env.read(DELETION_ACKS)
        if value
    }


def conversation_checksums(env: Env) -> Any:
    async def compute() -> Any:
        async with await psycopg.AsyncConnection.connect(env.settings.postgres_conninfo) as conn:
            return await table_checksums(conn, SPECS["conversation"])

    return asyncio.run(compute())


def outcome_of(env: Env, phases: list[Any]) -> dict[str, Any]:
    caught_up(env)
    ledger = settled(env, requested(phases))
    # Deletions are completed; what each store was sent is acknowledged by now.
    env.wait_until(
        lambda: (
            {(d, s) for d, s, status in acknowledged(env) if status == "done"}
            >= {(d, s) for d, (_, _, stores) in ledger.items() for s in stores}
            or None
        ),
        "every acknowledgement on deletion.acks",
    )
    # Every memory and conversation of the stream, erased or kept (a match needs criteria).
    everything = Match(
        tenant_id=TENANT,
        memory_ids=tuple(sorted({e["payload"]["memory_id"] for p in phases for e in p[0]})),
        conversation_ids=tuple(
            sorted({e["payload"]["conversation_id"] for p in phases for e in p[1]})
        ),
    )
    indexed = vectors(env).find(everything)
    return {
        "memories": env.checksums(),
        "conversations": conversation_checksums(env),
        "ledger": ledger,
        "acks": acknowledged(env),
        "vectors": sorted(entry.id for entry in indexed),
    }


def leader_of(ports: list[int], duty: str) -> int | None:
    """Which of the replicas (by metrics port) leads ``duty``."""
    leading = [
        i
        for i, port in enumerate(ports)
        if metric_total(port, "memproj_duty_leader", duty=duty) == 1
    ]
    return leading[0] if len(leading) == 1 else None


def led(ports: list[int], duty: str) -> bool | None:
    return True if leader_of(ports, duty) is not None else None


def healthy(port: int) -> bool | None:
    answer = probe(port, "/healthz")
    return True if answer is not None and answer[0] == 200 else None


def no_ghosts(port: int, store: str) -> bool | None:
    """The monitor's ghost audit reported ``store``, and found nothing."""
    reported = metric_sample(port, "memproj_ghost_items", store=store)
    return (
        True if reported and metric_total(port, "memproj_ghost_items", store=store) == 0 else None
    )


def start(env: Env, replicas: int) -> dict[str, list[tuple[Any, int]]]:
    started: dict[str, list[tuple[Any, int]]] = {}
    for kind in KINDS:
        started[kind] = []
        for _ in range(replicas):
            port = free_port()
            started[kind].append((env.worker(kind, metrics_port=port, **OPTIONS), port))
    for kind, workers in started.items():
        for _, port in workers:
            env.wait_until(
                partial(healthy, port),
                f"{kind} answering /healthz",
                # Sixteen Python processes importing at once on two cores.
                300,
            )
    return started


@pytest.fixture
def two_envs(stack: Settings, tmp_path: Path) -> Iterator[tuple[Env, Env]]:
    with ExitStack() as envs:
        single = envs.enter_context(isolated_env(stack, _directory(tmp_path / "single")))
        replicated = envs.enter_context(isolated_env(stack, _directory(tmp_path / "replicas")))
        yield single, replicated


def _directory(path: Path) -> Path:
    path.mkdir()
    return path


def test_two_replicas_of_every_kind_with_one_killed_end_as_one(
    two_envs: tuple[Env, Env],
) -> None:
    single, replicated = two_envs
    phases = stream()
    started = time.monotonic()

    # One worker of each kind: the reference.
    workers = start(single, 1)
    produce(single, phases[0], None)
    caught_up(single)
    produce(single, phases[1], phases[0])
    caught_up(single)
    produce(single, None, phases[1])
    expected = outcome_of(single, phases)
    stop_all(worker for pair in workers.values() for worker, _ in pair)
    reference_seconds = time.monotonic() - started

    # Two of each; one of each pair SIGKILLed while the second phase is applied.
    pairs = start(replicated, 2)
    produce(replicated, phases[0], None)
    caught_up(replicated)
    for kind, duty in LEASES.items():
        ports = [port for _, port in pairs[kind]]
        replicated.wait_until(partial(led, ports, duty), f"a {kind} leader")
    produce(replicated, phases[1], phases[0])
    replicated.wait_until(
        lambda: len(ledger_outcome(replicated)) > 1 or None, "the first erasures arriving"
    )
    survivors: dict[str, tuple[Any, int]] = {}
    for kind, pair in pairs.items():
        victim = 0
        if kind in LEASES:
            victim = leader_of([port for _, port in pair], LEASES[kind]) or 0
        pair[victim][0].kill()
        survivors[kind] = pair[1 - victim]
    killed_at = time.monotonic()
    caught_up(replicated)
    produce(replicated, None, phases[1])

    assert outcome_of(replicated, phases) == expected
    # The survivors took the duties over: the deletion worker's verification (above), and the
    # monitor's gauges, the ghost audit finding nothing in any store.
    for kind, duty in LEASES.items():
        _, port = survivors[kind]
        replicated.wait_until(partial(led, [port], duty), f"the surviving {kind} leading")
    _, monitor_port = survivors["monitor"]
    for store in STORES.names:
        replicated.wait_until(
            partial(no_ghosts, monitor_port, store),
            f"no ghosts in {store}",
        )
    for kind, (worker, _) in survivors.items():
        assert worker.alive(), f"{kind}\n{worker.log_tail()}"
    # What was kept is there: the runs compared are not empty.
    assert sum(c.memories for c in expected["memories"].values()) > 0
    assert expected["vectors"]
    print(
        f"reference run {reference_seconds:.0f} s; two replicas settled"
        f" {time.monotonic() - killed_at:.0f} s after the kills"
    )
