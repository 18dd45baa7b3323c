"""The purpose policy, pure: which memories a purpose reads, and what a request may name."""

from __future__ import annotations

import pytest

from projections.access.policy import (
    MemoryFilters,
    PolicyRefusal,
    PurposePolicy,
    allowed,
    check_conversations,
    check_purpose,
    memory_filters,
)

NOTE = PurposePolicy("acme", "internal_note", frozenset({"*"}), frozenset({"*"}), True)
CUSTOMER = PurposePolicy("acme", "message_customer", frozenset({"preference"}), frozenset({"user"}))


def refusal(call: object, *args: object, **kwargs: object) -> str:
    with pytest.raises(PolicyRefusal) as raised:
        call(*args, **kwargs)  # type: ignore[operator]
    return raised.value.code


def test_a_wildcard_leaves_the_query_unconfined() -> None:
    assert memory_filters(NOTE) == MemoryFilters(None, None)
    assert memory_filters(NOTE, kind="risk") == MemoryFilters(frozenset({"risk"}), None)
    assert NOTE.may_read("anything", "anywhere")


def test_a_confined_purpose_confines_the_query() -> None:
    assert memory_filters(CUSTOMER) == MemoryFilters(frozenset({"preference"}), frozenset({"user"}))
    assert memory_filters(CUSTOMER, kind="preference", scope="user") == MemoryFilters(
        frozenset({"preference"}), frozenset({"user"})
    )
    assert CUSTOMER.may_read("preference", "user")
    assert not CUSTOMER.may_read("risk", "user")
    assert not CUSTOMER.may_read("preference", "team")


def test_naming_what_the_purpose_may_not_read_is_refused() -> None:
    assert refusal(memory_filters, CUSTOMER, kind="risk") == "kind_not_allowed"
    assert refusal(memory_filters, CUSTOMER, scope="team") == "scope_not_allowed"


def test_a_purpose_without_a_policy_reads_nothing() -> None:
    assert refusal(memory_filters, None) == "purpose_without_policy"
    assert refusal(check_conversations, None) == "purpose_without_policy"
    empty = PurposePolicy("acme", "empty", frozenset(), frozenset())
    assert not empty.may_read("preference", "user")
    assert memory_filters(empty) == MemoryFilters(frozenset(), frozenset())


def test_conversations_only_when_the_policy_says_so() -> None:
    check_conversations(NOTE)
    assert refusal(check_conversations, CUSTOMER) == "conversations_not_allowed"


def test_the_purpose_must_be_the_keys() -> None:
    check_purpose("support", ("support", "billing"))
    assert refusal(check_purpose, "marketing", ("support",)) == "purpose_not_granted"


def test_a_decision_names_ids_once() -> None:
    decision = allowed(["m1", "m2"], ["m3", "m3", "m4"])
    assert decision.decision == "allowed"
    assert decision.returned_ids == ("m1", "m2")
    assert decision.filtered_ids == ("m3", "m4")
