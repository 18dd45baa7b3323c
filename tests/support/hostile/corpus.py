"""The corpus: the valid stream, with the hostile messages of every family drawn by
hypothesis shuffled in among it, phase by phase and topic by topic.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import timedelta

import orjson
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from streams.sample import EPOCH, EventFactory, sample_conversation_stream, sample_memory_stream
from support.hostile.contract import EVENT_TYPES
from support.hostile.forged_deletion import forged_acks, forged_tombstones
from support.hostile.forged_records import forged_current, forged_messages
from support.hostile.forged_sealed import forged_sealed
from support.hostile.input_messages import framing, keys, sizes, types_and_versions
from support.hostile.input_values import duplicates, nesting, numbers, unicode, wrong_types
from support.hostile.making import Maker, Round, planned_event
from support.hostile.plan import (
    FORGED_TENANT,
    LARGE,
    PHASES,
    SPECS,
    VALID_TENANTS,
    Corpus,
    Expect,
    Planned,
)
from topics.registry import (
    CONVERSATION_EVENTS,
    CONVERSATION_MESSAGES,
    CONVERSATION_SEALED,
    DELETION_ACKS,
    DELETION_REQUESTS,
    DELETION_TOMBSTONES,
    MEMORY_CURRENT,
    MEMORY_EVENTS,
    MEMORY_SEALED,
    TopicSpec,
)

INPUT_FAMILIES = (
    wrong_types,
    nesting,
    numbers,
    duplicates,
    unicode,
    keys,
    framing,
    types_and_versions,
)


OUTPUT_FAMILIES: dict[str, Callable[[Round, TopicSpec], None]] = {
    MEMORY_SEALED.base_name: forged_sealed,
    CONVERSATION_SEALED.base_name: forged_sealed,
    DELETION_ACKS.base_name: forged_acks,
    DELETION_TOMBSTONES.base_name: forged_tombstones,
    MEMORY_CURRENT.base_name: forged_current,
    CONVERSATION_MESSAGES.base_name: forged_messages,
}


def valid_stream(memories: int, conversations: int) -> tuple[list[Planned], list[tuple[str, str]]]:
    """The demo's realistic streams (without their malformed messages) in two tenants, and two
    deletion requests of tenant_0: a conversation (with the memories learned in it) and a
    memory."""
    tenants = len(VALID_TENANTS)
    valid: list[Planned] = []
    for spec, stream in (
        (MEMORY_EVENTS, sample_memory_stream(memories, tenants=tenants, seed=41)),
        (CONVERSATION_EVENTS, sample_conversation_stream(conversations, tenants=tenants, seed=41)),
    ):
        for sample in stream:
            if sample.expectation.startswith("dlq:"):
                continue
            assert sample.value is not None
            event = orjson.loads(sample.value)
            planned = planned_event(spec, event, Expect.VALID, f"valid:{sample.expectation}")
            valid.append(replace(planned, key=sample.key, value=sample.value))
    # After every sample event (one second apart from EPOCH), with a deadline that never
    # passes during the test.
    factory = EventFactory(id_prefix="del", clock=EPOCH + timedelta(days=1))
    deadline = EPOCH + timedelta(days=3650)
    requests = [
        factory.deletion(
            "tenant_0",
            "d_conversation",
            {"type": "conversation", "id": "conv_1"},
            deadline_at=deadline,
        ),
        factory.deletion(
            "tenant_0", "d_memory", {"type": "memory", "id": "mem_00004"}, deadline_at=deadline
        ),
    ]
    for event in requests:
        valid.append(
            replace(
                planned_event(DELETION_REQUESTS, event, Expect.VALID, "valid:deletion"), phase=2
            )
        )
    return valid, [("tenant_0", "d_conversation"), ("tenant_0", "d_memory")]


def _real_entities(messages: Sequence[Planned]) -> list[tuple[str, str]]:
    """The entities of the valid stream that exist, with their data key, for the whole test:
    not an id only named by an event for an unknown memory (nothing of it is sealed, so it
    has no key), nor a memory that expires (its erasure destroys its key while the test runs).
    A forged seal for either is decided as shredded, not dead-lettered as unopenable."""
    found, gone = set(), set()
    for planned in messages:
        if planned.expect is not Expect.VALID or planned.key is None:
            continue
        tenant, _, entity = planned.key.decode().partition(":")
        event = orjson.loads(planned.value) if planned.value else {}
        if planned.kind == "valid:unknown_memory" or event.get("payload", {}).get("expires_at"):
            gone.add((tenant, entity))
        else:
            found.add((tenant, entity))
    return sorted(found - gone)


# -- drawing it all --------------------------------------------------------------------------


def hostile_rounds(real: dict[str, list[tuple[str, str]]], rounds: int) -> list[Planned]:
    """``rounds`` hypothesis examples, each making every family of hostile messages once (the
    first also the large ones), drawn deterministically."""
    maker = Maker()
    made: list[list[Planned]] = []

    @settings(
        max_examples=rounds,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    @given(st.data())
    def draw_round(data: st.DataObject) -> None:
        r = Round(data.draw, maker, real, large=not made)
        for topic in (MEMORY_EVENTS, CONVERSATION_EVENTS, DELETION_REQUESTS):
            for family in INPUT_FAMILIES:
                family(r, topic)
            if r.large:
                sizes(r, topic)
        for name, forge in OUTPUT_FAMILIES.items():
            forge(r, SPECS[name])
        if r.large:
            big = "x" * LARGE
            for name in OUTPUT_FAMILIES:
                key = f"{FORGED_TENANT}:big".encode()
                r.add(
                    Planned(
                        SPECS[name], key, orjson.dumps({"junk": big}), Expect.DEAD, "forged_large"
                    )
                )
        made.append(r.out)

    # Derandomized: the corpus depends on this file, the hypothesis version and the literals
    # hypothesis picks up from the loaded modules; every expectation is derived from the
    # corpus itself, so any corpus it draws is judged the same way.
    draw_round()
    return [planned for batch in made for planned in batch]


def interleave(
    valid: Sequence[Planned], hostile: Sequence[Planned], rng: random.Random
) -> list[Planned]:
    """The hostile messages shuffled in among the valid ones, which keep their order."""
    slots = [True] * len(valid) + [False] * len(hostile)
    rng.shuffle(slots)
    hostile = list(hostile)
    rng.shuffle(hostile)
    ordered, shuffled = iter(valid), iter(hostile)
    return [next(ordered) if is_valid else next(shuffled) for is_valid in slots]


def corpus(
    rounds: int = 6,
    memories: int = 300,
    conversations: int = 80,
    seed: int = 20261201,
) -> Corpus:
    """The whole input of the suite: the valid stream with the hostile messages of ``rounds``
    rounds shuffled in, per phase and topic, deterministically."""
    valid, deletions = valid_stream(memories, conversations)
    real = {
        topic: _real_entities([p for p in valid if p.spec.base_name == topic])
        for topic in EVENT_TYPES
    }
    everything = [*valid, *hostile_rounds(real, rounds)]
    rng = random.Random(seed)
    phases: list[dict[str, list[Planned]]] = []
    for phase in range(PHASES):
        topics: dict[str, list[Planned]] = {}
        for topic in SPECS:
            mine = [p for p in everything if p.phase == phase and p.spec.base_name == topic]
            if mine:
                topics[topic] = interleave(
                    [p for p in mine if p.expect is Expect.VALID],
                    [p for p in mine if p.expect is not Expect.VALID],
                    rng,
                )
        phases.append(topics)
    return Corpus(phases, deletions)
