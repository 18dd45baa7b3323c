"""Integrity of the seal: what the associated data binds, legacy events and keys,
and sealed deletion probes. No services."""

from __future__ import annotations

import asyncio
import base64
import struct
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from projections.sealing.codec import SealedCodec
from projections.sealing.crypto import (
    Unreadable,
    encode_associated,
    new_data_key,
    seal_fields,
    wrap_key,
)
from projections.sealing.fields import (
    SEAL_FORMAT,
    SEAL_FORMAT_SOURCE_KEY,
    SEAL_FORMAT_SOURCED,
    SOURCE_KEY_ENTITY,
    EntityRef,
    combined_key,
    entity_name,
    seal,
    sealed_event_associated,
    unseal,
)
from projections.sealing.keys import KeyStore, wrap_associated
from projections.sealing.probes import ProbeSealer
from projections.sql import KeyLookups
from streams.sample import EventFactory, to_message
from support.examples import examples
from topics.codec import EventCodec, InvalidMessage
from topics.outputs import DeadLetterReason
from topics.schemas import default_schemas

KEY = new_data_key()
MASTER = new_data_key()


def any_key(ref: EntityRef) -> bytes:
    """The same data key for every entity: only the associated data can tell an edit."""
    return KEY


def through_the_log(event: dict[str, Any]) -> dict[str, Any]:
    """As the decoder sees it: the sealer's bytes, parsed again."""
    return orjson.loads(orjson.dumps(event))  # type: ignore[no-any-return]


def legacy_seal(event: dict[str, Any], data_key: bytes) -> dict[str, Any]:
    """An event as the sealer wrote it before format 2: no ``v``, bound to the event id."""
    payload = dict(event["payload"])
    personal = {"value": payload.pop("value")}
    payload["sealed"] = {
        "entity": f"memory:{payload['memory_id']}",
        "fields": seal_fields(data_key, personal, event["event_id"].encode()),
    }
    return {**event, "payload": payload}


# --- the associated data --------------------------------------------------------------------

_ids = st.text(alphabet=st.sampled_from(':"\\/%a1 é\x00'), max_size=6)


@given(st.lists(_ids, min_size=1, max_size=4), st.lists(_ids, min_size=1, max_size=4))
def test_associated_data_of_different_parts_is_different(a: list[str], b: list[str]) -> None:
    assert (encode_associated(*a) == encode_associated(*b)) == (a == b)


def test_format_2_key_wrapping_tells_apart_what_format_1_confused() -> None:
    one, other = ("a:memory:b", "memory", "c"), ("a", "memory", "b:memory:c")
    assert entity_name(one) == entity_name(other)  # why format 1 is ambiguous
    assert wrap_associated(one, 1) == wrap_associated(other, 1)
    assert wrap_associated(one, 2) != wrap_associated(other, 2)
    store, data_key = KeyStore(MASTER, KeyLookups()), new_data_key()
    wrapped = store.wrap(one, data_key)
    assert store.unwrap(one, wrapped, 2) == data_key
    with pytest.raises(Unreadable):
        store.unwrap(other, wrapped, 2)
    with pytest.raises(Unreadable):
        store.unwrap(one, wrapped, 1)  # a format can not be claimed for another's key
    with pytest.raises(ValueError):
        store.unwrap(one, wrapped, 3)


def test_keys_wrapped_before_format_2_still_open() -> None:
    ref, data_key = ("t1", "memory", "m1"), new_data_key()
    legacy = wrap_key(MASTER, data_key, "t1:memory:m1")  # as written before migration 008
    assert KeyStore(MASTER, KeyLookups()).unwrap(ref, legacy, 1) == data_key
    with pytest.raises(Unreadable):
        KeyStore(MASTER, KeyLookups()).unwrap(ref, legacy, 2)


_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
_json = st.recursive(
    _json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(examples(200, 40))
@given(value=st.dictionaries(st.text(max_size=8), _json, max_size=5), extra=_json, tenant=_ids)
def test_what_the_sealer_binds_is_what_the_reader_rebuilds(
    value: dict[str, Any], extra: Any, tenant: str
) -> None:
    raw = EventFactory().proposed(tenant or "t", "m:1", value=value)
    raw["payload"]["unknown_extension"] = extra  # floats, big integers, any strings
    sealed = seal(raw, KEY)
    read = through_the_log(sealed)
    assert sealed_event_associated(read) == sealed_event_associated(sealed)
    assert unseal(read, any_key) == raw


# --- tampering ------------------------------------------------------------------------------

_EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "tenant_id": lambda e: e.update(tenant_id="t2"),
    "event_id": lambda e: e.update(event_id="evt-other"),
    "event_type": lambda e: e.update(event_type="memory.corrected"),
    "occurred_at": lambda e: e.update(occurred_at="2026-08-08T09:00:02Z"),
    "schema_version": lambda e: e.update(schema_version=2),
    "actor": lambda e: e["actor"].update(id="someone"),
    "subject": lambda e: e["payload"]["subject"].update(id="mallory"),
    "memory_id": lambda e: e["payload"].update(memory_id="m2"),
    "kind": lambda e: e["payload"].update(kind="goal"),
    "source": lambda e: e["payload"]["source"].update(ref="conv_9/msg_9"),
    "observed_at": lambda e: e["payload"].update(observed_at="2026-01-01T00:00:00Z"),
    "an added field": lambda e: e["payload"].update(expires_at="2030-01-01T00:00:00Z"),
    "a removed field": lambda e: e["payload"].pop("observed_at"),
    "sealed.entity": lambda e: e["payload"]["sealed"].update(entity="memory:m2"),
    "sealed.v removed": lambda e: e["payload"]["sealed"].pop("v"),
    "sealed.v unknown": lambda e: e["payload"]["sealed"].update(v=5),
    "sealed.v as format 3": lambda e: e["payload"]["sealed"].update(v=3),
    "sealed.v under one key": lambda e: e["payload"]["sealed"].update(v=2),
    "sealed.v as text": lambda e: e["payload"]["sealed"].update(v="2"),
    "sealed.v as bool": lambda e: e["payload"]["sealed"].update(v=True),
}


