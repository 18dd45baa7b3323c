"""Memory events on ``memory.events`` (contract version 1; ``memory.reviewed`` since 1.2)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

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


class MemoryReviewedPayload(Wire):
    memory_id: Identifier
    # The pending version the reviewer saw: an approval of anything else is stale.
    reviewed_version: int = Field(ge=1)
    decision: Literal["approved", "rejected"]
    # Free text from the reviewer: personal. Optional, so marked inside its ``| None``.
    note: Annotated[Text, Personal(placeholder="[unreadable]")] | None = None


class EvidenceStamp(Wire):
    """What the sealer found in PostgreSQL of the evidence an event cites, when it sealed it."""

    # The ids the decision is about: the event's ``evidence_event_ids`` (a verification's:
    # the memory's, as they stood).
    cited: tuple[Identifier, ...] = ()
    # Of those, the events memproj applied for the tenant and has not erased.
    available: tuple[Identifier, ...] = ()
    # Of those, the primary ones: a user message, a tool result, a non-derived memory's event.
    primary: tuple[Identifier, ...] = ()


class AdmissionStamp(Wire):
    """memproj's own addition to a memory event on its sealed log: the admission policy version
    in force and the evidence as found when the event was first decided. A rebuild decides from
    the stamp, never from the database as it is later. Absent: policy version 0 (contract 1.1)."""

    policy_version: int = Field(ge=0)
    evidence: EvidenceStamp = EvidenceStamp()


class MemoryEvent(Envelope):
    entity_field: ClassVar[str] = "memory_id"
    entity_type: ClassVar[str] = "memory"
    # Set by the sealer only (it replaces whatever a producer sent), never serialised with the
    # model (so neither in body hashes nor in the contract's schema): the sealer writes it.
    admission: SkipJsonSchema[AdmissionStamp | None] = Field(default=None, exclude=True)

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


class MemoryReviewed(MemoryEvent):
    event_type: Literal["memory.reviewed"]
    payload: MemoryReviewedPayload


MEMORY_EVENT_TYPES: tuple[type[MemoryEvent], ...] = (
    MemoryProposed,
    MemoryVerified,
    MemoryCorrected,
    MemoryRevoked,
    MemoryReviewed,
)
