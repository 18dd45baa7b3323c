"""Live equals replay (one hop): what the fused stage (``SealingProjection``) decides
from raw events is what the unchanged memory projection decides from the sealed log the
fused stage published, on the pure path (no services): erased entities, shredded keys,
rejections, duplicates and dead letters included."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from projections.deletion.erasure import (
    Erasure,
    ErasureIndex,
    conversation_key,
    memory_key,
    subject_key,
)
from projections.memory.projection import MemoryProjection, MemoryState
from projections.memory.reducer import BatchResult, reduce_batch
from projections.sealing.codec import SealedCodec
from projections.sealing.crypto import new_data_key
from projections.sealing.fields import EntityRef
from projections.sealing.fused import FusedState, SealingProjection
from projections.sealing.keys import KeyStore
from projections.sealing.sealer import Sealer, SealingState, keys_needed
from projections.sql import KeyLookups
from streams.sample import EventFactory, to_message
from support.examples import examples
from topics.codec import EventCodec, InvalidMessage
from topics.registry import MEMORY_EVENTS, TopicNames
from topics.schemas import default_schemas

SCHEMAS = default_schemas()
TOPICS = TopicNames()
START = datetime(2026, 9, 1, tzinfo=UTC)
MEMORIES = ("m1", "m2", "m3")
SUBJECTS = ("alice", "bob")
CONVERSATIONS = ("c1", "c2")


def fused() -> SealingProjection[Any, Any, Any]:
    sealer = Sealer(SCHEMAS, TOPICS, None, 65536, input_specs=(MEMORY_EVENTS,))  # type: ignore[arg-type]
    projection = MemoryProjection(
        SCHEMAS, TOPICS, 65536, timedelta(hours=1), KeyStore(new_data_key(), KeyLookups())
    )
    return SealingProjection(sealer, projection)


# One step of a stream: an event of some kind about some memory, a copy of an earlier one
# (a duplicate: same event id, same body), a reused event id with another body, or bytes that
# are no event at all.
step = st.one_of(
    st.tuples(
        st.sampled_from(("proposed", "verified", "corrected", "revoked")),
        st.sampled_from(MEMORIES),
        st.sampled_from(SUBJECTS),
        st.integers(min_value=1, max_value=3),
        st.sampled_from(CONVERSATIONS),
    ),
    st.tuples(st.just("duplicate"), st.integers(min_value=0, max_value=30)),
    st.tuples(st.just("reused"), st.integers(min_value=0, max_value=30)),
    st.just(("invalid",)),
)
# Erasures: of a memory, a subject or a conversation, with a cut-off some seconds into the
# stream.
erasure = st.tuples(
    st.sampled_from(("memory", "subject", "conversation")),
    st.sampled_from(MEMORIES + SUBJECTS + CONVERSATIONS),
    st.integers(min_value=0, max_value=40),
)


def messages(steps: list[tuple[Any, ...]]) -> list[tuple[bytes | None, bytes | None]]:
    f = EventFactory(clock=START)
    raws: list[dict[str, Any]] = []
    out: list[tuple[bytes | None, bytes | None]] = []
    for kind, *args in steps:
        if kind == "invalid":
            out.append((b"t1:m1", b'{"event_type": "memory.proposed", "nope": '))
            continue
        if kind in ("duplicate", "reused"):
            if not raws:
                continue
            raw = orjson.loads(orjson.dumps(raws[args[0] % len(raws)]))
            if kind == "reused":
                raw["actor"]["id"] = "someone_else"
        else:
            memory, subject, version, conversation = args
            source = ("message", f"{conversation}/msg")
            if kind == "proposed":
                raw = f.proposed("t1", memory, ("user", subject), source=source)
            elif kind == "verified":
                raw = f.verified("t1", memory, version)
            elif kind == "corrected":
                raw = f.corrected("t1", memory, version, {"text": "new"}, source=source)
            else:
                raw = f.revoked("t1", memory, expected_version=version)
        raws.append(raw)
        out.append(to_message(raw))
    return out


def erasure_index(erasures: list[tuple[str, str, int]]) -> ErasureIndex:
    entries = {}
    for kind, name, seconds in erasures:
        if kind == "memory" and name in MEMORIES:
            key = memory_key("t1", name)
        elif kind == "subject" and name in SUBJECTS:
            key = subject_key("t1", "user", name)
        elif kind == "conversation" and name in CONVERSATIONS:
            key = conversation_key("t1", name)
        else:
            continue
        entries[key] = Erasure(f"d-{kind}-{name}", START + timedelta(seconds=seconds))
    return ErasureIndex(entries)


class Keys:
    """The data keys as a replay finds them: those the live stage left."""

    def __init__(self, keys: dict[EntityRef, bytes]) -> None:
        self._keys = keys

    async def keys(self, conn: object, refs: list[EntityRef]) -> dict[EntityRef, bytes]:
        return {ref: self._keys[ref] for ref in refs if ref in self._keys}

    async def rekeyed(self, conn: object, refs: list[EntityRef]) -> set[EntityRef]:
        return set()


def decided(result: BatchResult) -> tuple[Any, ...]:
    """Everything the memory projection writes of a batch."""
    return (
        result.records,
        result.versions,
        result.rejections,
        result.processed,
        result.redelivered,
        result.shredded,
        result.keys_to_shred,
        result.revocations,
        dict(result.redactions),
    )


@settings(examples(300, 50), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, max_size=30), st.lists(erasure, max_size=3))
def test_the_fused_stage_decides_what_a_replay_of_its_sealed_log_decides(
    steps: list[tuple[Any, ...]], erasures: list[tuple[str, str, int]]
) -> None:
    stage = fused()
    index = erasure_index(erasures)
    raw_topic = TOPICS.name(MEMORY_EVENTS)
    # Live: the raw messages validated once by the sealer's codec (dead letters left out).
    events = []
    for key, value in messages(steps):
        try:
            events.append(stage.codec.decode(key, value, raw_topic))
        except InvalidMessage:
            continue
    # The keys the sealer's load finds or creates: for what its erasure check does not cover.
    keys = {ref: new_data_key() for ref in keys_needed(events, index)}
    state = FusedState(SealingState(keys, index), MemoryState({}, index))
    live = stage.reduce(events, state, {})
    sealed = stage.outputs(live)[: len(events)]
    assert [m.topic for m in sealed] == [TOPICS.name(MEMORY_EVENTS) + ".sealed"] * len(events)
    assert [m.key for m in sealed] == [f"{e.tenant_id}:{e.entity_id}".encode() for e in events]

    # Replay: the sealed log read by the unchanged projection's codec, after the live stage
    # destroyed the keys of the memories it refused as erased (``shred_refused``).
    left = {
        ref: key
        for ref, key in keys.items()
        if ref[1] != "memory" or (ref[0], ref[2]) not in live.projection.keys_to_shred
    }
    codec = SealedCodec(
        EventCodec(SCHEMAS, frozenset(t for t in SCHEMAS.event_types() if "memory." in t)),
        Keys(left),  # type: ignore[arg-type]
    )
    asyncio.run(codec.load_keys(None, [m.value for m in sealed]))  # type: ignore[arg-type]
    replayed = [codec.decode(m.key, m.value) for m in sealed]
    replay = reduce_batch(replayed, {}, {}, index, timedelta(hours=1))  # type: ignore[arg-type]

    assert decided(live.projection) == decided(replay)
