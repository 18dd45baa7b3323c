"""Memory events on ``memory.events`` (contract version 1)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from topics.envelope import (
    Envelope,
    Identifier,
    Personal,
    Source,
    Subject,
    Text,
    Timestamp,
    Wire,
)

# A memory's value: a JSON object from its producer, personal. ``{}`` stands in for a value
# that can no longer be opened.
Value = Annotated[dict[str, Any], Personal(placeholder={})]


class MemoryProposedPayload(Wire):
    memory_id: Identifier
    subject: Subject
    scope: Identifier
    kind: Identifier
    value: Value
    source: Source
    observed_at: Timestamp
    expires_at: Timestamp | None = None
    evidence_event_ids: tuple[Identifier, ...] = ()


class MemoryVerifiedPayload(Wire):
    memory_id: Identifier
    expected_version: int = Field(ge=1)
    verification: Identifier | None = None


class MemoryCorrectedPayload(Wire):
    memory_id: Identifier
    expected_version: int = Field(ge=1)
    value: Value
    source: Source
    observed_at: Timestamp
    # Omitted keeps the memory's current expiry; an explicit null removes it (contract 1.1).
    # ``expiry_given`` tells the two apart: never read ``expires_at`` alone.
    expires_at: Timestamp | None = None
    verification: Identifier | None = None

    @property
    def expiry_given(self) -> bool:
        """Whether the correction says anything about expiry: ``expires_at`` was present,
        as a timestamp or as null. Known from pydantic's ``model_fields_set``, so it holds
        for an event validated from JSON as for one built in Python; whatever re-serialises
        an event must keep an omitted field omitted (the sealer writes ``exclude_unset``)."""
        return "expires_at" in self.model_fields_set


class MemoryRevokedPayload(Wire):
    memory_id: Identifier
    expected_version: int | None = Field(default=None, ge=1)
    # Free text from its producer: personal until proven otherwise. The sealer wrote it in
    # plaintext before it was sealed.
    reason: Annotated[Text, Personal(placeholder="[unreadable]", legacy_plaintext=True)]


class MemoryEvent(Envelope):
    entity_field: ClassVar[str] = "memory_id"
    entity_type: ClassVar[str] = "memory"

    @property
    def memory_id(self) -> str:
        return self.entity_id


class MemoryProposed(MemoryEvent):
    event_type: Literal["memory.proposed"]
    payload: MemoryProposedPayload


class MemoryVerified(MemoryEvent):
    event_type: Literal["memory.verified"]
    payload: MemoryVerifiedPayload


class MemoryCorrected(MemoryEvent):
    event_type: Literal["memory.corrected"]
    payload: MemoryCorrectedPayload


class MemoryRevoked(MemoryEvent):
    event_type: Literal["memory.revoked"]
    payload: MemoryRevokedPayload


MEMORY_EVENT_TYPES: tuple[type[MemoryEvent], ...] = (
    MemoryProposed,
    MemoryVerified,
    MemoryCorrected,
    MemoryRevoked,
)