@pytest.mark.parametrize("edit", sorted(_EDITS))
def test_an_edit_of_any_bound_field_makes_the_seal_fail_to_open(edit: str) -> None:
    sealed = through_the_log(seal(EventFactory().proposed("t1", "m1", value={"x": 1.5}), KEY))
    # The factory's source is a message: sealed under the memory's and the conversation's
    # source key.
    assert sealed["payload"]["sealed"]["v"] == SEAL_FORMAT_SOURCE_KEY
    assert unseal(through_the_log(sealed), any_key)["payload"]["value"] == {"x": 1.5}
    _EDITS[edit](sealed)
    with pytest.raises(Unreadable):
        unseal(sealed, any_key)


def test_a_ciphertext_moved_to_another_event_of_the_same_entity_does_not_open() -> None:
    f = EventFactory()
    first = seal(f.proposed("t1", "m1", value={"text": "a"}), KEY)
    second = seal(f.corrected("t1", "m1", 1, {"text": "b"}), KEY)
    second["payload"]["sealed"]["fields"] = first["payload"]["sealed"]["fields"]
    with pytest.raises(Unreadable):
        unseal(second, any_key)


@pytest.mark.parametrize("edited_to", ["memory.verified", "memory.revoked", "x.unknown"])
def test_a_seal_on_an_event_type_without_personal_fields_is_unreadable(edited_to: str) -> None:
    sealed = seal(EventFactory().proposed("t1", "m1"), KEY)
    with pytest.raises(Unreadable):
        unseal({**sealed, "event_type": edited_to}, any_key)


def test_personal_fields_in_plaintext_on_the_sealed_log_are_unreadable() -> None:
    raw = EventFactory().proposed("t1", "m1", value={"text": "forged"})
    with pytest.raises(Unreadable):
        unseal(raw, any_key)
    # Sealed fields may only restore the event type's personal fields, nothing else.
    sealed = seal(raw, KEY)
    payload = sealed["payload"]
    payload["sealed"]["fields"] = seal_fields(
        KEY, {"value": {}, "kind": "goal"}, sealed_event_associated(sealed)
    )
    with pytest.raises(Unreadable):
        unseal(sealed, any_key)


def test_events_sealed_before_format_2_open_bound_to_their_event_id_only() -> None:
    raw = EventFactory().proposed("t1", "m1", value={"text": "old"})
    legacy = through_the_log(legacy_seal(raw, KEY))
    assert "v" not in legacy["payload"]["sealed"]
    assert unseal(legacy, any_key) == raw
    # The documented limit of format 1: its other fields are not bound ...
    edited = {**legacy, "occurred_at": "2026-01-01T00:00:00Z"}
    assert unseal(edited, any_key)["payload"]["value"] == {"text": "old"}
    # ... but its event id is, and it cannot be upgraded to format 2 by hand.
    with pytest.raises(Unreadable):
        unseal({**legacy, "event_id": "evt-other"}, any_key)
    upgraded = through_the_log(legacy)
    upgraded["payload"]["sealed"]["v"] = SEAL_FORMAT
    with pytest.raises(Unreadable):
        unseal(upgraded, any_key)


