"""The memory projection's tables against the real PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topics.envelope import source_conversation

refs = st.text(
    alphabet=st.sampled_from("/%2F5af:.ü ") | st.characters(exclude_categories=["Cs"]),
    max_size=40,
).filter(lambda ref: "\x00" not in ref)


@pytest.mark.integration
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(source_type=st.sampled_from(["message", "crm"]), ref=refs)
def test_postgres_finds_the_conversation_of_a_source_as_the_contract_rule_does(
    env: Any, source_type: str, ref: str
) -> None:
    """``source_conversation_id`` is generated in SQL (migrations): the same rule."""
    with env.connect() as conn:
        (found,) = conn.execute(
            "SELECT memproj_source_conversation(%s, %s)", (source_type, ref)
        ).fetchone()
    assert found == source_conversation(source_type, ref)
