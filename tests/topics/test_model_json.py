"""A model's JSON by its own serializer (``topics.envelope.model_json``) is the JSON memproj
wrote before through ``pydantic_core.to_json``: the body hashes stored in ``processed_events``
and the messages published depend on those bytes. So is the sealer's JSON of an event that
has nothing to seal, written without a dict in between."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pydantic_core
from hypothesis import given, settings
from hypothesis import strategies as st

from projections.deletion.erasure import NO_ERASURES
from projections.memory.reducer import reduce_batch
from projections.sealing.keys import KeyStore
from projections.sealing.sealer import Sealer, SealingState
from projections.sql import KeyLookups
from streams.sample import EventFactory, to_message
from support.examples import examples
from topics.codec import EventCodec, InvalidMessage, encode
from topics.envelope import model_json
from topics.memory import MemoryEvent
from topics.registry import MEMORY_EVENTS, TopicNames
from topics.schemas import default_schemas

MEMORY_TYPES = frozenset(t for t in default_schemas().event_types() if t.startswith("memory."))
CODEC = EventCodec(default_schemas(), MEMORY_TYPES, {"value": 64 * 1024})
SEALER = Sealer(
    default_schemas(), TopicNames(), KeyStore(b"k" * 32, KeyLookups()), 64 * 1024, (MEMORY_EVENTS,)
)

# Hostile text: any code point JSON can carry (no lone surrogates: the producer's JSON encoder
# refuses them too), control characters, quotes, backslashes, long runs.
text = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=60)
ids = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), min_size=1, max_size=20
)
json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)


@st.composite
def raw_events(draw: st.DrawFn) -> dict[str, Any]:
    factory = EventFactory(id_prefix=draw(ids))
    factory.clock = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(
        microseconds=draw(st.integers(min_value=0, max_value=10**13))
    )
    tenant, memory = draw(ids), draw(ids)
    kind = draw(st.sampled_from(("proposed", "verified", "corrected", "revoked")))
    value = draw(st.dictionaries(text, json_values, max_size=4))
    expires = draw(st.none() | st.just(factory.clock + timedelta(days=1)))
    if kind == "proposed":
        return factory.proposed(tenant, memory, (draw(ids), draw(ids)), value, expires_at=expires)
    if kind == "verified":
        return factory.verified(tenant, memory, draw(st.integers(1, 2**31 - 1)), draw(ids))
    if kind == "corrected":
        return factory.corrected(tenant, memory, 1, value, expires_at=expires)
    return factory.revoked(tenant, memory, draw(text), draw(st.none() | st.integers(1, 9)))


@settings(examples(300, 50), deadline=None)
@given(raw_events())
def test_model_json_writes_what_pydantic_core_to_json_wrote(raw: dict[str, Any]) -> None:
    try:
        event = CODEC.decode(*to_message(raw))
    except InvalidMessage:
        return  # e.g. a value nested too deep: never hashed
    assert model_json(event) == pydantic_core.to_json(event)
    assert event.body_hash() == hashlib.sha256(pydantic_core.to_json(event)).digest()
    assert isinstance(event, MemoryEvent)
    result = reduce_batch([event], {}, {}, NO_ERASURES)
    for record in result.records.values():
        assert encode(record) == pydantic_core.to_json(record)
    for rejection in result.rejections:
        assert encode(rejection) == pydantic_core.to_json(rejection)
    if not SEALER.seals(event):
        (message,) = SEALER.reduce([event], SealingState({}, NO_ERASURES), {}).messages
        assert message.value == orjson.dumps(event.model_dump(mode="json", exclude_unset=True))
