"""Small corpora of their own, for what the big one cannot hold without losing its other
findings: runs of one poison pill alone on a topic (the circuit breaker's case), and
messages whose dead letter is larger than a Kafka message.
"""

from __future__ import annotations

from support.hostile.contract import EVENT_TYPES
from support.hostile.forged_sealed import seal_name, sealed_event
from support.hostile.json_surgery import nested, raw_at, set_at
from support.hostile.making import Maker, planned_event
from support.hostile.plan import FORGED_TENANT, SPECS, Corpus, Expect, Planned
from topics.registry import (
    CONVERSATION_SEALED,
    DELETION_REQUESTS,
    DELETION_TOMBSTONES,
    MEMORY_CURRENT,
    MEMORY_EVENTS,
    MEMORY_SEALED,
    TopicSpec,
)

BURST = 8


def bursts(length: int = BURST) -> Corpus:
    """Runs of one hostile kind, each alone on its topic, so that a worker's batches hold
    nothing else (the sealer's two topics are one stream: only one of them gets a run), each
    followed by valid events where the topic has any: the kinds that fail in processing (a
    bug they hit, which the circuit breaker counts, unlike a refusal by a codec) and, for
    contrast, kinds that a codec refuses."""
    maker = Maker()
    topics: dict[str, list[Planned]] = {}

    def add(planned: Planned) -> None:
        topics.setdefault(planned.spec.base_name, []).append(planned)

    def valid_after(spec: TopicSpec, event_type: str) -> None:
        for _ in range(2):
            add(
                planned_event(
                    spec, maker.template(event_type, "tenant_0"), Expect.VALID, "valid:after_burst"
                )
            )

    for _ in range(length):
        # An integer no 64-bit type holds, in a memory value: the sealer fails on it.
        event = maker.template("memory.proposed", "tenant_0")
        big = str(2**70).encode()
        add(
            planned_event(
                MEMORY_EVENTS,
                event,
                Expect.EITHER,
                "burst:big_int_in_value",
                raw_at(event, ("payload", "value", "n"), big),
            )
        )
    valid_after(MEMORY_EVENTS, "memory.proposed")
    for spec in (MEMORY_SEALED, CONVERSATION_SEALED):
        event_type = "memory.proposed" if spec == MEMORY_SEALED else "conversation.message_added"
        for _ in range(length):
            # Nesting that orjson reads (at most 1024 levels) and does not write (254), in a
            # sealed event whose entity has no data key.
            event = maker.template(event_type, "tenant_0")
            sealed = sealed_event(event, {"entity": seal_name(event)})
            add(
                planned_event(
                    spec,
                    event,
                    Expect.DEAD,
                    "burst:sealed_nesting_300",
                    raw_at(sealed, ("payload", "x"), nested(300, False)),
                )
            )
    for index in range(length):
        add(
            Planned(
                MEMORY_CURRENT, b"\xff" + bytes([index]), None, Expect.DEAD, "burst:key_not_utf8"
            )
        )
    for _ in range(length):
        add(
            Planned(
                DELETION_TOMBSTONES,
                f"{FORGED_TENANT}:x".encode(),
                b"[1,2",
                Expect.DEAD,
                "burst:tombstone_garbage",
            )
        )
    for _ in range(length):
        event = maker.template("deletion.requested", "tenant_0")
        add(
            planned_event(
                DELETION_REQUESTS,
                set_at(event, ("schema_version",), 99),
                Expect.DEAD,
                "burst:unknown_schema_version",
                template=event,
            )
        )
    return Corpus([topics], [])


def oversized_letters() -> Corpus:
    """On every topic memproj consumes, a message whose key is large enough that the key and
    a dead letter of the value (base64 of its first 512 KiB) do not fit in one Kafka message
    together, though the message itself does; valid events after it where the topic has any.
    """
    maker = Maker()
    topics: dict[str, list[Planned]] = {}
    for name, spec in SPECS.items():
        key = b"tenant_0:" + b"k" * 300_000
        topics[name] = [Planned(spec, key, b"x" * 524_288, Expect.DEAD, "oversized_letter")]
        event_types = EVENT_TYPES.get(name)
        if event_types:
            event = maker.template(event_types[0], "tenant_0")
            topics[name].append(planned_event(spec, event, Expect.VALID, "valid:after"))
    return Corpus([topics], [])
