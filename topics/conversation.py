"""Conversation events on ``conversation.events`` (contract version 1, message_added v2).

``conversation.message_added`` is at schema version 2, a compatible extension: in version 1
``content`` may be a plain string or a list of blocks; version 2 always carries blocks. Version
1 events are upcast on read (a string becomes one text block), so the projection, the
redaction and the context view deal with one shape only.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from topics.envelope import Envelope, Identifier, NotPersonal, Personal, StoredInt, Subject, Wire

Role = Literal["user", "assistant"]


class TextBlock(Wire):
    type: Literal["text"]
    text: str


class ToolUseBlock(Wire):
    type: Literal["tool_use"]
    id: Identifier
    name: Identifier
    input: dict[str, Any]


class ToolResultBlock(Wire):
    type: Literal["tool_result"]
    tool_use_id: Identifier
    # A tool's output: a string, or a list of blocks (text, or anything a tool returns).
    content: str | list[dict[str, Any]]
    is_error: bool = False


ContentBlock = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


class ConversationStartedPayload(Wire):
    conversation_id: Identifier
    owner: Subject
    channel: Identifier
    retention_class: Identifier
    provider_conversation_ref: (
        Annotated[str, Field(max_length=512), NotPersonal("the provider's id of the conversation")]
        | None
    ) = None


class MessageAddedPayload(Wire):
    conversation_id: Identifier
    message_id: Identifier
    role: Role
    # Everything in it is personal; the ids and types of its blocks stay as they are when it
    # is redacted. An empty list stands in for content that can no longer be opened.
    content: Annotated[tuple[ContentBlock, ...], Personal(placeholder=[])]


class SummaryUpdatedPayload(Wire):
    conversation_id: Identifier
    summary_version: StoredInt = Field(ge=1)
    text: Annotated[str, Field(min_length=1), Personal(placeholder="[unreadable]")]
    source_message_ids: tuple[Identifier, ...] = Field(min_length=1)


class ConversationEvent(Envelope):
    entity_field: ClassVar[str] = "conversation_id"
    entity_type: ClassVar[str] = "conversation"

    @property
    def conversation_id(self) -> str:
        return self.entity_id


class ConversationStarted(ConversationEvent):
    event_type: Literal["conversation.started"]
    payload: ConversationStartedPayload


class MessageAdded(ConversationEvent):
    event_type: Literal["conversation.message_added"]
    payload: MessageAddedPayload


class SummaryUpdated(ConversationEvent):
    event_type: Literal["conversation.summary_updated"]
    payload: SummaryUpdatedPayload


def message_content_v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    payload = raw.get("payload")
    if isinstance(payload, dict) and isinstance(payload.get("content"), str):
        payload["content"] = [{"type": "text", "text": payload["content"]}]
    return raw


CONVERSATION_EVENT_TYPES: tuple[type[ConversationEvent], ...] = (
    ConversationStarted,
    MessageAdded,
    SummaryUpdated,
)
