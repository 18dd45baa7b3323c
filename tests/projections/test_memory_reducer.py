"""The memory reducer, with no services: rules of the contract and idempotency properties."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from projections.deletion.erasure import (
    Erasure,
    ErasureIndex,
    conversation_key,
    memory_key,
    subject_key,
)
from projections.memory.evolve import MemoryKey
from projections.memory.reducer import reduce_batch
from streams.sample import EventFactory, to_message
from support.examples import examples
from topics.codec import EventCodec
from topics.memory import MemoryCorrected, MemoryCorrectedPayload, MemoryEvent
from topics.outputs import MemoryRecord, RejectionReason
from topics.schemas import default_schemas

CODEC = EventCodec(
    default_schemas(),
    frozenset({"memory.proposed", "memory.verified", "memory.corrected", "memory.revoked"}),
)


def decode(*raws: dict) -> list[MemoryEvent]:  # type: ignore[type-arg]
    return [CODEC.decode(*to_message(raw)) for raw in raws]  # type: ignore[misc]


def project(events: list[MemoryEvent]) -> dict[MemoryKey, MemoryRecord]:
    return reduce_batch(events, {}, {}).records


def test_proposal_creates_version_one() -> None:
    factory = EventFactory()
    result = reduce_batch(decode(factory.proposed("t1", "m1")), {}, {})
    record = result.records[("t1", "m1")]
    assert (record.version, record.status) == (1, "proposed")
    assert record.source.ref == "conv_1/msg_1"
    assert len(result.versions) == 1 and not result.rejections


def test_verification_and_correction_supersede_with_history() -> None:
    f = EventFactory()
    result = reduce_batch(
        decode(
            f.proposed("t1", "m1", value={"text": "likes tea"}),
            f.verified("t1", "m1", 1),
            f.corrected("t1", "m1", 2, {"text": "likes coffee"}),
            f.corrected("t1", "m1", 3, {"text": "likes water"}, verification="crm_field"),
        ),
        {},
        {},
    )
    record = result.records[("t1", "m1")]
    assert record.version == 4
    assert record.value == {"text": "likes water"}
    assert record.status == "verified" and record.verification == "crm_field"
    history = [(v.record.version, v.record.status, v.record.value["text"]) for v in result.versions]
    assert history == [
        (1, "proposed", "likes tea"),
        (2, "verified", "likes tea"),
        (3, "proposed", "likes coffee"),  # a new value needs its own evidence
        (4, "verified", "likes water"),
    ]


def test_refusals_carry_the_contract_reasons() -> None:
    f = EventFactory()
    result = reduce_batch(
        decode(
            f.proposed("t1", "m1"),
            f.proposed("t1", "m1"),  # a second proposal is a conflict
            f.verified("t1", "m1", 5),
            f.verified("t1", "nope", 1),
            f.revoked("t1", "m1"),
            f.corrected("t1", "m1", 2, {"text": "late"}),
        ),
        {},
        {},
    )
    assert [r.reason for r in result.rejections] == [
        RejectionReason.VERSION_CONFLICT,
        RejectionReason.VERSION_CONFLICT,
        RejectionReason.UNKNOWN_MEMORY,
        RejectionReason.REVOKED,
    ]
    record = result.records[("t1", "m1")]
    assert record.status == "revoked" and record.version == 2


def test_conflict_changes_nothing() -> None:
    f = EventFactory()
    base = reduce_batch(decode(f.proposed("t1", "m1")), {}, {})
    after = reduce_batch(decode(f.verified("t1", "m1", 7)), base.records, {})
    assert after.records == {} and after.versions == []
    assert after.rejections[0].details == "expected_version 7, current version 1"


def test_revocation_without_expected_version_is_allowed() -> None:
    f = EventFactory()
    record = project(
        decode(f.proposed("t1", "m1"), f.verified("t1", "m1", 1), f.revoked("t1", "m1"))
    )
    assert record[("t1", "m1")].status == "revoked"


def test_expiry_is_judged_at_read_time_not_in_the_reducer() -> None:
    f = EventFactory()
    expires = f.clock + timedelta(hours=1)
    record = project(decode(f.proposed("t1", "m1", expires_at=expires)))[("t1", "m1")]
    assert record.status == "proposed"
    assert record.is_eligible(expires - timedelta(seconds=1))
    assert not record.is_eligible(expires)


def _with_payload(raw: dict, **changes: object) -> dict:  # type: ignore[type-arg]
    return dict(raw, payload=dict(raw["payload"], **changes))


def test_a_correction_without_expires_at_keeps_the_current_expiry() -> None:
    f = EventFactory()
    expires = f.clock + timedelta(days=30)
    correction = f.corrected("t1", "m1", 1, {"text": "likes coffee"})
    assert "expires_at" not in correction["payload"]
    result = reduce_batch(decode(f.proposed("t1", "m1", expires_at=expires), correction), {}, {})
    record = result.records[("t1", "m1")]
    assert (record.version, record.value, record.expires_at) == (
        2,
        {"text": "likes coffee"},
        expires,
    )
    # Still kept through a second correction that says nothing about expiry either.
    again = reduce_batch(decode(f.corrected("t1", "m1", 2, {"text": "tea"})), result.records, {})
    assert again.records[("t1", "m1")].expires_at == expires


def test_a_correction_with_expires_at_null_removes_the_expiry() -> None:
    f = EventFactory()
    proposal = f.proposed("t1", "m1", expires_at=f.clock + timedelta(days=30))
    correction = _with_payload(f.corrected("t1", "m1", 1, {"text": "x"}), expires_at=None)
    record = project(decode(proposal, correction))[("t1", "m1")]
    assert record.version == 2 and record.expires_at is None


def test_a_correction_with_a_new_expires_at_replaces_the_expiry() -> None:
    f = EventFactory()
    first, second = f.clock + timedelta(days=30), f.clock + timedelta(days=2)
    for proposal in (
        f.proposed("t1", "m1", expires_at=first),
        f.proposed("t1", "m2"),  # a permanent memory can be given an expiry
    ):
        memory_id = proposal["payload"]["memory_id"]
        correction = f.corrected("t1", memory_id, 1, {"text": "x"}, expires_at=second)
        assert project(decode(proposal, correction))[("t1", memory_id)].expires_at == second


def test_expiry_of_a_correction_built_in_python_follows_the_same_rule() -> None:
    f = EventFactory()
    (event,) = decode(f.corrected("t1", "m1", 1, {"text": "x"}))
    assert isinstance(event, MemoryCorrected)
    omitted = event.payload
    built = MemoryCorrectedPayload(
        memory_id="m1",
        expected_version=1,
        value={},
        source=omitted.source,
        observed_at=omitted.observed_at,
    )
    null = built.model_copy(update={"expires_at": None})
    assert not omitted.expiry_given and not built.expiry_given
    assert MemoryCorrectedPayload.model_validate(
        {**built.model_dump(), "expires_at": None}
    ).expiry_given
    assert null.expiry_given  # model_copy(update=...) counts as given, like a field set


def test_same_event_id_same_body_is_a_redelivery_different_body_is_refused() -> None:
    f = EventFactory()
    proposal = f.proposed("t1", "m1")
    reused = dict(proposal, payload=dict(proposal["payload"], value={"text": "other"}))
    result = reduce_batch(decode(proposal, proposal, reused), {}, {})
    assert result.redelivered == 1
    assert [r.reason for r in result.rejections] == [RejectionReason.DUPLICATE_MISMATCH]
    assert len(result.processed) == 1

    later = reduce_batch(
        decode(proposal, reused),
        result.records,
        {(p.tenant_id, p.event_id): p.body_hash for p in result.processed},
    )
    assert later.redelivered == 1 and later.records == {}
    assert [r.reason for r in later.rejections] == [RejectionReason.DUPLICATE_MISMATCH]


def test_a_refused_event_is_not_reconsidered_when_redelivered() -> None:
    f = EventFactory()
    early = f.verified("t1", "m1", 1)  # refused: the memory does not exist yet
    first = reduce_batch(decode(early, f.proposed("t1", "m1")), {}, {})
    seen = {(p.tenant_id, p.event_id): p.body_hash for p in first.processed}
    again = reduce_batch(decode(early), first.records, seen)
    assert again.redelivered == 1 and again.records == {}


def test_tenants_are_separate_namespaces() -> None:
    f = EventFactory()
    records = project(
        decode(f.proposed("t1", "m1"), f.proposed("t2", "m1"), f.verified("t2", "m1", 1))
    )
    assert records[("t1", "m1")].status == "proposed"
    assert records[("t2", "m1")].status == "verified"


def _log(draw: st.DrawFn) -> list[dict]:  # type: ignore[type-arg]
    factory = EventFactory()
    log: list[dict] = []  # type: ignore[type-arg]
    versions: dict[str, int] = {}
    for _ in range(draw(st.integers(1, 30))):
        tenant = draw(st.sampled_from(["t1", "t2"]))
        memory = draw(st.sampled_from(["m1", "m2", "m3"]))
        action = draw(st.sampled_from(["propose", "verify", "correct", "revoke", "conflict"]))
        current = versions.get(f"{tenant}/{memory}", 0)
        if action == "propose":
            log.append(factory.proposed(tenant, memory))
        elif action == "verify":
            log.append(factory.verified(tenant, memory, max(current, 1)))
        elif action == "correct":
            log.append(factory.corrected(tenant, memory, max(current, 1), {"n": len(log)}))
        elif action == "revoke":
            log.append(factory.revoked(tenant, memory))
        else:
            log.append(factory.verified(tenant, memory, current + 5))
        versions[f"{tenant}/{memory}"] = current + 1
    return log


@st.composite
def log_with_duplicates(draw: st.DrawFn) -> tuple[list[dict], list[dict]]:  # type: ignore[type-arg]
    """A log, and the same log with duplicates of its events inserted after their originals."""
    log = _log(draw)
    noisy = list(log)
    for _ in range(draw(st.integers(0, 20))):
        original = draw(st.integers(0, len(log) - 1))
        position = noisy.index(log[original]) + 1
        noisy.insert(draw(st.integers(position, len(noisy))), log[original])
    return log, noisy


@given(log_with_duplicates(), st.data())
@settings(examples(200, 40), deadline=None)
def test_redelivered_and_reordered_duplicates_give_the_same_projection(logs, data) -> None:  # type: ignore[no-untyped-def]
    log, noisy = logs
    expected = reduce_batch(decode(*log), {}, {})

    # Split the noisy log into batches, carrying state between them as the store would.
    events = decode(*noisy)
    records: dict[MemoryKey, MemoryRecord] = {}
    seen: dict[tuple[str, str], bytes] = {}
    versions = []
    rejections = []
    cuts = sorted(data.draw(st.sets(st.integers(0, len(events)), max_size=5)))
    for start, end in zip([0, *cuts], [*cuts, len(events)], strict=True):
        batch = reduce_batch(events[start:end], records, seen)
        records.update(batch.records)
        seen.update({(p.tenant_id, p.event_id): p.body_hash for p in batch.processed})
        versions.extend(batch.versions)
        rejections.extend(batch.rejections)

    assert records == expected.records
    assert versions == expected.versions
    assert rejections == expected.rejections


def test_an_erased_subjects_memory_is_refused_and_its_key_marked_for_shredding() -> None:
    f = EventFactory()
    late, after = decode(
        f.proposed("t1", "m_late", ("user", "alice")),
        f.proposed("t1", "m_new", ("user", "alice")),
    )
    cut_off = late.occurred_at + (after.occurred_at - late.occurred_at) / 2
    erasures = ErasureIndex({subject_key("t1", "user", "alice"): Erasure("d1", cut_off)})

    result = reduce_batch([late, after], {}, {}, erasures)

    assert [(r.entity_id, r.reason) for r in result.rejections] == [
        ("m_late", RejectionReason.ERASED)
    ]
    assert result.keys_to_shred == {("t1", "m_late"): "d1"}
    assert set(result.records) == {("t1", "m_new")}  # new data after the cut-off is kept


def bob_and_a_late_correction_into_c1() -> tuple[dict[MemoryKey, MemoryRecord], MemoryEvent]:
    """Bob's memory m4, sourced from conversation c2, and a correction moving it into c1."""
    f = EventFactory()
    (proposed,) = decode(f.proposed("t1", "m4", ("user", "bob"), source=("message", "c2/msg1")))
    (late,) = decode(f.corrected("t1", "m4", 1, {"text": "x"}, source=("message", "c1/msg9")))
    return reduce_batch([proposed], {}, {}).records, late


