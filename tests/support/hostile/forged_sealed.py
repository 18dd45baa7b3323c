"""Forgeries on the sealed logs (``memory.events.sealed``, ``conversation.events.sealed``):
seals that are not objects or do not open, payloads that are not objects, garbage.
"""

from __future__ import annotations

import base64
from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

from streams.sample import RawEvent, key_of
from support.hostile.contract import ENVELOPE, EVENT_TYPES, MAX_NESTING
from support.hostile.json_surgery import nested, raw_at, set_at
from support.hostile.making import Round, planned_event
from support.hostile.plan import Expect, Planned
from support.hostile.values import GARBAGE, wrong_values
from topics.personal import PERSONAL_EVENTS
from topics.registry import (
    CONVERSATION_EVENTS,
    CONVERSATION_SEALED,
    MEMORY_EVENTS,
    MEMORY_SEALED,
    TopicSpec,
)


def sealed_event(event: RawEvent, sealed: Any) -> RawEvent:
    """``event`` as the sealed log carries it, its personal fields (as the contract marks
    them) replaced by ``sealed``."""
    spec = PERSONAL_EVENTS.get(event["event_type"])
    personal = () if spec is None else spec.names
    payload = {k: v for k, v in event["payload"].items() if k not in personal}
    payload["sealed"] = sealed
    return {**event, "payload": payload}


def seal_name(event: RawEvent) -> str:
    """The ``entity`` a seal of ``event`` names: its entity type and id."""
    spec = PERSONAL_EVENTS[event["event_type"]]
    return f"{spec.entity_type}:{event['payload'][spec.entity_field]}"


_FIELDS: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from(["", "!!!not base64!!!", "AAAA", "=", 5, None, [], {}]),
    st.binary(min_size=1, max_size=60).map(lambda b: base64.b64encode(b).decode()),
)


def forged_sealed(r: Round, spec: TopicSpec) -> None:
    topic = SEALED_RAW[spec.base_name]
    personal_types = [t for t in EVENT_TYPES[topic] if t in PERSONAL_EVENTS]
    for _ in range(2):
        event_type = r.draw(st.sampled_from(personal_types))
        tenant, entity = r.tenant_entity(topic)
        event = r.maker.template(event_type, tenant, entity)
        name = seal_name(event)
        # Sealed fields that are not an object: refused whatever the keys.
        sealed = r.draw(st.sampled_from(["sealed", [], None, 5, True]))
        r.add(
            planned_event(
                spec,
                sealed_event(event, sealed),
                Expect.DEAD,
                f"forged_seal:{event_type}:{type(sealed).__name__}",
                template=event,
            )
        )
        # Sealed fields that are an object: refused as unreadable when the entity has a data
        # key (it cannot open them), taken as shredded when it has none (a deletion destroyed
        # it, as far as memproj can tell): decided, never applied.
        sealed = r.draw(
            st.sampled_from(
                [
                    {"entity": name, "fields": r.draw(_FIELDS)},
                    {"entity": "memory:somebody_else", "fields": "AAAA"},
                    {"fields": r.draw(_FIELDS)},
                    {"entity": name},
                ]
            )
        )
        r.add(
            planned_event(
                spec,
                sealed_event(event, sealed),
                Expect.EITHER,
                f"forged_seal_object:{event_type}",
                template=event,
            )
        )
        # The payload not an object.
        payload = r.draw(st.sampled_from(["x", [1], None, 5, [event["payload"]]]))
        r.add(
            planned_event(
                spec,
                {**event, "payload": payload},
                Expect.DEAD,
                f"forged_payload:{event_type}:{type(payload).__name__}",
                template=event,
            )
        )
        # Garbage, and every field with a wrong type (the sealed form decodes like the raw).
        r.add(Planned(spec, key_of(event), r.draw(GARBAGE), Expect.DEAD, "forged_garbage"))
        path, kind = r.draw(st.sampled_from(sorted(ENVELOPE.items())))
        wrong = set_at(
            sealed_event(event, {"entity": name, "fields": "AAAA"}),
            path,
            r.draw(wrong_values(kind)),
        )
        r.add(
            planned_event(
                spec,
                wrong,
                Expect.DEAD,
                f"forged_wrong_type:{'.'.join(map(str, path))}",
                template=event,
            )
        )
        r.add(
            planned_event(
                spec,
                sealed_event(event, {"entity": name, "fields": "AAAA"}),
                Expect.DEAD,
                "forged_key_mismatch",
                key=b"tenant_0:someone_else",
                template=event,
            )
        )
        nest = r.draw(st.integers(MAX_NESTING - 1, 10_000))
        r.add(
            planned_event(
                spec,
                event,
                Expect.DEAD,
                f"forged_nesting:{nest}",
                raw_at(
                    sealed_event(event, {"entity": name}),
                    ("payload", "x"),
                    nested(nest, r.draw(st.booleans())),
                ),
            )
        )
    # Forged fields for an entity of the valid stream whose data key exists (tenant_1 has no
    # deletion): they cannot be opened. Produced once the valid stream is sealed.
    real = [(t, e) for t, e in r.real.get(topic, []) if t == "tenant_1"]
    for _ in range(3):
        tenant, entity = r.draw(st.sampled_from(real))
        event_type = r.draw(st.sampled_from(personal_types))
        event = r.maker.template(event_type, tenant, entity)
        sealed = {"entity": seal_name(event), "fields": r.draw(_FIELDS)}
        r.add(
            replace(
                planned_event(
                    spec,
                    sealed_event(event, sealed),
                    Expect.DEAD,
                    f"forged_seal_unopenable:{event_type}",
                    template=event,
                ),
                phase=1,
            )
        )
    # Marked erased by the sealer: a forgery memproj cannot tell, decided as unreadable; and
    # a plaintext event without a seal, which the sealed codec takes as it is.
    event_type = r.draw(st.sampled_from(personal_types))
    event = r.edge(event_type)
    r.add(
        planned_event(
            spec,
            sealed_event(event, {"entity": seal_name(event), "erased": True}),
            Expect.EITHER,
            f"forged_erased:{event_type}",
            template=event,
        )
    )
    r.add(planned_event(spec, r.edge(event_type), Expect.EITHER, f"forged_plain:{event_type}"))


SEALED_RAW = {
    MEMORY_SEALED.base_name: MEMORY_EVENTS.base_name,
    CONVERSATION_SEALED.base_name: CONVERSATION_EVENTS.base_name,
}
