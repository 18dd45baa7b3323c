"""memory.current's messages (projections.memory.current): the record under its output key,
and an erased memory's nulls under every key it may have had, with no services."""

from __future__ import annotations

from datetime import UTC, datetime

from projections.memory.current import current_message, erased_messages, sharing_old_key
from projections.memory.reducer import reduce_batch
from streams.sample import EventFactory, to_message
from topics.codec import EventCodec
from topics.memory import MemoryEvent
from topics.registry import entity_headers
from topics.schemas import default_schemas

SCHEMAS = default_schemas()
CODEC = EventCodec(SCHEMAS, SCHEMAS.event_types())


def test_a_record_goes_under_its_output_key_and_a_revoked_one_is_a_null() -> None:
    f = EventFactory(clock=datetime(2026, 9, 1, tzinfo=UTC))
    events: list[MemoryEvent] = [
        CODEC.decode(*to_message(event))  # type: ignore[misc]
        for event in (f.proposed("a:b", "m"), f.proposed("acme", "m1"), f.revoked("acme", "m1"))
    ]
    records = reduce_batch(events, {}, {}).records
    proposed = current_message("memory.current", ("a:b", "m"), records[("a:b", "m")])
    assert proposed.key == b"a%3Ab:m" and proposed.value is not None
    assert proposed.headers == entity_headers("a:b", "m")
    revoked = current_message("memory.current", ("acme", "m1"), records[("acme", "m1")])
    assert revoked.key == b"acme:m1" and revoked.value is None


def test_an_erased_memory_is_nulled_under_every_key_a_record_of_it_may_have() -> None:
    assert [m.key for m in erased_messages("memory.current", ("acme", "m1"))] == [b"acme:m1"]
    nulls = erased_messages("memory.current", ("a:b", "m"))
    # Its output key, and the input key a record written before 1.2 has.
    assert [(m.key, m.value) for m in nulls] == [(b"a%3Ab:m", None), (b"a:b:m", None)]
    assert all(m.headers == entity_headers("a:b", "m") for m in nulls)


def test_the_memory_whose_key_is_another_ones_pre_1_2_key() -> None:
    assert sharing_old_key(("a:b", "m")) == ("a", "b:m")
    assert sharing_old_key(("x%25", "m")) == ("x%", "m")  # "x%25:m" is tenant "x%"'s key
    assert sharing_old_key(("a", "b:m")) is None  # its keys are one
    assert sharing_old_key(("acme", "m1")) is None
    assert sharing_old_key(("x%y", "m")) is None  # "x%y:m" is its own output key too
