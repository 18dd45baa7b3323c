"""What a tombstone reaches in a derived store that is not a table: the vector store's
``Match`` of its target, and which of the entries found it erases. Pure.

A store removes by the tombstone's item ids and by its target (the subject, the conversations,
the memories), so that a copy written under the target after the items were resolved is
removed too. The stores themselves are in ``projections.stores``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TypeVar

from projections.embeddings.vectors import EntryRef, Match, VectorEntry, message_entry_id
from topics.deletion import Tombstone


def subject_of(tombstone: Tombstone) -> tuple[str, str] | None:
    subject = tombstone.target.subject()
    return (subject.type, subject.id) if subject is not None else None


def match_of(tombstone: Tombstone) -> Match:
    return Match(
        tenant_id=tombstone.tenant_id,
        subject=subject_of(tombstone),
        # A content erasure lists its messages: matching the conversation would reach the
        # memories taken from it, which it leaves.
        conversation_ids=()
        if tombstone.scope == "content"
        else tuple(tombstone.conversation_ids()),
        memory_ids=tuple(tombstone.ids("memory")),
        entry_ids=tuple(
            message_entry_id(tombstone.tenant_id, item.conversation_id, item.id)
            for item in tombstone.items
            if item.type == "message" and item.conversation_id is not None
        ),
    )


# Whole entries, or entries read without text and vector: the rule needs only their keys.
_Entry = TypeVar("_Entry", VectorEntry, EntryRef)


def erased_by(tombstone: Tombstone, found: Sequence[_Entry]) -> list[_Entry]:
    """Of the entries ``match_of(tombstone)`` found, those the tombstone erases: every entry
    of its items, and of its subject only what occurred up to the cut-off. The subject may
    have new data from after the erasure, which a late or redelivered tombstone must keep."""
    listed = replace(match_of(tombstone), subject=None)
    return [
        entry for entry in found if listed.matches(entry) or entry.occurred_at <= tombstone.cut_off
    ]


def erased_by_each(
    tombstones: Sequence[Tombstone], found: Sequence[VectorEntry]
) -> list[list[VectorEntry]]:
    """Of the entries the tombstones' matches found together (one query for a batch), those
    each tombstone erases, in the tombstones' order; an entry two tombstones erase is in
    both lists."""
    erased = []
    for tombstone in tombstones:
        match = match_of(tombstone)
        erased.append(erased_by(tombstone, [entry for entry in found if match.matches(entry)]))
    return erased


def first_claims(erased: Sequence[Sequence[VectorEntry]]) -> list[list[VectorEntry]]:
    """Each list of ``erased`` without the entries an earlier list holds: what each erasure
    of a batch removes, counted as if they had run one after the other."""
    claimed: set[tuple[str, str]] = set()
    claims = []
    for entries in erased:
        mine = [e for e in entries if (e.tenant_id, e.id) not in claimed]
        claimed.update((e.tenant_id, e.id) for e in mine)
        claims.append(mine)
    return claims
