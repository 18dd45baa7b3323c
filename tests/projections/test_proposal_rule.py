"""Who may propose through the API (``projections.access.proposals``): pure."""

from __future__ import annotations

import pytest

from projections.access.policy import PolicyRefusal
from projections.access.proposals import PROPOSE, judge_proposal, key_actor


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