def test_a_late_correction_from_an_erased_conversation_keeps_its_place_without_content() -> None:
    records, late = bob_and_a_late_correction_into_c1()
    # Alice's conversation c1 is erased after the correction occurred.
    cut_off = late.occurred_at + timedelta(seconds=1)
    erasures = ErasureIndex({conversation_key("t1", "c1"): Erasure("d1", cut_off)})

    result = reduce_batch([late], records, {}, erasures)

    assert [(r.entity_id, r.reason) for r in result.rejections] == [("m4", RejectionReason.ERASED)]
    # Bob's m4 is not erased, only this version's content: its key stays (its other versions
    # open), the version keeps its place in the history without a value and is never served.
    assert result.keys_to_shred == {}
    erased = result.records[("t1", "m4")]
    assert (erased.status, erased.version, erased.value, erased.servable) == (
        "erased",
        2,
        {},
        False,
    )
    assert result.versions == []  # no history row: the erasure deleted what it covers


def test_a_correction_from_elsewhere_applies_after_a_version_whose_content_was_erased() -> None:
    f = EventFactory()
    first, second = decode(
        f.proposed("t1", "m5", ("user", "bob"), {"text": "from c1"}, source=("message", "c1/a")),
        f.corrected("t1", "m5", 1, {"text": "from c2"}, source=("message", "c2/b")),
    )
    cut_off = second.occurred_at + timedelta(seconds=1)
    erasures = ErasureIndex({conversation_key("t1", "c1"): Erasure("d1", cut_off)})

    result = reduce_batch([first, second], {}, {}, erasures)

    # What the live projection holds after c1's erasure, which deleted version 1's history
    # row: version 2, taken from c2, and no key destroyed.
    record = result.records[("t1", "m5")]
    assert (record.version, record.value, record.status) == (2, {"text": "from c2"}, "proposed")
    assert [v.record.version for v in result.versions] == [2]
    assert result.keys_to_shred == {}


