"""The hostile families of the input topics that go at the values: every field of every
event type wrong or missing, nesting, numbers, duplicate names and Unicode.
"""

from __future__ import annotations

import orjson
from hypothesis import strategies as st

from support.hostile.contract import (
    ENVELOPE,
    EVENT_TYPES,
    MAX_NESTING,
    OPTIONAL,
    PAYLOADS,
    entity_field,
)
from support.hostile.json_surgery import Path, delete_at, member_in, nested, raw_at, set_at
from support.hostile.making import Round, planned_event
from support.hostile.plan import EDGE_TENANT, Expect
from support.hostile.values import BIG_INTS, DEPTHS, HUGE, NOT_NUMBERS, wrong_values
from topics.registry import TopicSpec


def wrong_types(r: Round, spec: TopicSpec) -> None:
    """Every field of every event type of the topic with a wrong value, and every required
    field missing."""
    for event_type in EVENT_TYPES[spec.base_name]:
        for path, kind in {**ENVELOPE, **PAYLOADS[event_type]}.items():
            tenant, entity = r.tenant_entity(spec.base_name)
            event = r.maker.template(event_type, tenant, entity)
            label = ".".join(str(p) for p in path)
            wrong = r.draw(wrong_values(kind))
            r.add(
                planned_event(
                    spec,
                    set_at(event, path, wrong),
                    Expect.DEAD,
                    f"wrong_type:{event_type}:{label}",
                    template=event,
                )
            )
            # A list without its first element is still a list.
            if kind not in OPTIONAL and not isinstance(path[-1], int):
                r.add(
                    planned_event(
                        spec,
                        delete_at(event, path),
                        Expect.DEAD,
                        f"missing:{event_type}:{label}",
                        template=event,
                    )
                )


# Where a nesting goes, per event type: (path of the hole, whether the contract reads it).
def _nest_paths(event_type: str) -> list[Path]:
    paths: list[Path] = [("extra",), ("payload", "extra")]
    if event_type in ("memory.proposed", "memory.corrected"):
        paths.append(("payload", "value", "deep"))
    if event_type == "conversation.message_added":
        paths.append(("payload", "content", 1, "input", "deep"))
    return paths


def nesting(r: Round, spec: TopicSpec) -> None:
    for event_type in EVENT_TYPES[spec.base_name]:
        depth = r.draw(DEPTHS)
        objects = r.draw(st.booleans())
        path = r.draw(st.sampled_from(_nest_paths(event_type)))
        event = r.edge(event_type)
        total = len(path) + depth
        expect = Expect.DEAD if total > MAX_NESTING else Expect.EITHER
        kind = f"nesting:{event_type}:{'.'.join(map(str, path))}:{depth}"
        r.add(planned_event(spec, event, expect, kind, raw_at(event, path, nested(depth, objects))))
        # In a field that holds a string: wrong, whatever the depth.
        tenant, entity = r.tenant_entity(spec.base_name)
        event = r.maker.template(event_type, tenant, entity)
        string_path = r.draw(
            st.sampled_from([("event_id",), ("actor", "id"), ("payload", entity_field(event_type))])
        )
        r.add(
            planned_event(
                spec,
                event,
                Expect.DEAD,
                f"nesting_in_string:{event_type}:{depth}",
                raw_at(event, string_path, nested(depth, objects)),
            )
        )


# Numbers that are not JSON, none a double holds, or integers no 64-bit type holds.
_NUMBER_LITERALS = st.sampled_from(NOT_NUMBERS + HUGE + BIG_INTS)


def numbers(r: Round, spec: TopicSpec) -> None:
    event_types = EVENT_TYPES[spec.base_name]
    for event_type in event_types:
        for where in _nest_paths(event_type):
            event = r.edge(event_type)
            literal = r.draw(_NUMBER_LITERALS)
            # Not a number JSON has (NaN), or none a double holds (1e400): in a value the
            # projection stores, it could only be stored altered.
            read = where[-1] == "deep"
            if literal in NOT_NUMBERS or (read and literal in HUGE):
                expect = Expect.DEAD
            else:
                expect = Expect.EITHER
            r.add(
                planned_event(
                    spec,
                    event,
                    expect,
                    f"number:{event_type}:{where[-1]}:{literal!r}",
                    raw_at(event, where, literal),
                )
            )
    # The integer fields: schema_version is exactly the current one; versions are counted.
    for event_type in event_types:
        tenant, entity = r.tenant_entity(spec.base_name)
        event = r.maker.template(event_type, tenant, entity)
        literal = r.draw(_NUMBER_LITERALS)
        r.add(
            planned_event(
                spec,
                event,
                Expect.DEAD,
                f"number:{event_type}:schema_version",
                raw_at(event, ("schema_version",), literal),
            )
        )
    int_fields = {
        "memory.verified": ("payload", "expected_version"),
        "memory.corrected": ("payload", "expected_version"),
        "memory.revoked": ("payload", "expected_version"),
        "conversation.summary_updated": ("payload", "summary_version"),
    }
    for event_type, path in int_fields.items():
        if event_type not in event_types:
            continue
        literal = r.draw(_NUMBER_LITERALS)
        stored = event_type == "conversation.summary_updated"
        if literal in BIG_INTS and literal.startswith(b"-"):
            expect = Expect.DEAD
        elif literal in BIG_INTS and not stored:
            # expected_version has no upper bound: a version conflict, or a dead letter.
            expect = Expect.EITHER
        else:
            expect = Expect.DEAD
        event = (
            r.edge(event_type)
            if expect is Expect.EITHER
            else r.maker.template(event_type, *r.tenant_entity(spec.base_name))
        )
        r.add(
            planned_event(
                spec,
                event,
                expect,
                f"number:{event_type}:{path[-1]}:{literal!r}",
                raw_at(event, path, literal),
            )
        )


