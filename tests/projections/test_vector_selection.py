"""Selecting entries of the LanceDB vector store: find and remove by tenant, subject,
conversation, memory or entry id, with filters that quote every identifier. No services."""

from __future__ import annotations

import dataclasses

import pytest

from projections.embeddings.lance import LanceVectorStore, match_filter, sql_string
from projections.embeddings.vectors import Match, VectorEntry, memory_entry_id, message_entry_id
from support.vector_entries import ids, memory, message

NASTY = [
    "o'hara",
    "''",
    "back\\slash",
    "trailing\\",
    "\\'",
    "100%_like",
    'double"quote',
    "x' OR '1'='1",
    "ünïcødé ☃ 東京",
    "new\nline\ttab",
    "nul\x00byte",
    ") OR (1=1",
]


# -- find and remove ---------------------------------------------------------------------


def population() -> list[VectorEntry]:
    a, b = "tenant-a", "tenant-b"
    return [
        memory("m1", "one", a, ("user", "u1")),
        memory("m2", "two", a, ("user", "u1")),
        memory("m3", "three", a, ("user", "u2")),
        memory("m4", "four", a, ("agent", "u1")),
        message("c1", "msg1", "hi", a, ("user", "u1")),
        message("c1", "msg2", "hello", a, ("user", "u1")),
        message("c2", "msg1", "bye", a, ("user", "u2")),
        # Tenant B reuses every identifier of tenant A: none of it may be touched.
        memory("m1", "one", b, ("user", "u1")),
        memory("m3", "three", b, ("user", "u2")),
        message("c1", "msg1", "hi", b, ("user", "u1")),
        message("c2", "msg1", "bye", b, ("user", "u2")),
    ]


def stored(store: LanceVectorStore, entries: list[VectorEntry]) -> list[VectorEntry]:
    """Which of ``entries`` the store holds, asking each tenant for its own."""
    tenants = sorted({entry.tenant_id for entry in entries})
    return [
        found
        for tenant in tenants
        for found in store.get(tenant, [e.id for e in entries if e.tenant_id == tenant])
    ]


def a_memory(memory_id: str) -> str:
    return memory_entry_id("tenant-a", memory_id)


def a_message(conversation_id: str, message_id: str) -> str:
    return message_entry_id("tenant-a", conversation_id, message_id)


REMOVALS = {
    "subject": (
        Match("tenant-a", subject=("user", "u1")),
        {a_memory("m1"), a_memory("m2"), a_message("c1", "msg1"), a_message("c1", "msg2")},
    ),
    "conversations": (
        Match("tenant-a", conversation_ids=("c1", "c2", "c-unknown")),
        {a_message("c1", "msg1"), a_message("c1", "msg2"), a_message("c2", "msg1")},
    ),
    "memories": (
        Match("tenant-a", memory_ids=("m2", "m4")),
        {a_memory("m2"), a_memory("m4")},
    ),
    "entry ids": (
        Match("tenant-a", entry_ids=(a_memory("m3"), a_message("c2", "msg1"), "other")),
        {a_memory("m3"), a_message("c2", "msg1")},
    ),
    "any of several criteria": (
        Match("tenant-a", subject=("user", "u2"), memory_ids=("m4",), entry_ids=(a_memory("m1"),)),
        {a_memory("m1"), a_memory("m3"), a_memory("m4"), a_message("c2", "msg1")},
    ),
    "another tenant's ids": (
        Match("tenant-b", memory_ids=("m2", "m4"), conversation_ids=("c1",)),
        {message_entry_id("tenant-b", "c1", "msg1")},
    ),
    "nothing but the tenant": (Match("tenant-a"), set()),
}


@pytest.mark.parametrize(("match", "expected"), REMOVALS.values(), ids=REMOVALS.keys())
def test_find_and_remove_take_exactly_the_matching_entries(
    store: LanceVectorStore, match: Match, expected: set[str]
) -> None:
    everything = population()
    store.upsert(everything)
    assert ids(entry for entry in everything if match.matches(entry)) == expected

    found = store.find(match)
    assert ids(found) == expected
    assert [entry.id for entry in found] == sorted(expected)

    assert store.remove(match) == len(expected)
    assert ids(stored(store, everything)) == ids(everything) - expected
    assert store.remove(match) == 0


def test_an_empty_match_selects_nothing() -> None:
    assert Match("tenant-a").is_empty
    assert match_filter(Match("tenant-a")) is None
    assert not Match("tenant-a").matches(memory("m1", "one"))


def test_filters_quote_every_identifier() -> None:
    assert sql_string("plain") == "'plain'"
    assert sql_string("o'hara") == "'o''hara'"
    assert sql_string("x' OR '1'='1") == "'x'' OR ''1''=''1'"
    assert match_filter(Match("t'1", entry_ids=("a'b",))) == (
        "tenant_id = 't''1' AND (id IN ('a''b'))"
    )


@pytest.mark.parametrize("nasty", NASTY)
def test_identifiers_with_any_characters_select_only_themselves(
    store: LanceVectorStore, nasty: str
) -> None:
    victim = message(nasty, nasty, "the nasty one", tenant_id=nasty, subject=(nasty, nasty))
    victim = dataclasses.replace(victim, memory_id=nasty)
    bystanders = [
        memory("m1", "the nasty one", tenant_id="tenant-a"),
        memory("m2", "the nasty one", tenant_id="x"),
        memory(nasty + "2", "the nasty one", tenant_id=nasty, subject=(nasty, nasty + "2")),
    ]
    store.upsert([victim, *bystanders])

    assert store.get(nasty, [victim.id]) == [victim]
    hits = store.search(nasty, victim.vector, limit=10, subject=(nasty, nasty))
    assert [hit.entry for hit in hits] == [victim]
    for match in (
        Match(nasty, subject=(nasty, nasty)),
        Match(nasty, conversation_ids=(nasty,)),
        Match(nasty, memory_ids=(nasty,)),
        Match(nasty, entry_ids=(victim.id,)),
    ):
        assert store.find(match) == [victim]
    assert store.remove(Match(nasty, memory_ids=(nasty,))) == 1
    assert ids(stored(store, bystanders)) == ids(bystanders)
