"""Forgeries on the records memproj publishes: ``memory.current`` (a memory's current
record) and ``conversation.messages`` (a conversation's sealed message).
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import strategies as st

from streams.sample import iso
from support.hostile.json_surgery import nested, raw_at
from support.hostile.making import Maker, Round, wrong_and_missing
from support.hostile.plan import CLOCK, FORGED_TENANT, Expect, Planned
from support.hostile.values import (
    BIG_INTS,
    GARBAGE,
    HUGE,
    INTS,
    SMALL_LISTS,
    STRINGS,
)
from topics.registry import TopicSpec


def memory_record(maker: Maker, tenant: str = FORGED_TENANT) -> dict[str, Any]:
    memory_id = maker.fresh("h_cur_")
    return {
        "tenant_id": tenant,
        "memory_id": memory_id,
        "subject": {"type": "user", "id": "nobody"},
        "scope": "user",
        "kind": "fact",
        "value": {"text": "forged"},
        "source": {"type": "crm", "ref": "x"},
        "status": "verified",
        "version": 1,
        "observed_at": iso(CLOCK),
        "created_at": iso(CLOCK),
        "updated_at": iso(CLOCK),
        "last_event_id": "h-forged",
    }


_RECORD_WRONG: dict[str, st.SearchStrategy[Any]] = {
    "subject": st.one_of(
        st.sampled_from(["user:1", {"type": "user"}, {"type": 5, "id": "a"}]),
        st.none(),
        SMALL_LISTS,
    ),
    "value": st.one_of(STRINGS, st.none(), SMALL_LISTS, INTS),
    "status": st.one_of(st.sampled_from(["deleted", ""]), st.none(), INTS),
    "version": st.one_of(st.sampled_from(["abc", 1.5]), st.none(), SMALL_LISTS),
    "observed_at": st.one_of(st.sampled_from(["yesterday", "2026-08-08T09:30:00"]), st.none()),
    "source": st.one_of(st.sampled_from(["x", {"type": "crm"}]), st.none()),
    "tenant_id": st.one_of(INTS, st.none(), st.just("")),
    "memory_id": st.one_of(INTS, st.none(), st.just("x" * 200)),
}


def forged_current(r: Round, spec: TopicSpec) -> None:
    for name, wrong in _RECORD_WRONG.items():
        record = memory_record(r.maker)
        key = f"{FORGED_TENANT}:{record['memory_id']}".encode()
        record[name] = r.draw(wrong)
        r.add(Planned(spec, key, orjson.dumps(record), Expect.DEAD, f"current_wrong:{name}"))
    record = memory_record(r.maker)
    key = f"{FORGED_TENANT}:{record['memory_id']}".encode()
    del record[r.draw(st.sampled_from(["subject", "value", "status", "version", "created_at"]))]
    r.add(Planned(spec, key, orjson.dumps(record), Expect.DEAD, "current_missing"))
    garbage = r.draw(GARBAGE)
    if garbage:  # an empty value is a null on a compacted topic: the memory is gone
        r.add(Planned(spec, key, garbage, Expect.DEAD, "current_garbage"))
    nest = r.draw(st.integers(300, 10_000))
    deep = raw_at(memory_record(r.maker), ("value", "deep"), nested(nest, True))
    r.add(Planned(spec, key, deep, Expect.DEAD, f"current_nesting:{nest}"))
    # Keys and headers that are not UTF-8: they name no memory.
    bad = r.draw(st.sampled_from([b"\xff\xfe", b"forged:\xc0\x80", b"\xed\xa0\x80:m"]))
    r.add(Planned(spec, bad, None, Expect.DEAD, "current_bad_key_null"))
    r.add(
        Planned(
            spec, bad, orjson.dumps(memory_record(r.maker)), Expect.DEAD, "current_bad_key_record"
        )
    )
    r.add(
        Planned(
            spec,
            key,
            None,
            Expect.DEAD,
            "current_bad_header",
            headers=(("tenant_id", b"\xff"), ("entity_id", b"m")),
        )
    )
    # (A compacted topic takes no message without a key: the broker refuses it.)
    # Legitimate: a null (the memory is gone), an empty value, a well-formed record of a
    # memory nobody has (stale for the index), odd content.
    legit: list[tuple[str, bytes | None, bytes | None]] = [
        ("current_null", key, None),
        ("current_empty", key, b""),
        ("current_unknown", key, orjson.dumps(memory_record(r.maker))),
        (
            "current_huge_number",
            key,
            raw_at(
                memory_record(r.maker), ("value", "n"), r.draw(st.sampled_from(HUGE + BIG_INTS))
            ),
        ),
        ("current_nul", key, orjson.dumps({**memory_record(r.maker), "scope": "a\x00b"})),
    ]
    for name, legit_key, value in legit:
        r.add(Planned(spec, legit_key, value, Expect.EITHER, name))


def conversation_message(maker: Maker, tenant: str = FORGED_TENANT) -> dict[str, Any]:
    return {
        "tenant_id": tenant,
        "conversation_id": maker.fresh("h_cm_"),
        "message_id": "m1",
        "seq": 1,
        "role": "user",
        "content": [{"type": "text", "text": "forged"}],
        "occurred_at": iso(CLOCK),
        "event_id": maker.fresh("h-cm-"),
        "redactions": {},
        "owner_type": "user",
        "owner_id": "nobody",
    }


_MESSAGE_REQUIRED = [
    "tenant_id",
    "conversation_id",
    "message_id",
    "owner_type",
    "owner_id",
    "content",
    "occurred_at",
    "event_id",
]

_MESSAGE_WRONG: dict[str, st.SearchStrategy[Any]] = {
    "content": st.one_of(INTS, st.none(), st.booleans()),
    "occurred_at": st.one_of(
        st.sampled_from(["yesterday", "", "2026-13-01T00:00:00Z"]),
        INTS,
        st.none(),
        SMALL_LISTS,
    ),
}


def forged_messages(r: Round, spec: TopicSpec) -> None:
    message, key = wrong_and_missing(
        r,
        spec,
        lambda: conversation_message(r.maker),
        "conversation_id",
        _MESSAGE_WRONG,
        _MESSAGE_REQUIRED,
        "message",
    )
    for name, value in [
        ("message_garbage", r.draw(GARBAGE)),
        ("message_null", None),
        ("message_empty", b""),
        ("message_scalar", r.draw(st.sampled_from([b"[]", b"5", b'"x"', b"true", b"null"]))),
    ]:
        r.add(Planned(spec, key, value, Expect.DEAD, name))
    nest = r.draw(st.integers(1100, 10_000))
    deep = raw_at(message, ("content", 0, "x"), nested(nest, False))
    r.add(Planned(spec, key, deep, Expect.DEAD, f"message_nesting:{nest}"))
    # Well-formed but of nothing the projection holds, or with odd values the indexer does
    # not look at (a message it does not hold is stale, whatever it says).
    legit = [
        ("message_unknown", conversation_message(r.maker)),
        (
            "message_naive_time",
            {**conversation_message(r.maker), "occurred_at": "2026-08-08T09:30:00"},
        ),
        ("message_number_tenant", {**conversation_message(r.maker), "tenant_id": 5}),
        ("message_string_content", {**conversation_message(r.maker), "content": "abc"}),
    ]
    for name, body in legit:
        r.add(Planned(spec, key, orjson.dumps(body), Expect.EITHER, name))
