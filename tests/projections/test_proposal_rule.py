"""Who may propose through the API (``projections.access.proposals``): pure."""

from __future__ import annotations

import pytest

from projections.access.policy import WILDCARD, PolicyRefusal, WriteBounds
from projections.access.proposals import (
    PROPOSE,
    judge_memory_write,
    judge_proposal,
    judge_reviewer,
    key_actor,
)


def refusal(event_tenant: str, event_actor: tuple[str, str], purposes: list[str]) -> str | None:
    try:
        judge_proposal(event_tenant, event_actor, "acme", "agent:support-bot", purposes)
    except PolicyRefusal as refused:
        return refused.code
    return None


def test_an_event_of_the_keys_tenant_and_actor_under_propose_is_accepted() -> None:
    assert refusal("acme", ("agent", "support-bot"), [PROPOSE, "support"]) is None


@pytest.mark.parametrize(
    ("event_tenant", "event_actor", "purposes", "code"),
    [
        # Another tenant's first, whatever else is wrong: the key learns only "not yours".
        ("globex", ("agent", "support-bot"), [PROPOSE], "tenant_mismatch"),
        ("globex", ("agent", "other"), ["support"], "tenant_mismatch"),
        ("acme", ("agent", "support-bot"), ["support"], "purpose_not_granted"),
        ("acme", ("agent", "other-bot"), [PROPOSE], "actor_mismatch"),
        ("acme", ("user", "support-bot"), [PROPOSE], "actor_mismatch"),
    ],
)
def test_other_tenants_missing_purposes_and_other_actors_are_refused(
    event_tenant: str, event_actor: tuple[str, str], purposes: list[str], code: str
) -> None:
    assert refusal(event_tenant, event_actor, purposes) == code


@pytest.mark.parametrize(
    ("actor", "expected"),
    [
        ("agent:support-bot", ("agent", "support-bot")),
        ("user:u_1", ("user", "u_1")),
        ("service:a:b", ("service", "a:b")),
        ("support-bot", ("service", "support-bot")),
        ("robot:r2", ("service", "robot:r2")),  # not a contract actor type
        ("agent:", ("service", "agent:")),
    ],
)
def test_a_keys_actor_names_a_contract_actor(actor: str, expected: tuple[str, str]) -> None:
    assert key_actor(actor) == expected


# -- write bounds ------------------------------------------------------------------------------

SUPPORT_BOT = WriteBounds(frozenset({"preference", "fact"}), frozenset({"support"}))


def write_refusal(
    bounds: WriteBounds | None, proposed: tuple[str, str] | None, stored: tuple[str, str] | None
) -> str | None:
    try:
        judge_memory_write(bounds, "mem_1", proposed, stored)
    except PolicyRefusal as refused:
        return refused.code
    return None


@pytest.mark.parametrize(
    ("proposed", "stored"),
    [
        (("risk", "billing"), None),
        (None, ("risk", "billing")),
        (None, None),  # a memory the projection does not hold
        (("preference", "support"), ("risk", "support")),
    ],
)
def test_a_key_without_bounds_writes_anything_as_before(
    proposed: tuple[str, str] | None, stored: tuple[str, str] | None
) -> None:
    assert write_refusal(None, proposed, stored) is None


def test_a_bounded_key_proposes_its_kinds_in_its_scopes() -> None:
    assert write_refusal(SUPPORT_BOT, ("preference", "support"), None) is None
    assert write_refusal(SUPPORT_BOT, ("fact", "support"), ("fact", "support")) is None


@pytest.mark.parametrize(
    ("proposed", "stored", "code"),
    [
        # A support bot cannot propose a risk memory, nor one in another scope.
        (("risk", "support"), None, "kind_not_writable"),
        (("preference", "billing"), None, "scope_not_writable"),
        (("risk", "billing"), None, "kind_not_writable"),
        # Re-proposing a memory id that holds a memory it may not write.
        (("preference", "support"), ("risk", "support"), "memory_not_writable"),
        # Verifying, correcting or revoking: judged on the stored memory.
        (None, ("risk", "support"), "memory_not_writable"),
        (None, ("preference", "billing"), "memory_not_writable"),
        # One the projection does not hold: refused alike (its existence is not told).
        (None, None, "memory_not_writable"),
    ],
)
def test_a_bounded_key_is_refused_outside_its_bounds(
    proposed: tuple[str, str] | None, stored: tuple[str, str] | None, code: str
) -> None:
    assert write_refusal(SUPPORT_BOT, proposed, stored) == code


def test_a_bounded_key_changes_the_memories_within_its_bounds() -> None:
    assert write_refusal(SUPPORT_BOT, None, ("fact", "support")) is None


def test_wildcards_bound_nothing_in_their_dimension() -> None:
    any_scope = WriteBounds(frozenset({"preference"}), frozenset({WILDCARD}))
    assert write_refusal(any_scope, ("preference", "billing"), None) is None
    assert write_refusal(any_scope, ("risk", "billing"), None) == "kind_not_writable"
    nothing = WriteBounds(frozenset(), frozenset({WILDCARD}))
    assert write_refusal(nothing, ("preference", "billing"), None) == "kind_not_writable"


@pytest.mark.parametrize(
    ("actor", "reviewer"),
    [("operator:ana", ("operator", "ana")), ("user:u_1", ("user", "u_1"))],
)
def test_a_persons_key_reviews_as_that_person(actor: str, reviewer: tuple[str, str]) -> None:
    assert judge_reviewer(actor) == reviewer


@pytest.mark.parametrize("actor", ["agent:support-bot", "service:indexer", "support-bot"])
def test_no_agent_or_service_key_reviews(actor: str) -> None:
    with pytest.raises(PolicyRefusal) as refused:
        judge_reviewer(actor)
    assert refused.value.code == "review_not_allowed"