def test_the_sealed_codec_dead_letters_edited_events_as_unreadable_seal() -> None:
    class Keys:
        async def keys(self, conn: object, refs: list[EntityRef]) -> dict[EntityRef, bytes]:
            return {ref: KEY for ref in refs}

        async def rekeyed(self, conn: object, refs: list[EntityRef]) -> set[EntityRef]:
            return set()

    schemas = default_schemas()
    memory_types = frozenset(t for t in schemas.event_types() if t.startswith("memory."))
    codec = SealedCodec(EventCodec(schemas, memory_types), Keys())  # type: ignore[arg-type]
    f = EventFactory()
    raw = f.proposed("t1", "m1", value={"text": "secret"})
    key, _ = to_message(raw)
    sealed = seal(raw, KEY)
    subject = through_the_log(sealed)
    subject["payload"]["subject"]["id"] = "mallory"
    verified = {**sealed, "event_type": "memory.verified", "payload": {**sealed["payload"]}}
    verified["payload"]["expected_version"] = 1
    good = orjson.dumps(sealed)
    edited = [orjson.dumps(subject), orjson.dumps(verified)]
    asyncio.run(codec.load_keys(None, [good, *edited]))  # type: ignore[arg-type]

    assert codec.decode(key, good).payload.value == {"text": "secret"}
    for value in edited:
        with pytest.raises(InvalidMessage) as raised:
            codec.decode(key, value)
        assert raised.value.code == DeadLetterReason.UNREADABLE_SEAL


def test_a_legacy_event_and_a_format_2_event_open_side_by_side_in_one_batch() -> None:
    f = EventFactory()
    old, new = f.proposed("t1", "m1", value={"a": 1}), f.proposed("t1", "m2", value={"b": 2})
    values = [orjson.dumps(legacy_seal(old, KEY)), orjson.dumps(seal(new, KEY))]
    assert [unseal(orjson.loads(v), any_key) for v in values] == [old, new]


# --- probes ---------------------------------------------------------------------------------

_VECTOR = [0.25, -0.5, 0.125, 0.0] * 64


def test_a_sealed_probe_holds_nothing_of_the_vector_and_opens_to_it_exactly() -> None:
    probes = ProbeSealer(MASTER)
    sealed = probes.seal("t1", "d1", "memory", "m1", _VECTOR)
    plain = struct.pack(f"<{len(_VECTOR)}f", *_VECTOR)
    assert plain not in sealed and plain[:16] not in sealed
    assert base64.b64encode(plain[:12]) not in base64.b64encode(sealed)
    assert probes.open("t1", "d1", "memory", "m1", sealed) == _VECTOR
    # Two seals of one vector differ (a fresh nonce): equal probes cannot be told apart.
    assert probes.seal("t1", "d1", "memory", "m1", _VECTOR) != sealed


@pytest.mark.parametrize(
    "where",
    [("t2", "d1", "memory", "m1"), ("t1", "d2", "memory", "m1"), ("t1", "d1", "message", "m1"),
     ("t1", "d1", "memory", "m2"), ("t1:d1", "", "memory", "m1")],
)  # fmt: skip
def test_a_probe_opens_only_where_it_was_sealed(where: tuple[str, str, str, str]) -> None:
    sealed = ProbeSealer(MASTER).seal("t1", "d1", "memory", "m1", _VECTOR)
    with pytest.raises(Unreadable):
        ProbeSealer(MASTER).open(*where, sealed)


def test_a_probe_needs_the_master_key() -> None:
    sealed = ProbeSealer(MASTER).seal("t1", "d1", "memory", "m1", _VECTOR)
    with pytest.raises(Unreadable):
        ProbeSealer(new_data_key()).open("t1", "d1", "memory", "m1", sealed)


_CONVERSATION_KEYS = {
    ("t1", "memory", "m1"): new_data_key(),
    ("t1", "conversation", "conv_1"): new_data_key(),
    ("t1", SOURCE_KEY_ENTITY, "conv_1"): new_data_key(),
}


def _keys_without(*gone: EntityRef) -> Callable[[EntityRef], bytes | None]:
    """The keys of memory m1 and conversation conv_1, but those ``gone`` (shredded)."""
    return lambda ref: None if ref in gone else _CONVERSATION_KEYS.get(ref)


def test_a_value_taken_from_a_conversation_outlives_the_content_key_not_the_source_key() -> None:
    raw = EventFactory().proposed("t1", "m1", value={"text": "kept"})  # from conv_1/msg_1
    sealed = through_the_log(seal(raw, _keys_without()))
    content_erased = _keys_without(("t1", "conversation", "conv_1"))
    assert unseal(sealed, content_erased)["payload"]["value"] == {"text": "kept"}
    with pytest.raises(Unreadable):
        unseal(sealed, _keys_without(("t1", SOURCE_KEY_ENTITY, "conv_1")))


def test_format_3_values_still_open_under_the_content_key() -> None:
    keys = _keys_without()
    raw = EventFactory().proposed("t1", "m1", value={"text": "old"})
    payload = dict(raw["payload"])
    personal = {"value": payload.pop("value")}
    payload["sealed"] = {"v": SEAL_FORMAT_SOURCED, "entity": "memory:m1"}
    event = {**raw, "payload": payload}
    refs = (("t1", "memory", "m1"), ("t1", "conversation", "conv_1"))
    payload["sealed"]["fields"] = seal_fields(
        combined_key(refs, keys), personal, sealed_event_associated(event)
    )
    assert unseal(through_the_log(event), keys)["payload"]["value"] == {"text": "old"}
    with pytest.raises(Unreadable):
        unseal(through_the_log(event), _keys_without(("t1", "conversation", "conv_1")))
