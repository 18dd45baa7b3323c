"""Personal fields are marked once, on the contract's models: every string of every event type
is marked, and what sealing needs is read from the marks. No services."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import pytest

from topics.conversation import MessageAddedPayload, ToolResultBlock, ToolUseBlock
from topics.deletion import DeletionRequested, DeletionRequestedPayload
from topics.envelope import (
    Envelope,
    Identifier,
    NotPersonal,
    Personal,
    Source,
    Text,
    Wire,
)
from topics.personal import (
    PERSONAL_EVENTS,
    Shape,
    field_shapes,
    personal_events,
    unmarked_strings,
)
from topics.schemas import default_schemas


@pytest.mark.parametrize("model", default_schemas().models(), ids=lambda m: m.__name__)
def test_every_string_of_every_event_type_is_marked(model: type[Envelope]) -> None:
    # Personal (sealed, redacted), NotPersonal (ids, references, a deletion's reason, each
    # with why) or an enumeration: a free-text field nobody marked would be stored in
    # plaintext. Mark it on its model in topics/ (docs/howto-event-type.md).
    assert unmarked_strings(model) == []


class _Note(Wire):
    author: Identifier
    comment: str
    quoted: Annotated[str, Personal(placeholder="")]


class _UnmarkedPayload(Wire):
    thing_id: Identifier
    state: Literal["open", "closed"]
    note: Text
    details: dict[str, Any]
    notes: tuple[_Note, ...] = ()
    size: int = 0


class _UnmarkedEvent(Envelope):
    entity_field: ClassVar[str] = "thing_id"
    entity_type: ClassVar[str] = "thing"
    event_type: Literal["thing.noted"]
    payload: _UnmarkedPayload


def test_an_event_type_with_an_unmarked_string_fails_the_check() -> None:
    assert unmarked_strings(_UnmarkedEvent) == [
        "payload.note: a string neither Personal nor NotPersonal",
        "payload.details[key]: a string neither Personal nor NotPersonal",
        "payload.details[]: a string neither Personal nor NotPersonal",
        "payload.notes[].comment: a string neither Personal nor NotPersonal",
        # Sealing moves whole payload fields: a mark deeper down would never be sealed.
        "payload.notes[].quoted: marked Personal below a payload's top level",
    ]


class _MarkedPayload(Wire):
    thing_id: Identifier
    state: Literal["open", "closed"]
    note: Annotated[Text, Personal(placeholder="[unreadable]")]
    details: Annotated[dict[str, Any], Personal(placeholder={})]
    ticket: Annotated[str, NotPersonal("the ticket system's id")] | None = None
    # Optional: marked inside its ``| None``.
    remark: Annotated[Text, Personal(placeholder="[unreadable]")] | None = None
    source: Source
    size: int = 0


class _MarkedEvent(Envelope):
    entity_field: ClassVar[str] = "thing_id"
    entity_type: ClassVar[str] = "thing"
    event_type: Literal["thing.noted"]
    payload: _MarkedPayload


def test_what_sealing_needs_is_read_from_the_marks() -> None:
    assert unmarked_strings(_MarkedEvent) == []
    (fields,) = personal_events([_MarkedEvent, DeletionRequested]).values()
    assert fields.event_type == "thing.noted"
    assert (fields.entity_type, fields.entity_field) == ("thing", "thing_id")
    assert fields.names == ("note", "details", "remark")
    assert fields.placeholders == {"note": "[unreadable]", "details": {}, "remark": "[unreadable]"}
    assert fields.legacy_plaintext == frozenset()
    # It says where its content was taken from: that conversation's key seals it too.
    assert fields.source_field == "source"


def test_the_personal_fields_of_the_contract() -> None:
    # The sealed log's format depends on this table: it is what the sealer sealed before the
    # marks existed, field for field.
    table: dict[str, tuple[Any, ...]] = {
        event_type: (
            fields.entity_type,
            fields.entity_field,
            fields.names,
            dict(fields.placeholders),
            fields.source_field,
            set(fields.legacy_plaintext),
        )
        for event_type, fields in PERSONAL_EVENTS.items()
    }
    assert table == {
        "memory.proposed": ("memory", "memory_id", ("value",), {"value": {}}, "source", set()),
        "memory.corrected": ("memory", "memory_id", ("value",), {"value": {}}, "source", set()),
        # The reviewer's note (contract 1.2).
        "memory.reviewed": (
            "memory",
            "memory_id",
            ("note",),
            {"note": "[unreadable]"},
            None,
            set(),
        ),
        "memory.revoked": (
            "memory",
            "memory_id",
            ("reason",),
            {"reason": "[unreadable]"},
            None,
            {"reason"},  # sealed since the sealer learned it was free text
        ),
        "conversation.message_added": (
            "conversation",
            "conversation_id",
            ("content",),
            {"content": []},
            None,
            set(),
        ),
        "conversation.summary_updated": (
            "conversation",
            "conversation_id",
            ("text",),
            {"text": "[unreadable]"},
            None,
            set(),
        ),
    }


def test_a_deletions_reason_is_declared_readable_as_the_ledgers_receipt() -> None:
    assert "deletion.requested" not in PERSONAL_EVENTS
    metadata = DeletionRequestedPayload.model_fields["reason"].metadata
    (declared,) = [mark for mark in metadata if isinstance(mark, NotPersonal)]
    assert "receipt" in declared.why


def test_the_shapes_redaction_walks() -> None:
    assert field_shapes(MessageAddedPayload)["content"] is Shape.MODELS
    assert dict(field_shapes(ToolUseBlock)) == {
        "type": Shape.KEPT,
        "id": Shape.KEPT,
        "name": Shape.KEPT,
        "input": Shape.FREE,
    }
    assert dict(field_shapes(ToolResultBlock)) == {
        "type": Shape.KEPT,
        "tool_use_id": Shape.KEPT,
        "content": Shape.FREE,
        "is_error": Shape.KEPT,
    }
