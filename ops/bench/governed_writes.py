"""What governed writes cost: the memory stage's live apply rate and CPU per event with an
admission policy, side by side with no policy, in one run.

    .venv/bin/python ops/bench/governed_writes.py [--memories 3000] [--pairs 2]

The stream (governed_stream.py) is the sample memory stream (streams/sample.py) of two
tenants, its proposals rewritten to cite evidence: each cites a user message of its tenant's
conversations, which the conversation worker applies first (untimed), as producers are asked
to send evidence before the memory citing it; one memory in fifty cites a message that was
never sent. Each proposal's kind is one of ten, by its memory id, so that one kind in ten is a
tenth of the proposals.

Rounds alternate, (a) no policy then (b) a policy, ``--pairs`` times: on a shared machine the
load drifts over a run, and alternating spreads the drift over both sides. In (b) both tenants
have a policy (stored before the worker starts) where one kind in ten is ``review`` and the
others ``admit``, every rule requiring evidence: the sealing stage stamps each memory event
with the policy version and the evidence it finds (two indexed look-ups per tenant and batch),
and the reducer decides. Each round is an environment of its own (environment.py: topics,
schema, groups) and times ``memproj worker memory`` from the first produced event to the last
committed row (pipeline.projection_apply), with the CPU per event of the worker, this run's
PostgreSQL backends, PostgreSQL's shared processes and the broker (cpu_time.py).

Reported: events/s and CPU µs per event of each side (the mean of its rounds), the ratios
b/a, and the decisions of each round read from its schema: versions admitted and held for
review, events refused by the policy (by reason), verifications refused because their version
is held, and the other refusals (version conflicts,
unknown memories, ...: the same in both sides), so that the reader sees the policy worked.
Needs ``ops/stack up`` and its environment (``eval "$(ops/stack env)"``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Producer

# ops/bench/*.py, beside this script
from cpu_time import POSTGRES_BACKENDS, StackProcesses
from environment import (
    Environment,
    counted_stack,
    prepare,
    stack_settings,
)
from governed_stream import (
    TENANTS,
    Conversations,
    Message,
    citing_evidence,
    conversation_stream,
    governing_policy,
    tenants,
)
from phases import Phases
from pipeline import MEMORY_WORKERS, Workers, projection_apply
from sides import alternating_rounds, side_means, side_ratios

from projections.admission import store as admission_store
from projections.admission.policy import PolicyDocument
from streams.kafka import producer_config
from streams.sample import sample_memory_stream
from streams.settings import Settings
from topics.outputs import RejectionReason
from topics.registry import CONVERSATION_EVENTS

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "ops" / "bench" / "results"

NO_POLICY = "a: no policy"
GOVERNED = "b: policy"
# A verification of a version held for review is refused: the policy's doing, indirectly.
HELD_REASON = RejectionReason.PENDING_REVIEW.value
# The refusals a policy makes (projections/admission/decide.py); any other reason is the
# stream's own (version conflicts, unknown memories, ...) and happens without a policy too.
POLICY_REASONS = frozenset(
    {
        RejectionReason.KIND_NOT_ADMITTED.value,
        RejectionReason.EVIDENCE_UNAVAILABLE.value,
        RejectionReason.DERIVED_EVIDENCE.value,
        RejectionReason.INVALID_GRANT.value,
    }
)


def produce_conversations(settings: Settings, messages: Sequence[Message]) -> None:
    producer = Producer(producer_config(settings.kafka_bootstrap, **{"linger.ms": 20}))
    topic = settings.topics.name(CONVERSATION_EVENTS)
    for key, value in messages:
        producer.produce(topic, value, key)
    if producer.flush(60):
        raise RuntimeError("the conversation messages were not delivered")


def apply_conversations(
    environment: Environment, conversations: Conversations, log_path: Path
) -> None:
    """The conversation worker applies the evidence, untimed; it stops before the clock
    starts, so that it spends nothing during the timed apply."""
    settings = environment.settings
    with Workers(settings, log_path, ["conversation"]) as workers:
        produce_conversations(settings, conversations.messages)
        deadline = time.monotonic() + 180
        with psycopg.connect(settings.postgres_conninfo, autocommit=True) as conn:
            while True:
                row = conn.execute("SELECT count(*) FROM conversation_messages").fetchone()
                if row is not None and int(row[0]) >= conversations.message_count:
                    return
                if workers.processes[0].poll() is not None:
                    raise RuntimeError(f"the conversation worker exited: see {log_path}.*")
                if time.monotonic() > deadline:
                    raise RuntimeError("the conversation messages were not applied in 180 s")
                time.sleep(0.2)


def set_policies(settings: Settings, document: PolicyDocument) -> None:
    async def run() -> None:
        connecting = psycopg.AsyncConnection.connect(settings.postgres_conninfo)
        async with await connecting as conn, conn.transaction():
            for tenant in tenants():
                await admission_store.add_version(conn, tenant, document, "bench")

    asyncio.run(run())


def decisions(settings: Settings) -> dict[str, Any]:
    """What the round's writes became: proposal and correction versions admitted or held for
    review, events refused by the policy (by reason), and the other refusals."""
    with psycopg.connect(settings.postgres_conninfo) as conn:
        versions = conn.execute(
            "SELECT status = 'pending_review', count(*) FROM memory_versions"
            " WHERE event_type IN ('memory.proposed', 'memory.corrected') GROUP BY 1"
        ).fetchall()
        refused = conn.execute("SELECT reason, count(*) FROM rejections GROUP BY 1").fetchall()
    return decision_counts(
        {bool(held): int(str(count)) for held, count in versions},
        {str(reason): int(str(count)) for reason, count in refused},
    )


def decision_counts(versions: Mapping[bool, int], refused: Mapping[str, int]) -> dict[str, Any]:
    """``versions``: held for review -> versions; ``refused``: reason -> events."""
    by_policy = {r: n for r, n in sorted(refused.items()) if r in POLICY_REASONS}
    held = refused.get(HELD_REASON, 0)
    return {
        "admitted": versions.get(False, 0),
        "held_for_review": versions.get(True, 0),
        "refused_by_policy": sum(by_policy.values()),
        "refused_by_policy_by_reason": by_policy,
        "refused_while_held": held,
        "other_refusals": sum(refused.values()) - sum(by_policy.values()) - held,
        "other_refusals_by_reason": {
            r: n for r, n in sorted(refused.items()) if r not in POLICY_REASONS and r != HELD_REASON
        },
    }


def measure_round(
    base: Settings,
    environment: Environment,
    label: str,
    log_path: Path,
    *,
    conversations: Conversations,
    messages: list[Message],
    stack: StackProcesses,
) -> dict[str, Any]:
    prepare(base, environment)
    apply_conversations(environment, conversations, log_path.with_suffix(".conversation"))
    if label == GOVERNED:
        set_policies(environment.settings, governing_policy())
    seconds, meter = projection_apply(environment.settings, messages, log_path, 1, stack)
    applied = len(messages) - 1  # the warm-up event is applied untimed
    return {
        "side": label,
        "seconds": round(seconds, 3),
        "events_per_s": round(applied / seconds, 1),
        "cpu_us_per_event": meter.per_event(applied),
        "decisions": decisions(environment.settings),
    }


def summary(rounds: Sequence[Mapping[str, Any]], events: int) -> dict[str, Any]:
    """Each side's mean rate and CPU per event over its rounds, and the ratios b/a where both
    sides were measured."""
    result: dict[str, Any] = {"events": events, "cpus": os.cpu_count(), "rounds": list(rounds)}
    sides: dict[str, dict[str, Any]] = {}
    for label in (NO_POLICY, GOVERNED):
        mine = [r for r in rounds if r["side"] == label]
        if not mine:
            continue
        decided: Counter[str] = Counter()
        for r in mine:
            decided.update({k: v for k, v in r["decisions"].items() if isinstance(v, int)})
        sides[label] = {
            **side_means(mine),
            "decisions_per_round": {k: round(v / len(mine), 1) for k, v in decided.items()},
        }
    result["sides"] = sides
    if NO_POLICY in sides and GOVERNED in sides:
        result["b_over_a"] = side_ratios(sides[NO_POLICY], sides[GOVERNED], MEMORY_WORKERS)
    return result


def table(result: Mapping[str, Any]) -> list[str]:
    """The run as a Markdown table: one column per side, and b/a."""
    sides = result["sides"]
    labels = [label for label in (NO_POLICY, GOVERNED) if label in sides]
    ratios = result.get("b_over_a", {})
    header = ["", *labels, "b/a"]

    def cpu(side: Mapping[str, Any], name: str) -> float:
        return float(side["cpu_us_per_event"].get(name, 0.0))

    def fmt(value: float | None, spec: str = ",.0f") -> str:
        return "—" if value is None else format(value, spec)

    def each(values: Sequence[float]) -> str:
        return ", ".join(fmt(value) for value in values)

    rows: list[list[str]] = [
        ["events/s (mean of rounds)"]
        + [
            f"{fmt(sides[s]['events_per_s'])} ({each(sides[s]['events_per_s_each'])})"
            for s in labels
        ]
        + [fmt(ratios.get("events_per_s"), ".2f")],
        ["CPU µs/event, memory worker"]
        + [fmt(cpu(sides[s], MEMORY_WORKERS)) for s in labels]
        + [fmt(ratios.get("cpu_worker"), ".2f")],
        ["CPU µs/event, PostgreSQL backends"]
        + [fmt(cpu(sides[s], POSTGRES_BACKENDS)) for s in labels]
        + [fmt(ratios.get("cpu_postgres_backends"), ".2f")],
        ["CPU µs/event, all counted processes"]
        + [fmt(sides[s]["cpu_total_us_per_event"]) for s in labels]
        + [fmt(ratios.get("cpu_total"), ".2f")],
    ]
    for key, name in (
        ("admitted", "versions admitted, per round"),
        ("held_for_review", "versions held for review, per round"),
        ("refused_by_policy", "events refused by the policy, per round"),
        ("refused_while_held", "verifications refused while held, per round"),
        ("other_refusals", "other refusals (conflicts, unknown memories, ...), per round"),
    ):
        rows.append(
            [name] + [fmt(sides[s]["decisions_per_round"].get(key, 0.0)) for s in labels] + [""]
        )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=3000, help="memories per round")
    parser.add_argument("--pairs", type=int, default=2, help="rounds of each side, alternating")
    args = parser.parse_args()

    base = stack_settings()
    run = uuid.uuid4().hex[:8]
    stack = counted_stack(base, run)
    conversations = conversation_stream()
    stream = sample_memory_stream(args.memories, TENANTS, seed=3)
    messages = citing_evidence(((m.key, m.value) for m in stream), conversations.evidence)
    RESULTS.mkdir(parents=True, exist_ok=True)
    phases = Phases()
    sides = (NO_POLICY, GOVERNED)
    measure = partial(measure_round, base, conversations=conversations, messages=messages)
    rounds = alternating_rounds(
        base, run, phases, sides, args.pairs, RESULTS, partial(measure, stack=stack)
    )
    for found in rounds:
        print(f"{found['side']}: decisions {found['decisions']}")
    order = list(sides) * args.pairs
    result = summary(rounds, len(messages))
    result["memories_per_round"] = args.memories
    result["failed_rounds"] = dict(phases.failed)
    path = RESULTS / f"governed-writes-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"{len(messages)} events of two tenants per round, rounds {', '.join(order)}:")
    print("\n".join(table(result)))
    for name, error in phases.failed.items():
        print(f"  FAILED {name}: {error}")
    print(f"  saved: {path}")
    if phases.failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
