"""The deletion ledger, the erasure guard and the index planner, with no services."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from projections.deletion.erasure import (
    EntityKey,
    Erasure,
    ErasureIndex,
    conversation_key,
    memory_key,
    subject_key,
)
from projections.deletion.ledger import (
    ResolvedTarget,
    apply_ack,
    initial_state,
    plan_erasure,
    reduce_ledger,
)
from projections.deletion.projection import LedgerCodec
from projections.embeddings.embedder import HashingEmbedder
from projections.embeddings.indexer import Authoritative, MemoryUpdate, plan_index
from projections.memory.reducer import reduce_batch
from projections.stores import STORES
from streams.sample import EventFactory, to_message
from topics.codec import EventCodec, InvalidMessage, encode
from topics.deletion import Acknowledgement, DeletionRequested
from topics.outputs import DeadLetterReason, MemoryRecord, RejectionReason
from topics.registry import DELETION_ACKS, DELETION_REQUESTS, TopicNames
from topics.schemas import default_schemas

NOW = datetime(2026, 9, 1, 12, tzinfo=UTC)
SCHEMAS = default_schemas()
CODEC = EventCodec(SCHEMAS, SCHEMAS.event_types())


def request(target: dict[str, str], deadline: datetime | None = None) -> DeletionRequested:
    f = EventFactory(clock=NOW)
    event = CODEC.decode(*to_message(f.deletion("t1", "d1", target, deadline_at=deadline)))
    assert isinstance(event, DeletionRequested)
    return event


def ack(store: str, status: str = "done", at: datetime = NOW, removed: int = 1) -> Acknowledgement:
    return Acknowledgement(
        deletion_id="d1",
        tenant_id="t1",
        store=store,
        status=status,
        removed_count=removed,
        acked_at=at,
        error=None if status == "done" else "boom",
    )


RESOLVED = ResolvedTarget(
    memories=("m1", "m2"),
    conversations=("c1",),
    messages=(("c1", "msg1"), ("c1", "msg2")),
    summaries=(("c1", 1),),
    contexts=("c1",),
)


def test_an_erasure_covers_its_items_and_the_target_with_a_deadline() -> None:
    event = request({"type": "subject", "id": "alice", "subject_type": "user"})
    entry = plan_erasure(event, RESOLVED, timedelta(hours=1), STORES.requirements)
    assert entry.cut_off == event.occurred_at
    assert entry.deadline_at == event.occurred_at + timedelta(hours=1)
    assert entry.required_stores == ("embeddings", "summaries", "cache", "context")
    assert set(entry.erased) == {
        memory_key("t1", "m1"),
        memory_key("t1", "m2"),
        conversation_key("t1", "c1"),
        subject_key("t1", "user", "alice"),
    }
    tombstone = entry.tombstone()
    assert [(i.type, i.id) for i in tombstone.items] == [
        ("memory", "m1"), ("memory", "m2"), ("conversation", "c1"), ("message", "msg1"),
        ("message", "msg2"), ("summary", "1"), ("context", "c1"),
    ]  # fmt: skip
    assert tombstone.conversation_ids() == ["c1"]
    named = plan_erasure(request({"type": "memory", "id": "m1"}, NOW + timedelta(minutes=5)),
                         ResolvedTarget(memories=("m1",)), timedelta(hours=1),
                         STORES.requirements)  # fmt: skip
    assert named.deadline_at == NOW + timedelta(minutes=5)
    assert named.required_stores == ("embeddings", "cache")


def test_acknowledgements_complete_a_request_once_and_are_idempotent() -> None:
    entry = plan_erasure(request({"type": "memory", "id": "m1"}), ResolvedTarget(memories=("m1",)),
                         timedelta(hours=1), STORES.requirements)  # fmt: skip
    state = initial_state(entry)
    failed = apply_ack(ack("cache", "failed"), state)
    assert failed.stores["cache"].status == "failed" and failed.stores["cache"].attempts == 1
    half = apply_ack(ack("cache", at=NOW + timedelta(seconds=2), removed=3), failed)
    assert not half.completed
    done = apply_ack(ack("embeddings", at=NOW + timedelta(seconds=5)), half)
    assert done.completed_at == NOW + timedelta(seconds=5)
    again = apply_ack(ack("cache", at=NOW + timedelta(seconds=9), removed=0), done)
    assert again == done  # a done store stays done, with its first count and time
    assert apply_ack(ack("summaries"), done) == done  # not a required store: ignored


def test_the_batch_reducer_refuses_repeats_and_unknown_requests() -> None:
    event = request({"type": "memory", "id": "m1"})
    key = ("t1", "d1")
    batch = reduce_ledger(
        [event, event, ack("embeddings"), ack("cache")],
        {key: ResolvedTarget(memories=("m1",))},
        {},
        {},
        timedelta(hours=1),
        STORES.requirements,
    )
    assert len(batch.entries) == 1 and batch.redelivered == 1
    assert [s.deletion_id for s in batch.completed] == ["d1"]
    orphan = reduce_ledger([ack("cache")], {}, {}, {}, timedelta(hours=1), STORES.requirements)
    assert [r.reason for r in orphan.rejections] == [RejectionReason.UNKNOWN_DELETION]


def test_the_guard_refuses_events_up_to_the_cut_off_and_accepts_new_data() -> None:
    f = EventFactory(clock=NOW - timedelta(minutes=1))
    before = f.corrected("t1", "m1", 1, {"text": "late"})
    proposal_about_alice = f.proposed("t1", "m9", ("user", "alice"))
    from_conversation = f.proposed("t1", "m8", ("user", "bob"), source=("message", "c1/x"))
    f.clock = NOW + timedelta(minutes=1)
    after = f.proposed("t1", "m1", ("user", "alice"))
    erasures = ErasureIndex(
        {
            memory_key("t1", "m1"): Erasure("d1", NOW),
            subject_key("t1", "user", "alice"): Erasure("d1", NOW),
            conversation_key("t1", "c1"): Erasure("d1", NOW),
        }
    )
    events = [
        CODEC.decode(*to_message(e))
        for e in (before, proposal_about_alice, from_conversation, after)
    ]
    result = reduce_batch(events, {}, {}, erasures)  # type: ignore[arg-type]
    assert [(r.entity_id, r.reason) for r in result.rejections] == [
        ("m1", RejectionReason.ERASED),
        ("m9", RejectionReason.ERASED),
        ("m8", RejectionReason.ERASED),
    ]
    # m8 is not erased itself, only its content: its version keeps its place, never served.
    assert {key: r.status for key, r in result.records.items()} == {
        ("t1", "m8"): "erased",
        ("t1", "m1"): "proposed",  # new data after the cut-off
    }
    assert result.versions[-1].record.memory_id == "m1" and len(result.versions) == 1
    assert result.keys_to_shred == {("t1", "m1"): "d1", ("t1", "m9"): "d1"}


def test_an_empty_index_reads_no_keys_and_a_lazy_one_stops_at_the_first_match() -> None:
    read: list[EntityKey] = []

    def keys() -> Iterator[EntityKey]:
        for key in (memory_key("t1", "m1"), subject_key("t1", "user", "alice")):
            read.append(key)
            yield key

    assert ErasureIndex().covering(keys(), NOW) is None
    assert read == []
    index = ErasureIndex({memory_key("t1", "m1"): Erasure("d1", NOW)})
    assert index.covering(keys(), NOW) == Erasure("d1", NOW)
    assert read == [memory_key("t1", "m1")]
    assert index.covering(keys(), NOW + timedelta(seconds=1)) is None  # after the cut-off


def test_the_index_planner_never_resurrects_and_skips_what_is_not_current() -> None:
    f = EventFactory(clock=NOW - timedelta(minutes=1))
    event = CODEC.decode(*to_message(f.proposed("t1", "m1", ("user", "alice"))))
    record = reduce_batch([event], {}, {}).records[("t1", "m1")]  # type: ignore[list-item]
    embedder = HashingEmbedder(16)
    fresh = plan_index(
        [MemoryUpdate("t1", "m1", record)],
        Authoritative({("t1", "m1"): (1, "proposed")}, set(), ErasureIndex()),
        embedder,
    )
    assert list(fresh.upserts) == ["memory:t1:m1"] and not fresh.rejections
    erased = plan_index(
        [MemoryUpdate("t1", "m1", record)],
        Authoritative({}, set(), ErasureIndex({memory_key("t1", "m1"): Erasure("d1", NOW)})),
        embedder,
    )
    assert not erased.upserts and erased.rejections[0].reason is RejectionReason.ERASED
    newer: MemoryRecord = record.model_copy(update={"version": 1})
    stale = plan_index(
        [MemoryUpdate("t1", "m1", newer)],
        Authoritative({("t1", "m1"): (3, "verified")}, set(), ErasureIndex()),
        embedder,
    )
    assert not stale.upserts and stale.stale == 1
    revoked = plan_index(
        [MemoryUpdate("t1", "m1", None)],
        Authoritative({("t1", "m1"): (2, "revoked")}, set(), ErasureIndex()),
        embedder,
    )
    assert not revoked.upserts and revoked.removals


@pytest.mark.parametrize(
    "reason", ["user asked", "deletion.acknowledged", 'quoted "deletion.acknowledged" too']
)
def test_a_request_is_decoded_as_a_request_whatever_its_reason_says(reason: str) -> None:
    f = EventFactory(clock=NOW)
    key, value = to_message(f.deletion("t1", "d1", {"type": "memory", "id": "m1"}, reason=reason))
    event = LedgerCodec(SCHEMAS).decode(key, value)
    assert isinstance(event, DeletionRequested)
    assert event.payload.reason == reason


def test_the_ledger_codec_decodes_acks_and_dead_letters_what_it_cannot_read() -> None:
    codec = LedgerCodec(SCHEMAS)
    assert codec.decode(b"t1:d1", encode(ack("cache"))) == ack("cache")
    for key, value, code in [
        (b"t1:d1", b"{not json", DeadLetterReason.MALFORMED_JSON),
        (b"t1:d1", b'["deletion.acknowledged"]', DeadLetterReason.MALFORMED_JSON),
        (b"t1:other", encode(ack("cache")), DeadLetterReason.KEY_MISMATCH),
        (b"t1:d1", b'{"event_type": "deletion.acknowledged"}', DeadLetterReason.INVALID_EVENT),
    ]:
        with pytest.raises(InvalidMessage) as raised:
            codec.decode(key, value)
        assert raised.value.code == code, value


def test_an_acknowledgement_is_keyed_by_its_output_key_or_as_before_1_2() -> None:
    codec = LedgerCodec(SCHEMAS)
    escaped = ack("cache").model_copy(update={"tenant_id": "t:1"})
    for key in (b"t%3A1:d1", b"t:1:d1"):  # contract 1.2, and an ack published before it
        assert codec.decode(key, encode(escaped)) == escaped
    with pytest.raises(InvalidMessage) as raised:
        codec.decode(b"t:1%3Ad1", encode(escaped))
    assert raised.value.code == DeadLetterReason.KEY_MISMATCH


def test_the_topic_decides_what_a_ledger_message_may_be() -> None:
    topics = TopicNames("p.")
    codec = LedgerCodec(SCHEMAS, topics)
    f = EventFactory(clock=NOW)
    request = to_message(f.deletion("t1", "d1", {"type": "memory", "id": "m1"}))
    # A forged acknowledgement on the public requests topic must never complete a deletion.
    for key, value, topic in [
        (b"t1:d1", encode(ack("cache")), topics.name(DELETION_REQUESTS)),
        (*request, topics.name(DELETION_ACKS)),
    ]:
        with pytest.raises(InvalidMessage) as raised:
            codec.decode(key, value, topic)
        assert raised.value.code == DeadLetterReason.UNKNOWN_EVENT_TYPE
    assert codec.decode(b"t1:d1", encode(ack("cache")), topics.name(DELETION_ACKS)) == ack("cache")
    assert isinstance(codec.decode(*request, topics.name(DELETION_REQUESTS)), DeletionRequested)
