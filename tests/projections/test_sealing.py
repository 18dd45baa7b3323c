"""Sealing and opening personal fields, with no services."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from projections.deletion.erasure import Erasure, ErasureIndex, memory_key
from projections.memory.reducer import reduce_batch
from projections.sealing.codec import SealedCodec
from projections.sealing.crypto import (
    Unreadable,
    new_data_key,
    open_fields,
    parse_master_key,
    seal_fields,
    unwrap_key,
    wrap_key,
)
from projections.sealing.fields import (
    EntityRef,
    Shredded,
    entity_of,
    entity_of_event,
    seal,
    seal_erased,
    unseal,
    with_placeholders,
)
from projections.sealing.keys import KeyStore
from projections.sealing.sealer import Sealer, SealingState, event_sealing_keys
from projections.sql import KeyLookups
from streams.sample import EventFactory, to_message
from support.new_event_type import annotated, register_annotations, schemas_with_annotations
from topics.codec import EventCodec, InvalidMessage
from topics.memory import MEMORY_EVENT_TYPES, MemoryCorrected, MemoryProposed
from topics.outputs import DeadLetterReason
from topics.personal import PERSONAL_EVENTS
from topics.registry import CONVERSATION_EVENTS, MEMORY_EVENTS, TopicNames
from topics.schemas import EventSchema, SchemaRegistry, default_schemas

MASTER = new_data_key()


def test_data_keys_are_wrapped_for_one_entity_only() -> None:
    key = new_data_key()
    wrapped = wrap_key(MASTER, key, "t1:memory:m1")
    assert unwrap_key(MASTER, wrapped, "t1:memory:m1") == key
    with pytest.raises(Unreadable):
        unwrap_key(MASTER, wrapped, "t1:memory:m2")
    with pytest.raises(Unreadable):
        unwrap_key(new_data_key(), wrapped, "t1:memory:m1")


def test_sealed_fields_open_only_with_their_key_and_event() -> None:
    key = new_data_key()
    sealed = seal_fields(key, {"value": {"text": "allergic to peanuts"}}, "e1")
    assert "peanuts" not in sealed
    assert open_fields(key, sealed, "e1") == {"value": {"text": "allergic to peanuts"}}
    with pytest.raises(Unreadable):
        open_fields(key, sealed, "e2")  # moved to another event
    with pytest.raises(Unreadable):
        open_fields(new_data_key(), sealed, "e1")


def test_personal_fields_per_event_type() -> None:
    f = EventFactory()
    key = new_data_key()
    for raw, field in (
        (f.proposed("t1", "m1", value={"text": "secret"}), "value"),
        (f.corrected("t1", "m1", 1, {"text": "secret"}), "value"),
        (f.message("t1", "c1", "x", "user", "secret"), "content"),
        (f.summary("t1", "c1", 1, "secret", ["x"]), "text"),
    ):
        sealed = seal(raw, key)
        assert field not in sealed["payload"] and b"secret" not in orjson.dumps(sealed)
        assert unseal(sealed, lambda ref: key) == raw
        with pytest.raises(Shredded):
            unseal(sealed, lambda ref: None)
        erased = seal_erased(raw)
        assert b"secret" not in orjson.dumps(erased)
        with pytest.raises(Shredded):
            unseal(erased, lambda ref: key)
    verified = f.verified("t1", "m1", 1)
    assert entity_of(verified) is None and seal(verified, key) == verified


def test_an_events_entity_is_the_same_from_its_identity_as_from_its_body() -> None:
    schemas = default_schemas()
    codec = EventCodec(schemas, schemas.event_types())
    f = EventFactory()
    for raw in (
        f.proposed("t1", "m1"),
        f.corrected("t1", "m1", 1, {"text": "x"}),
        f.verified("t1", "m1", 1),
        f.revoked("t1", "m1", expected_version=2),
        f.message("t1", "c1", "x", "user", "hello"),
        f.summary("t1", "c1", 1, "text", ["x"]),
    ):
        event = codec.decode(*to_message(raw))
        by_identity = entity_of_event(event.event_type, event.tenant_id, event.entity_id)
        assert by_identity == entity_of(event.model_dump(mode="json")) == entity_of(raw)


def test_the_sealer_writes_nothing_readable_of_an_erased_entity() -> None:
    schemas = default_schemas()
    codec = EventCodec(schemas, schemas.event_types())
    f = EventFactory(clock=datetime(2026, 9, 1, tzinfo=UTC))
    late = codec.decode(*to_message(f.proposed("t1", "m1", value={"text": "late secret"})))
    fresh = codec.decode(*to_message(f.proposed("t1", "m2", value={"text": "fresh"})))
    sealer = Sealer(schemas, TopicNames(), None, 65536)  # type: ignore[arg-type]
    erasures = ErasureIndex(
        {
            memory_key("t1", "m1"): Erasure(
                "d1", datetime(2026, 9, 1, tzinfo=UTC) + timedelta(hours=1)
            )
        }
    )
    key = new_data_key()
    keys = {ref: key for ref in event_sealing_keys(fresh)}
    out = sealer.reduce([late, fresh], SealingState(keys, erasures), {})
    assert out.erased == 1
    first, second = (orjson.loads(m.value or b"") for m in out.messages)
    assert first["payload"]["sealed"] == {"entity": "memory:m1", "erased": True}
    assert b"late secret" not in out.messages[0].value  # type: ignore[operator]
    assert unseal(second, lambda ref: key)["payload"]["value"] == {"text": "fresh"}
    assert [m.topic for m in out.messages] == ["memory.events.sealed", "memory.events.sealed"]


def test_the_master_key_must_be_32_bytes_of_base64() -> None:
    with pytest.raises(ValueError):
        parse_master_key("not base64!")
    with pytest.raises(ValueError):
        parse_master_key("c2hvcnQ=")


def test_an_event_whose_key_was_shredded_keeps_its_identity_and_is_never_applied() -> None:
    schemas = default_schemas()
    inner = EventCodec(schemas, frozenset(t for t in schemas.event_types() if "memory." in t))
    raw = EventFactory().proposed("t1", "m1", value={"text": "secret"})
    key, _ = to_message(raw)
    sealed = orjson.dumps(seal(raw, new_data_key()))
    codec = SealedCodec(inner, None)  # type: ignore[arg-type]  # no keys loaded: all shredded

    event = codec.decode(key, sealed)

    assert isinstance(event, MemoryProposed) and not event.readable
    assert (event.event_id, event.memory_id, event.payload.value) == (raw["event_id"], "m1", {})
    readable = inner.decode(key, orjson.dumps({**raw, "payload": {**raw["payload"], "value": {}}}))
    assert readable.readable and event.body_hash() == readable.body_hash()
    result = reduce_batch([event], {}, {})
    assert result.shredded == 1 and not result.records and not result.rejections


def test_bad_messages_in_a_sealed_batch_become_dead_letters_not_a_failed_batch() -> None:
    class Keys:
        async def keys(self, conn: object, refs: list[EntityRef]) -> dict[EntityRef, bytes]:
            return {ref: data_key for ref in sorted(set(refs))}  # as KeyStore orders them

        async def rekeyed(self, conn: object, refs: list[EntityRef]) -> set[EntityRef]:
            return set()

    schemas = default_schemas()
    inner = EventCodec(schemas, frozenset(t for t in schemas.event_types() if "memory." in t))
    codec = SealedCodec(inner, Keys())  # type: ignore[arg-type]  # only keys() is used
    data_key = new_data_key()
    f = EventFactory()
    proposed, verified = f.proposed("t1", "m1", value={"text": "secret"}), f.verified("t1", "m1", 1)
    good = [(to_message(raw)[0], orjson.dumps(seal(raw, data_key))) for raw in (proposed, verified)]
    bad = [
        orjson.dumps({**proposed, "payload": []}),
        orjson.dumps({**proposed, "payload": {"sealed": {}}}),
        orjson.dumps({**proposed, "payload": {**proposed["payload"], "sealed": "x"}}),
        # Ids of the wrong type: they must not reach the key store or the cipher.
        orjson.dumps({**seal(proposed, data_key), "tenant_id": 7}),
        orjson.dumps({**seal(proposed, data_key), "tenant_id": ["t1"]}),
        orjson.dumps({**seal(proposed, data_key), "event_id": 7}),
        orjson.dumps(
            {**proposed, "payload": {**proposed["payload"], "memory_id": 7, "sealed": {}}}
        ),
        b"{not json",
        None,
    ]

    asyncio.run(codec.load_keys(None, [value for _, value in good] + bad))  # type: ignore[arg-type]

    assert [codec.decode(key, value).event_id for key, value in good] == [
        proposed["event_id"],
        verified["event_id"],
    ]
    assert codec.decode(good[0][0], good[0][1]).payload.value == {"text": "secret"}
    for value in bad:
        with pytest.raises(InvalidMessage):
            codec.decode(good[0][0], value)


def _through_the_sealed_log(raws: list[dict], schemas: SchemaRegistry | None = None) -> list[Any]:  # type: ignore[type-arg]
    """Raw events decoded as the sealer decodes them, sealed, and decoded again as the
    memory projection (and a replay) reads the sealed log."""

    class Keys:
        async def keys(self, conn: object, refs: list[EntityRef]) -> dict[EntityRef, bytes]:
            return {ref: data_key for ref in refs}

        async def rekeyed(self, conn: object, refs: list[EntityRef]) -> set[EntityRef]:
            return set()

    schemas = schemas or default_schemas()
    memory_types = frozenset(t for t in schemas.event_types() if t.startswith("memory."))
    data_key = new_data_key()
    sealer = Sealer(schemas, TopicNames(), None, 65536)  # type: ignore[arg-type]
    events = [sealer.codec.decode(*to_message(raw)) for raw in raws]
    keys = {ref: data_key for e in events for ref in event_sealing_keys(e)}
    sealed = sealer.reduce(events, SealingState(keys, ErasureIndex({})), {}).messages
    codec = SealedCodec(EventCodec(schemas, memory_types), Keys())  # type: ignore[arg-type]
    asyncio.run(codec.load_keys(None, [m.value for m in sealed]))  # type: ignore[arg-type]
    return [codec.decode(m.key, m.value) for m in sealed]


def test_an_omitted_expires_at_stays_omitted_through_seal_and_unseal() -> None:
    f = EventFactory()
    expires = f.clock + timedelta(days=3)
    omitted = f.corrected("t1", "m1", 1, {"text": "a"})
    null = f.corrected("t1", "m1", 2, {"text": "b"})
    null["payload"]["expires_at"] = None
    given = f.corrected("t1", "m1", 3, {"text": "c"}, expires_at=expires)

    first, second, third = _through_the_sealed_log([omitted, null, given])

    assert isinstance(first, MemoryCorrected)
    assert (first.payload.expiry_given, first.payload.value) == (False, {"text": "a"})
    assert (second.payload.expiry_given, second.payload.expires_at) == (True, None)
    assert (third.payload.expiry_given, third.payload.expires_at) == (True, expires)
    # Nothing else changed on the way: the sealed copy is the same event.
    for raw, event in zip((omitted, null, given), (first, second, third), strict=True):
        assert (
            event.body_hash()
            == EventCodec(default_schemas(), frozenset({raw["event_type"]}))
            .decode(*to_message(raw))
            .body_hash()
        )


def test_the_sealed_log_keeps_omissions_but_not_personal_fields() -> None:
    f = EventFactory()
    raw = f.corrected("t1", "m1", 1, {"text": "secret"})
    schemas = default_schemas()
    sealer = Sealer(schemas, TopicNames(), None, 65536)  # type: ignore[arg-type]
    event = sealer.codec.decode(*to_message(raw))
    state = SealingState(dict.fromkeys(event_sealing_keys(event), new_data_key()), ErasureIndex({}))
    (message,) = sealer.reduce([event], state, {}).messages
    payload = orjson.loads(message.value or b"")["payload"]
    assert "expires_at" not in payload and "verification" not in payload
    assert b"secret" not in (message.value or b"")


def test_an_upcast_correction_keeps_its_omitted_expires_at() -> None:
    # The slow path (an older schema_version, upcast before validation) keeps omissions too.
    schemas = SchemaRegistry(
        [
            *(EventSchema(m) for m in MEMORY_EVENT_TYPES if m is not MemoryCorrected),
            EventSchema(MemoryCorrected, 2, {1: lambda raw: raw}),
        ]
    )
    codec = EventCodec(schemas, schemas.event_types())
    raw = EventFactory().corrected("t1", "m1", 1, {"text": "a"})
    assert raw["schema_version"] == 1
    event = codec.decode(*to_message(raw))
    assert isinstance(event, MemoryCorrected) and not event.payload.expiry_given
    null = dict(raw, payload=dict(raw["payload"], expires_at=None))
    assert codec.decode(*to_message(null)).payload.expiry_given
    (sealed,) = _through_the_sealed_log([raw], schemas)
    assert sealed.schema_version == 2 and not sealed.payload.expiry_given


def test_corrections_sealed_before_1_1_read_their_explicit_null_as_removing_the_expiry() -> None:
    # Sealed events written before contract 1.1 carry every default, so an omitted
    # expires_at was written as null: they are read as written, as they were applied then.
    f = EventFactory()
    schemas = default_schemas()
    inner = EventCodec(schemas, frozenset(t for t in schemas.event_types() if "memory." in t))
    proposal = f.proposed("t1", "m1", expires_at=f.clock + timedelta(days=3))
    correction = f.corrected("t1", "m1", 1, {"text": "b"})
    data_key = new_data_key()
    old_format = [
        orjson.dumps(seal(inner.decode(*to_message(raw)).model_dump(mode="json"), data_key))
        for raw in (proposal, correction)
    ]
    assert b'"expires_at":null' in old_format[1]

    class Keys:
        async def keys(self, conn: object, refs: list[EntityRef]) -> dict[EntityRef, bytes]:
            return {ref: data_key for ref in refs}

        async def rekeyed(self, conn: object, refs: list[EntityRef]) -> set[EntityRef]:
            return set()

    codec = SealedCodec(inner, Keys())  # type: ignore[arg-type]
    asyncio.run(codec.load_keys(None, old_format))  # type: ignore[arg-type]
    events = [codec.decode(to_message(proposal)[0], value) for value in old_format]
    assert events[1].payload.expiry_given
    record = reduce_batch(events, {}, {}).records[("t1", "m1")]  # type: ignore[arg-type]
    assert record.version == 2 and record.expires_at is None


def test_the_sealer_refuses_an_event_on_the_other_input_topic() -> None:
    topics = TopicNames("p.")
    key = parse_master_key("bWVtcHJvai1kZXZlbG9wbWVudC1vbmx5LWtleS0wMDE=")
    sealer = Sealer(default_schemas(), topics, KeyStore(key, KeyLookups()), 65536)
    message = to_message(EventFactory().proposed("t1", "m1"))
    assert sealer.codec.decode(*message, topics.name(MEMORY_EVENTS)).event_type == "memory.proposed"
    with pytest.raises(InvalidMessage) as raised:
        sealer.codec.decode(*message, topics.name(CONVERSATION_EVENTS))
    assert raised.value.code == DeadLetterReason.UNKNOWN_EVENT_TYPE


def _personal_event_samples() -> dict[str, dict[str, Any]]:
    f = EventFactory()
    return {
        "memory.proposed": f.proposed("t1", "m1", value={"text": "secret"}),
        "memory.corrected": f.corrected("t1", "m1", 1, {"text": "secret"}),
        "memory.revoked": f.revoked("t1", "m1", "secret"),
        "memory.reviewed": f.reviewed("t1", "m1", 1, note="secret"),
        "conversation.message_added": f.message("t1", "c1", "x", "user", "secret"),
        "conversation.summary_updated": f.summary("t1", "c1", 1, "secret", ["x"]),
    }


def test_every_personal_field_is_sealed_and_its_placeholder_decodes() -> None:
    # Every event type the contract marks, the revocation's reason included; a shredded event
    # decodes with its placeholders (never applied), whatever the field's constraints.
    schemas = default_schemas()
    codec = EventCodec(schemas, schemas.event_types())
    key = new_data_key()
    samples = _personal_event_samples()
    assert samples.keys() == PERSONAL_EVENTS.keys()
    for event_type, raw in samples.items():
        sealed = seal(raw, key)
        assert b"secret" not in orjson.dumps(sealed), event_type
        assert unseal(sealed, lambda ref: key) == raw
        placeholders = with_placeholders(sealed)
        assert b"secret" not in orjson.dumps(placeholders)
        decoded = codec.decode(*to_message(placeholders))
        assert decoded.event_type == event_type


def test_a_new_event_types_marked_field_is_sealed_with_nothing_else_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    register_annotations(monkeypatch)
    raw = annotated("t1", "m1", "the customer's home address")
    key = new_data_key()
    assert entity_of(raw) == ("t1", "memory", "m1")
    sealed = seal(raw, key)
    assert "note" not in sealed["payload"] and b"home address" not in orjson.dumps(sealed)
    assert sealed["payload"]["sealed"]["entity"] == "memory:m1"
    assert unseal(sealed, lambda ref: key) == raw
    with pytest.raises(Shredded):
        unseal(sealed, lambda ref: None)
    with pytest.raises(Unreadable):  # in plaintext on the sealed log: not the sealer's
        unseal(raw, lambda ref: key)
    codec = EventCodec(schemas_with_annotations(), frozenset({"memory.annotated"}))
    shredded = codec.decode(*to_message(with_placeholders(sealed)))
    assert shredded.payload.note == "[unreadable]"
