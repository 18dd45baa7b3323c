"""The hostile families of the input topics that go at the message as a whole: sizes, keys,
framing, schema versions and event types.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import strategies as st

from streams.sample import RawEvent, key_of
from support.hostile.contract import ALL_EVENT_TYPES, EVENT_TYPES
from support.hostile.forged_deletion import acknowledgement, planned_ack
from support.hostile.json_surgery import Path, set_at
from support.hostile.making import Round, planned_event
from support.hostile.plan import ARRAY, EDGE_TENANT, LARGE, VALID_TENANTS, Expect
from topics.registry import CONVERSATION_EVENTS, DELETION_REQUESTS, MEMORY_EVENTS, TopicSpec


def sizes(r: Round, spec: TopicSpec) -> None:
    """900 KB strings and 100,000-element arrays (made by the large rounds only)."""
    topic = spec.base_name
    seed = r.draw(
        st.text(st.characters(codec="ascii", exclude_categories=["Cc"]), min_size=1, max_size=4)
    )
    big = (seed * (LARGE // len(seed) + 1))[:LARGE]

    def add(
        event: RawEvent, path: Path, value: Any, expect: Expect, kind: str | None = None
    ) -> None:
        kind = kind or f"size:{event['event_type']}:{path[-1]}"
        r.add(planned_event(spec, set_at(event, path, value), expect, kind, template=event))

    if topic == MEMORY_EVENTS.base_name:
        tenant, entity = r.tenant_entity(topic)
        dead: list[tuple[str, Path, Any]] = [
            ("memory.proposed", ("payload", "value", "blob"), big),
            ("memory.revoked", ("payload", "reason"), big),
            ("memory.verified", ("event_id",), big),
            ("memory.proposed", ("payload", "value", "list"), [0] * ARRAY),
            ("memory.proposed", ("payload", "subject", "id"), [0] * ARRAY),
        ]
        for event_type, path, value in dead:
            add(r.maker.template(event_type, tenant, entity), path, value, Expect.DEAD)
        edge_cases: list[tuple[str, Path, Any]] = [
            ("memory.proposed", ("extra",), big),
            ("memory.verified", ("payload", "extra"), [0] * ARRAY),
            ("memory.proposed", ("payload", "evidence_event_ids"), ["e"] * ARRAY),
        ]
        for event_type, path, value in edge_cases:
            add(r.edge(event_type), path, value, Expect.EITHER)
    elif topic == CONVERSATION_EVENTS.base_name:
        edge_cases = [
            ("conversation.message_added", ("payload", "content"), big),
            ("conversation.message_added", ("payload", "content"), big[: LARGE * 2 // 3]),
            ("conversation.message_added", ("payload", "content", 2, "content"), big),
            ("conversation.summary_updated", ("payload", "text"), big),
            (
                "conversation.summary_updated",
                ("payload", "source_message_ids"),
                [f"m{i}" for i in range(ARRAY)],
            ),
            ("conversation.started", ("extra",), [0] * ARRAY),
        ]
        for event_type, path, value in edge_cases:
            add(r.edge(event_type), path, value, Expect.EITHER)
        tenant, entity = r.tenant_entity(topic)
        event = r.maker.template("conversation.message_added", tenant, entity)
        strings = ["x"] * ARRAY
        kind = "size:conversation.message_added:content_strings"
        add(event, ("payload", "content"), strings, Expect.DEAD, kind)
    else:
        tenant, entity = r.tenant_entity(topic)
        event = r.maker.template("deletion.requested", tenant, entity)
        add(event, ("payload", "reason"), big, Expect.DEAD, "size:deletion.requested:reason")
        event = r.maker.template("deletion.requested", tenant, entity)
        kind = "size:deletion.requested:target.id"
        add(event, ("payload", "target", "id"), [0] * ARRAY, Expect.DEAD, kind)
    # A key of 900 KB (its dead letter holds its first 4096 characters, and the message's key
    # is the original one).
    event_type = EVENT_TYPES[topic][0]
    tenant, entity = r.tenant_entity(topic)
    event = r.maker.template(event_type, tenant, entity)
    r.add(
        planned_event(
            spec,
            event,
            Expect.DEAD,
            "size:key:900KB",
            key=key_of(event) + big.encode()[: LARGE - 1000],
        )
    )


def keys(r: Round, spec: TopicSpec) -> None:
    for event_type in EVENT_TYPES[spec.base_name]:
        tenant, entity = r.tenant_entity(spec.base_name)
        event = r.maker.template(event_type, tenant, entity)
        proper = key_of(event)
        other_tenant = next(t for t in sorted(VALID_TENANTS) if t != tenant)
        wrong = r.draw(
            st.sampled_from(
                [
                    None,
                    b"",
                    proper + b" ",
                    proper.upper(),
                    proper.split(b":", 1)[1],
                    other_tenant.encode() + b":" + proper.split(b":", 1)[1],
                    proper + b"\x00",
                    proper + b"\xff",
                    b"\xff\xfe" + proper,
                    proper.replace(b":", b"::", 1),
                    b":" + proper,
                    proper + b":",
                ]
            )
        )
        r.add(planned_event(spec, event, Expect.DEAD, f"key:{event_type}:{wrong!r}", key=wrong))


def framing(r: Round, spec: TopicSpec) -> None:
    tenant, entity = r.tenant_entity(spec.base_name)
    event_type = r.draw(st.sampled_from(EVENT_TYPES[spec.base_name]))
    event = r.maker.template(event_type, tenant, entity)
    text = orjson.dumps(event)
    cut = r.draw(st.integers(0, len(text) - 1))
    noise = r.draw(st.binary(min_size=1, max_size=48))
    values: list[tuple[str, bytes | None]] = [
        ("null_value", None),
        ("empty", b""),
        ("binary", noise),
        ("truncated", text[:cut]),
        ("trailing_garbage", text + b"}"),
        ("two_documents", text + b" " + text),
        ("nul_after", text + b"\x00"),
        ("array_of_event", b"[" + text + b"]"),
        (
            "json",
            r.draw(
                st.sampled_from(
                    [
                        b"[]",
                        b"{}",
                        b"0",
                        b"-1.5",
                        b'"text"',
                        b"true",
                        b"null",
                        b'[{"event_id":"x"}]',
                        b"1e400",
                    ]
                )
            ),
        ),
        (
            "not_json",
            r.draw(
                st.sampled_from(
                    [
                        b"{not json",
                        b"<xml/>",
                        b"\x1f\x8b\x08\x00",
                        b"event_id=1&tenant_id=t",
                        b"{'a': 1}",
                    ]
                )
            ),
        ),
    ]
    for name, value in values:
        r.add(planned_event(spec, event, Expect.DEAD, f"framing:{name}", value=value))
    # Whitespace around the object is JSON; a byte order mark may be ignored or refused.
    event = r.edge(event_type)
    text = orjson.dumps(event)
    wrapped = r.draw(st.sampled_from([b" \n\t" + text + b"\r\n ", b"\xef\xbb\xbf" + text]))
    r.add(
        planned_event(spec, event, Expect.EITHER, f"framing:wrapped:{wrapped[:3]!r}", value=wrapped)
    )


def types_and_versions(r: Round, spec: TopicSpec) -> None:
    topic = spec.base_name
    for event_type in EVENT_TYPES[topic]:
        tenant, entity = r.tenant_entity(topic)
        event = r.maker.template(event_type, tenant, entity)
        version = r.draw(
            st.one_of(
                st.sampled_from([0, -1, 3, 99, 2**31, 2**63 - 1, "1", 1.0, True, None, [1]]),
                st.integers(3, 2**63 - 1),
            )
        )
        if event_type != "conversation.message_added" and version == 2:
            version = 3
        r.add(
            planned_event(
                spec,
                set_at(event, ("schema_version",), version),
                Expect.DEAD,
                f"schema_version:{event_type}:{version!r}",
                template=event,
            )
        )
    # message_added at version 2 carries blocks only: a string is the v1 form.
    if topic == CONVERSATION_EVENTS.base_name:
        tenant, entity = r.tenant_entity(topic)
        event = r.maker.template("conversation.message_added", tenant, entity)
        event["schema_version"] = 2
        r.add(
            planned_event(
                spec,
                set_at(event, ("payload", "content"), "a string"),
                Expect.DEAD,
                "schema_version:message_added_v2_string",
                template=event,
            )
        )
        event = set_at(r.edge("conversation.message_added"), ("schema_version",), 2)
        r.add(planned_event(spec, event, Expect.EITHER, "schema_version:message_added_v2_blocks"))
    # Event types of other topics: not valid here (the contract names each topic's types).
    foreign = sorted(ALL_EVENT_TYPES - set(EVENT_TYPES[topic]))
    event_type = r.draw(st.sampled_from(foreign))
    event = r.maker.template(event_type, EDGE_TENANT)
    r.add(planned_event(spec, event, Expect.DEAD, f"foreign_type:{event_type}"))
    if topic == DELETION_REQUESTS.base_name:
        ack = acknowledgement(r.maker, EDGE_TENANT)
        r.add(planned_ack(spec, ack, Expect.DEAD, "foreign_type:ack"))
