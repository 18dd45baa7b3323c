"""An event type memproj does not implement yet, marked as docs/howto-event-type.md says:
``memory.annotated``, a note a person attaches to a memory, whose ``note`` is free text. Tests seal,
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


class MemoryAnnotatedPayload(Wire):
    memory_id: Identifier
    annotated_version: int = Field(ge=1)
    tone: Literal["caution", "context"]
    # Free text from its author: personal. Optional, so marked inside its ``| None``.
    note: Annotated[Text, Personal(placeholder="[unreadable]")] | None = None


class MemoryAnnotated(MemoryEvent):
    event_type: Literal["memory.annotated"]
    payload: MemoryAnnotatedPayload


def schemas_with_annotations() -> SchemaRegistry:
    return SchemaRegistry(
        [
            *(EventSchema(model) for model in default_schemas().models()),
            EventSchema(MemoryAnnotated),
        ]
    )


def annotated(tenant_id: str, memory_id: str, note: str) -> dict[str, object]:
    return {
        "event_id": f"note-{memory_id}",
        "event_type": "memory.annotated",
        "schema_version": 1,
        "tenant_id": tenant_id,
        "occurred_at": "2026-08-08T09:30:00Z",
        "actor": {"type": "operator", "id": "reviewer_1"},
        "payload": {
            "memory_id": memory_id,
            "annotated_version": 1,
            "tone": "caution",
            "note": note,
        },
    }


def register_annotations(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sealer's table as it would be with ``memory.annotated`` among the contract's models:
    computed from the models, nothing listed by hand."""
    table = {**PERSONAL_EVENTS, **personal_events([MemoryAnnotated])}
    monkeypatch.setattr(fields, "PERSONAL_EVENTS", table)