def duplicates(r: Round, spec: TopicSpec) -> None:
    for event_type in EVENT_TYPES[spec.base_name]:
        id_field = entity_field(event_type)
        # The last one wins in both of memproj's parsers: a last that does not match the key.
        tenant, entity = r.tenant_entity(spec.base_name)
        event = r.maker.template(event_type, tenant, entity)
        other = orjson.dumps(r.maker.fresh("h_dup_"))
        r.add(
            planned_event(
                spec,
                event,
                Expect.DEAD,
                f"duplicate:{event_type}:last_mismatch",
                member_in(
                    event, ("payload",), b'"' + id_field.encode() + b'":' + other, first=False
                ),
            )
        )
        # A last that is of the wrong type.
        name = r.draw(st.sampled_from(["event_id", "tenant_id", "occurred_at", "payload"]))
        r.add(
            planned_event(
                spec,
                event,
                Expect.DEAD,
                f"duplicate:{event_type}:last_wrong:{name}",
                member_in(event, (), b'"' + name.encode() + b'":[12]', first=False),
            )
        )
        # A first that is wrong and a last that is right, or both the same: what is applied
        # is the last; a dead letter would do too (duplicate names are not interoperable).
        event = r.edge(event_type)
        name = r.draw(st.sampled_from(["event_id", "occurred_at", "payload", "actor"]))
        first = r.draw(st.sampled_from([b"12", b"null", orjson.dumps(event[name])]))
        r.add(
            planned_event(
                spec,
                event,
                Expect.EITHER,
                f"duplicate:{event_type}:first_wrong:{name}",
                member_in(event, (), b'"' + name.encode() + b'":' + first, first=True),
            )
        )


_SURROGATES = [b'"\\ud800"', b'"a\\udfffb"', b'"\\ud800\\ud800"', b'"\\udbff"', b'"x\\ud83d"']
_BAD_UTF8 = [b'"\xff"', b'"\xc0\x80"', b'"\xed\xa0\x80"', b'"a\xe2\x82"', b'"\xf8\x88\x80\x80\x80"']
_NUL = [b'"\\u0000"', b'"a\\u0000b"', b'"\x00"', b'"a\x01b"', b'"tab\there"', b'"\x1f"']
_CONTROL_OK = [
    b'"a\\u0001b"',
    b'"\\u001f"',
    b'"\\u007f"',
    b'"\\u2028\\u2029"',
    b'"\\ud83d\\ude00"',
    b'"\\u0085\\ufeff"',
    b'"\\t\\n\\r"',
]


def unicode(r: Round, spec: TopicSpec) -> None:
    for event_type in EVENT_TYPES[spec.base_name]:
        fragment = r.draw(st.sampled_from(_SURROGATES + _BAD_UTF8 + _NUL))
        tenant, entity = r.tenant_entity(spec.base_name)
        event = r.maker.template(event_type, tenant, entity)
        paths = [*_nest_paths(event_type), ("event_id",), ("actor", "id")]
        if event_type in ("memory.proposed", "memory.corrected"):
            paths.append(("payload", "value", "text"))
        if event_type == "conversation.message_added":
            paths.append(("payload", "content", 0, "text"))
        path = r.draw(st.sampled_from(paths))
        r.add(
            planned_event(
                spec,
                event,
                Expect.DEAD,
                f"unicode:{event_type}:{path[-1]}:{fragment!r}",
                raw_at(event, path, fragment),
            )
        )
        # The same as a member name.
        fragment = r.draw(st.sampled_from(_SURROGATES + _BAD_UTF8 + _NUL))
        r.add(
            planned_event(
                spec,
                event,
                Expect.DEAD,
                f"unicode_name:{event_type}:{fragment!r}",
                member_in(
                    event,
                    r.draw(st.sampled_from([(), ("payload",)])),
                    fragment + b":1",
                    first=r.draw(st.booleans()),
                ),
            )
        )
        # Escaped control characters and astral characters are valid strings.
        fragment = r.draw(st.sampled_from(_CONTROL_OK))
        event = r.edge(event_type)
        path = r.draw(st.sampled_from(paths))
        r.add(
            planned_event(
                spec,
                event,
                Expect.EITHER,
                f"control:{event_type}:{path[-1]}:{fragment!r}",
                raw_at(event, path, fragment),
            )
        )
    # Control characters in the ids, and so in the key (which matches the body).
    event_type = r.draw(st.sampled_from(EVENT_TYPES[spec.base_name]))
    odd = r.draw(st.sampled_from(["\x01", "\x7f", "\u2028", "\U0001f600", "\t", "\ufeff"]))
    event = r.maker.template(event_type, EDGE_TENANT + odd, r.maker.fresh("h_odd_") + odd)
    r.add(planned_event(spec, event, Expect.EITHER, f"control_ids:{event_type}:{odd!r}"))
