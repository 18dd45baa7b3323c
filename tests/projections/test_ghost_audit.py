"""Which vector entries an erasure covers (the audit, the embeddings swap and the store's
removal), with no services."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from projections.deletion.derived import erased_by
from projections.deletion.erasure import (
    Erasure,
    ErasureIndex,
    conversation_key,
    memory_key,
    subject_key,
)
from projections.embeddings.vectors import VectorEntry, memory_entry_id
from projections.stores.embeddings import covered_entries as erased_entries
from topics.deletion import DeletionTarget, Tombstone, TombstoneItem

CUT_OFF = datetime(2026, 3, 1, 12, tzinfo=UTC)


def entry(
    memory_id: str, subject_id: str, at: datetime, conversation: str | None = None
) -> VectorEntry:
    return VectorEntry(
        id=memory_entry_id("acme", memory_id),
        kind="memory",
        tenant_id="acme",
        subject_type="user",
        subject_id=subject_id,
        memory_id=memory_id,
        conversation_id=conversation,
        message_id=None,
        source_type="message" if conversation else "operator",
        source_ref=f"{conversation}/m1" if conversation else "console",
        text=memory_id,
        version=1,
        occurred_at=at,
        vector=(0.0,),
        memory_kind="preference",
        scope="user",
    )


def test_entries_of_an_erased_subject_memory_or_conversation_up_to_the_cut_off() -> None:
    before, after = CUT_OFF - timedelta(seconds=1), CUT_OFF + timedelta(seconds=1)
    index = ErasureIndex(
        {
            subject_key("acme", "user", "alice"): Erasure("d1", CUT_OFF),
            memory_key("acme", "m_revoked"): Erasure("d2", CUT_OFF),
            conversation_key("acme", "c_gone"): Erasure("d3", CUT_OFF),
        }
    )
    entries = [
        entry("m_alice", "alice", before),
        entry("m_alice_at_cut_off", "alice", CUT_OFF),
        entry("m_alice_later", "alice", after),  # new data after the erasure stays
        entry("m_revoked", "bob", before),
        entry("m_from_gone", "bob", before, conversation="c_gone"),
        entry("m_bob", "bob", before),
    ]
    other_tenant = {"other": index}

    assert [e.memory_id for e in erased_entries(entries, {"acme": index})] == [
        "m_alice",
        "m_alice_at_cut_off",
        "m_revoked",
        "m_from_gone",
    ]
    assert erased_entries(entries, other_tenant) == []


def test_a_subjects_tombstone_erases_its_items_and_what_came_before_the_cut_off_only() -> None:
    before, after = CUT_OFF - timedelta(seconds=1), CUT_OFF + timedelta(seconds=1)
    tombstone = Tombstone(
        deletion_id="d1",
        tenant_id="acme",
        kind="erasure",
        target=DeletionTarget(type="subject", id="alice", subject_type="user"),
        items=(TombstoneItem(type="memory", id="m_listed"),),
        issued_at=CUT_OFF,
        cut_off=CUT_OFF,
        deadline_at=CUT_OFF + timedelta(hours=1),
        required_stores=("embeddings",),
    )
    found = [
        entry("m_listed", "alice", after),  # listed: erased whatever its time
        entry("m_old", "alice", before),
        entry("m_new", "alice", after),  # new data about Alice after her erasure
    ]
    assert [e.memory_id for e in erased_by(tombstone, found)] == ["m_listed", "m_old"]
