"""An event type memproj does not implement yet, marked as docs/howto-event-type.md says:
``memory.reviewed`` of contract 1.2, whose ``note`` is free text from its reviewer. Tests seal,
open and redact it with no change to sealing or redaction, showing that both derive from the
marks alone."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from pydantic import Field

from projections.sealing import fields
from topics.envelope import Identifier, Personal, Text, Wire
from topics.memory import MemoryEvent
from topics.personal import PERSONAL_EVENTS, personal_events
from topics.schemas import EventSchema, SchemaRegistry, default_schemas


class MemoryReviewedPayload(Wire):
    memory_id: Identifier
    reviewed_version: int = Field(ge=1)
    decision: Literal["approved", "rejected"]
    # Free text from the reviewer: personal. Optional, so marked inside its ``| None``.
    note: Annotated[Text, Personal(placeholder="[unreadable]")] | None = None


class MemoryReviewed(MemoryEvent):
    event_type: Literal["memory.reviewed"]
    payload: MemoryReviewedPayload


def schemas_with_reviews() -> SchemaRegistry:
    return SchemaRegistry(
        [*(EventSchema(model) for model in default_schemas().models()), EventSchema(MemoryReviewed)]
    )


def reviewed(tenant_id: str, memory_id: str, note: str) -> dict[str, object]:
    return {
        "event_id": f"rev-{memory_id}",
        "event_type": "memory.reviewed",
        "schema_version": 1,
        "tenant_id": tenant_id,
        "occurred_at": "2026-08-08T09:30:00Z",
        "actor": {"type": "operator", "id": "reviewer_1"},
        "payload": {
            "memory_id": memory_id,
            "reviewed_version": 1,
            "decision": "rejected",
            "note": note,
        },
    }


def register_reviews(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sealer's table as it would be with ``memory.reviewed`` among the contract's models:
    computed from the models, nothing listed by hand."""
    table = {**PERSONAL_EVENTS, **personal_events([MemoryReviewed])}
    monkeypatch.setattr(fields, "PERSONAL_EVENTS", table)