def test_a_refused_event_shreds_the_key_when_the_erasure_covers_the_memory_itself() -> None:
    records, late = bob_and_a_late_correction_into_c1()
    cut_off = late.occurred_at + timedelta(seconds=1)
    # The memory itself (its id, its subject): an erasure of its current source conversation
    # alone closes only the versions taken from it.
    for covering in (memory_key("t1", "m4"), subject_key("t1", "user", "bob")):
        erasures = ErasureIndex(
            {conversation_key("t1", "c1"): Erasure("d1", cut_off), covering: Erasure("d2", cut_off)}
        )
        result = reduce_batch([late], records, {}, erasures)
        assert [r.reason for r in result.rejections] == [RejectionReason.ERASED], covering
        assert set(result.keys_to_shred) == {("t1", "m4")}, covering


def test_memory_values_are_redacted_like_conversation_content() -> None:
    f = EventFactory()
    secret = "AKIAIOSFODNN7EXAMPLE"
    result = reduce_batch(
        decode(
            f.proposed("t1", "m1", value={"note": f"deploy key {secret}", "password": "hunter22"}),
            f.corrected("t1", "m1", 1, {"text": "token ghp_" + "a1B2" * 9}),
            f.proposed("t1", "m2", value={"text": "likes tea"}),
        ),
        {},
        {},
    )
    stored = str([v.record.value for v in result.versions])
    assert secret not in stored and "hunter22" not in stored and "ghp_" not in stored
    assert "[REDACTED:" in stored
    assert result.records[("t1", "m2")].value == {"text": "likes tea"}
    assert sum(result.redactions.values()) == 3


def test_a_revocations_reason_is_redacted_before_it_is_stored() -> None:
    # Free text from its producer, marked personal: redacted like a value, not only sealed.
    f = EventFactory()
    token = "ghp_" + "a1B2" * 9
    result = reduce_batch(
        decode(f.proposed("t1", "m1"), f.revoked("t1", "m1", f"leaked token {token}")), {}, {}
    )
    record = result.records[("t1", "m1")]
    assert record.status == "revoked"
    assert record.revoked_reason is not None and token not in record.revoked_reason
    assert record.revoked_reason.startswith("leaked token [REDACTED:")
    assert sum(result.redactions.values()) == 1
