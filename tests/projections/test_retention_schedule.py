"""Retention and expiry decisions, and the ledger's legal-hold refusal, with no services."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from projections.deletion.erasure import conversation_content_key
from projections.deletion.ledger import HeldBy, ResolvedTarget, reduce_ledger
from projections.retention.schedule import (
    TENANT_DEFAULT,
    ConversationDue,
    MemoryDue,
    Policy,
    plan_conversations,
    plan_expiries,
)
from projections.stores import STORES
from streams.deletion_requests import build_deletion_request
from topics.codec import EventCodec
from topics.deletion import DeletionRequested
from topics.outputs import RejectionReason
from topics.schemas import default_schemas

NOW = datetime(2026, 9, 1, 12, tzinfo=UTC)
DAY = timedelta(days=1)
SCHEMAS = default_schemas()
CODEC = EventCodec(SCHEMAS, SCHEMAS.event_types())


def conversation(
    retention_class: str = "support_90_days", last: datetime | None = NOW - 91 * DAY
) -> ConversationDue:
    return ConversationDue("t1", "c1", retention_class, NOW - 200 * DAY, last)


POLICY = {"t1": Policy({"support_90_days": 90 * DAY, "legal": None})}


def test_a_conversation_is_due_its_period_after_its_last_message() -> None:
    (issue,) = plan_conversations([conversation()], POLICY, {}, NOW)
    assert issue.due_at == NOW - DAY
    assert issue.requested_at == issue.due_at  # the cut-off is the due time, not the round's
    assert (issue.reason, issue.target_type, issue.target_id) == ("retention", "conversation", "c1")
    assert plan_conversations([conversation(last=NOW - 89 * DAY)], POLICY, {}, NOW) == []


def test_without_a_message_the_period_runs_from_the_start() -> None:
    (issue,) = plan_conversations([conversation(last=None)], POLICY, {}, NOW)
    assert issue.due_at == NOW - 110 * DAY


def test_keep_and_defaults() -> None:
    assert plan_conversations([conversation("legal")], POLICY, {}, NOW) == []
    # An unknown class: the tenant's default, else the deployment's (keep unless set).
    assert plan_conversations([conversation("other")], POLICY, {}, NOW) == []
    assert plan_conversations([conversation("other")], {}, {}, NOW, 30 * DAY)
    with_default = {"t1": Policy(POLICY["t1"].classes, 30 * DAY)}
    assert plan_conversations([conversation("other")], with_default, {}, NOW)
    tenant_default = {"t1": Policy({TENANT_DEFAULT: 365 * DAY}, 30 * DAY)}
    assert plan_conversations([conversation("other")], tenant_default, {}, NOW) == []
    assert Policy({}, None).period("x") is None


def test_the_same_due_time_gives_the_same_event_and_a_new_message_a_new_one() -> None:
    first = plan_conversations([conversation()], POLICY, {}, NOW)
    again = plan_conversations([conversation()], POLICY, {}, NOW + DAY)
    assert first == again
    later = plan_conversations(
        [conversation(last=NOW - 90 * DAY - 1 * timedelta(hours=1))], POLICY, {}, NOW
    )
    assert later[0].deletion_id != first[0].deletion_id


def test_a_held_conversation_waits_and_catches_up_at_the_release() -> None:
    held = {("t1", "c1"): [HeldBy(NOW - 30 * DAY, None, "hold h1")]}
    assert plan_conversations([conversation()], POLICY, held, NOW) == []
    released = {("t1", "c1"): [HeldBy(NOW - 30 * DAY, NOW - timedelta(hours=1), "hold h1")]}
    (issue,) = plan_conversations([conversation()], POLICY, released, NOW)
    assert issue.requested_at == NOW - timedelta(hours=1)
    assert issue.due_at == NOW - DAY
    # A hold released before the due time changes nothing.
    early = {("t1", "c1"): [HeldBy(NOW - 30 * DAY, NOW - 20 * DAY, "hold h1")]}
    assert plan_conversations([conversation()], POLICY, early, NOW)[0].requested_at == NOW - DAY


def test_expired_memories_after_the_grace() -> None:
    memory = MemoryDue("t1", "m1", NOW - 2 * DAY)
    (issue,) = plan_expiries([memory], DAY, {}, NOW)
    assert (issue.reason, issue.target_type, issue.due_at) == ("expired", "memory", NOW - DAY)
    assert plan_expiries([memory], 3 * DAY, {}, NOW) == []
    held = {("t1", "m1"): [HeldBy(NOW - 5 * DAY, None, "hold h2")]}
    assert plan_expiries([memory], DAY, held, NOW) == []


def _request(at: datetime, scope: str | None = None) -> DeletionRequested:
    built = build_deletion_request(
        "t1", {"type": "conversation", "id": "c1"}, "retention", ("service", "x"), at,
        deletion_id="d1", scope=scope,
    )  # fmt: skip
    event = CODEC.decode(built.key, built.value)
    assert isinstance(event, DeletionRequested)
    return event


def test_the_ledger_refuses_a_request_made_while_held_whenever_it_decides() -> None:
    hold = HeldBy(NOW - DAY, NOW + DAY, "legal hold h1 on conversation c1 (case 7; by ops)")
    resolved = {("t1", "d1"): ResolvedTarget(conversations=("c1",))}
    batch = reduce_ledger(
        [_request(NOW)],
        resolved,
        {},
        {},
        timedelta(hours=1),
        STORES.requirements,
        holds={("t1", "d1"): [hold]},
    )
    assert batch.entries == []
    (rejection,) = batch.rejections
    assert rejection.reason == RejectionReason.LEGAL_HOLD
    assert "legal hold h1" in rejection.details
    # Requested after the release: erased.
    batch = reduce_ledger(
        [_request(NOW + 2 * DAY)], resolved, {}, {}, timedelta(hours=1), STORES.requirements,
        holds={("t1", "d1"): [hold]},
    )  # fmt: skip
    assert len(batch.entries) == 1 and not batch.rejections


def test_a_content_erasure_has_its_own_index_entry_and_tombstone_scope() -> None:
    resolved = {("t1", "d1"): ResolvedTarget(conversations=("c1",))}
    batch = reduce_ledger(
        [_request(NOW, "content")], resolved, {}, {}, timedelta(hours=1), STORES.requirements
    )
    (entry,) = batch.entries
    assert entry.erased == (conversation_content_key("t1", "c1"),)
    assert entry.tombstone().scope == "content"


def test_content_scope_is_for_conversations_only() -> None:
    import pytest

    from streams.deletion_requests import InvalidDeletionRequest

    with pytest.raises(InvalidDeletionRequest):
        build_deletion_request(
            "t1", {"type": "memory", "id": "m1"}, "r", ("service", "x"), NOW, scope="content"
        )


def test_two_replicas_build_the_same_request_and_the_ledger_applies_it_once() -> None:
    from streams.retention import request_message
    from topics.registry import TopicNames

    (issue,) = plan_conversations([conversation()], POLICY, {}, NOW)
    first = request_message(issue, TopicNames(""))
    second = request_message(issue, TopicNames(""))
    assert (first.key, first.value) == (second.key, second.value)
    assert first.value is not None
    event = CODEC.decode(first.key, first.value)
    assert isinstance(event, DeletionRequested)
    assert event.payload.scope == "content" and event.occurred_at == issue.due_at
    resolved = {("t1", issue.deletion_id): ResolvedTarget(conversations=("c1",))}
    batch = reduce_ledger([event, event], resolved, {}, {}, timedelta(hours=1), STORES.requirements)
    assert len(batch.entries) == 1 and batch.redelivered == 1
