"""The codec under the contract: valid events pass, everything else is refused with a reason."""

from __future__ import annotations

import orjson
import pytest
from pydantic import ValidationError

from streams.sample import EventFactory, to_message
from topics.codec import EventCodec, InvalidMessage
from topics.memory import MemoryProposed, MemoryVerified
from topics.outputs import DeadLetterReason
from topics.schemas import EventSchema, SchemaRegistry, default_schemas

MEMORY_TYPES = frozenset(
    {"memory.proposed", "memory.verified", "memory.corrected", "memory.revoked"}
)


@pytest.fixture
def codec() -> EventCodec:
    return EventCodec(default_schemas(), MEMORY_TYPES, {"value": 1024})


def refused(codec: EventCodec, key: bytes | None, value: bytes | None) -> DeadLetterReason:
    with pytest.raises(InvalidMessage) as caught:
        codec.decode(key, value)
    return caught.value.code


def test_valid_event_decodes_to_frozen_model(codec: EventCodec) -> None:
    key, value = to_message(EventFactory().proposed("t1", "m1"))
    event = codec.decode(key, value)
    assert isinstance(event, MemoryProposed)
    assert event.memory_id == "m1"
    with pytest.raises(ValidationError):
        event.tenant_id = "t2"  # type: ignore[misc]


def test_extra_fields_from_newer_producers_are_ignored(codec: EventCodec) -> None:
    raw = EventFactory().proposed("t1", "m1")
    raw["payload"]["confidence"] = 0.9
    raw["trace_id"] = "abc"
    assert isinstance(codec.decode(*to_message(raw)), MemoryProposed)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda raw: raw.update(schema_version=2), DeadLetterReason.UNKNOWN_SCHEMA_VERSION),
        (lambda raw: raw.update(schema_version="1"), DeadLetterReason.INVALID_EVENT),
        (
            lambda raw: raw.update(event_type="memory.forgotten"),
            DeadLetterReason.UNKNOWN_EVENT_TYPE,
        ),
        (
            lambda raw: raw.update(event_type="conversation.started"),
            DeadLetterReason.UNKNOWN_EVENT_TYPE,
        ),
        (lambda raw: raw["payload"].pop("subject"), DeadLetterReason.INVALID_EVENT),
        (lambda raw: raw.update(occurred_at="2026-08-08T09:30:00"), DeadLetterReason.INVALID_EVENT),
        (lambda raw: raw.update(tenant_id=""), DeadLetterReason.INVALID_EVENT),
        (lambda raw: raw.update(event_id="x" * 129), DeadLetterReason.INVALID_EVENT),
        (lambda raw: raw["actor"].update(type="robot"), DeadLetterReason.INVALID_EVENT),
        (
            lambda raw: raw["payload"].update(value={"blob": "x" * 2000}),
            DeadLetterReason.VALUE_TOO_LARGE,
        ),
    ],
)
def test_invalid_events_are_refused_with_a_reason(codec, mutate, expected) -> None:  # type: ignore[no-untyped-def]
    raw = EventFactory().proposed("t1", "m1")
    key, _ = to_message(raw)
    mutate(raw)
    assert refused(codec, key, orjson.dumps(raw)) is expected


def test_counts_beyond_a_postgresql_integer_are_invalid() -> None:
    schemas = default_schemas()
    codec = EventCodec(schemas, frozenset({"conversation.summary_updated"}))
    summary = EventFactory().summary("t1", "c1", 1, "text", ["x"])
    largest = {**summary, "payload": {**summary["payload"], "summary_version": 2**31 - 1}}
    too_large = {**summary, "payload": {**summary["payload"], "summary_version": 2**31}}
    assert codec.decode(*to_message(largest)).payload.summary_version == 2**31 - 1
    assert refused(codec, *to_message(too_large)) is DeadLetterReason.INVALID_EVENT


def test_key_must_match_the_body(codec: EventCodec) -> None:
    _, value = to_message(EventFactory().proposed("t1", "m1"))
    assert refused(codec, b"t1:m2", value) is DeadLetterReason.KEY_MISMATCH
    assert refused(codec, b"t2:m1", value) is DeadLetterReason.KEY_MISMATCH
    assert refused(codec, None, value) is DeadLetterReason.INVALID_KEY
    assert refused(codec, b"\xff\xfe", value) is DeadLetterReason.INVALID_KEY


def test_non_json_and_non_objects_are_malformed(codec: EventCodec) -> None:
    assert refused(codec, b"t1:m1", b"{nope") is DeadLetterReason.MALFORMED_JSON
    assert refused(codec, b"t1:m1", b"[1, 2]") is DeadLetterReason.MALFORMED_JSON
    assert refused(codec, b"t1:m1", None) is DeadLetterReason.EMPTY_VALUE


def test_known_older_versions_are_upcast_step_by_step() -> None:
    def v1_to_v2(raw: dict) -> dict:  # type: ignore[type-arg]
        raw["payload"]["verification"] = raw["payload"].pop("method")
        return raw

    def v2_to_v3(raw: dict) -> dict:  # type: ignore[type-arg]
        raw["payload"]["verification"] = raw["payload"]["verification"].lower()
        return raw

    schemas = SchemaRegistry([EventSchema(MemoryVerified, 3, {1: v1_to_v2, 2: v2_to_v3})])
    codec = EventCodec(schemas, frozenset({"memory.verified"}))
    raw = EventFactory().verified("t1", "m1", 1)
    raw["payload"]["method"] = raw["payload"].pop("verification").upper()
    event = codec.decode(*to_message(raw))
    assert isinstance(event, MemoryVerified)
    assert event.payload.verification == "user_supplied"
    assert event.schema_version == 3

    raw["schema_version"] = 4
    assert refused(codec, *to_message(raw)) is DeadLetterReason.UNKNOWN_SCHEMA_VERSION


def test_body_hash_ignores_serialisation_details(codec: EventCodec) -> None:
    raw = EventFactory().proposed("t1", "m1")
    key, compact = to_message(raw)
    spaced = orjson.dumps(raw, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    assert codec.decode(key, compact).body_hash() == codec.decode(key, spaced).body_hash()
    raw["payload"]["value"] = {"text": "different"}
    assert (
        codec.decode(key, orjson.dumps(raw)).body_hash() != codec.decode(key, compact).body_hash()
    )


def test_a_nul_character_anywhere_is_invalid_and_escaped_backslashes_are_not(
    codec: EventCodec,
) -> None:
    f = EventFactory()
    nul_value = f.proposed("t1", "m1", value={"notes": ["fine", {"deep": "a\x00b"}]})
    nul_key = f.proposed("t1", "m2", value={"a\x00": "b"})
    nul_tenant = f.proposed("t\x00", "m3")
    for raw in (nul_value, nul_key, nul_tenant):
        with pytest.raises(InvalidMessage) as refused:
            codec.decode(*to_message(raw))
        assert refused.value.code is DeadLetterReason.INVALID_EVENT
        assert "NUL" in refused.value.detail
    # A backslash followed by "u0000" is text, not a NUL character.
    literal = f.proposed("t1", "m4", value={"text": "\\u0000"})
    assert codec.decode(*to_message(literal)).payload.value == {"text": "\\u0000"}
