"""The deletion request builder that ``memproj delete`` and ``POST /v1/deletions`` share."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest

from streams.deletion_requests import InvalidDeletionRequest, build_deletion_request
from topics.codec import EventCodec
from topics.schemas import default_schemas

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_the_request_is_what_the_deletion_worker_decodes() -> None:
    request = build_deletion_request(
        "acme",
        {"type": "subject", "id": "u_1", "subject_type": "user"},
        "user asked",
        ("agent", "support-bot"),
        NOW,
        timedelta(minutes=10),
    )
    codec = EventCodec(default_schemas(), frozenset({"deletion.requested"}))
    event = codec.decode(request.key, request.value)
    assert request.key == f"acme:{request.deletion_id}".encode()
    assert event.tenant_id == "acme" and event.entity_id == request.deletion_id
    assert event.payload.deadline_at == NOW + timedelta(minutes=10)
    assert (event.actor.type, event.actor.id) == ("agent", "support-bot")
    assert request.requested_at == NOW


def test_without_a_deadline_the_ledger_default_applies() -> None:
    request = build_deletion_request(
        "acme", {"type": "memory", "id": "m1"}, "r", ("operator", "cli"), NOW, deletion_id="d1"
    )
    assert request.deletion_id == "d1"
    assert "deadline_at" not in orjson.loads(request.value)["payload"]


@pytest.mark.parametrize(
    "target",
    [
        {"type": "subject", "id": "u_1"},  # a subject needs its type
        {"type": "everything", "id": "x"},
        {"type": "memory", "id": ""},
    ],
)
def test_a_request_the_worker_would_dead_letter_is_refused(target: dict[str, str]) -> None:
    with pytest.raises(InvalidDeletionRequest):
        build_deletion_request("acme", target, "r", ("operator", "cli"), NOW)
