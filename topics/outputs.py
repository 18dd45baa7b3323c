"""Records memproj publishes: the current memory, rejections and dead letters."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from topics.envelope import EventLike, Frozen, Identifier, Source, Subject, Timestamp

# ``erased`` is the projection's own: a version whose content an erasure covered (it was taken
# from an erased conversation) while the memory itself was not erased. It keeps the memory's
# place in its history, so that a later correction from elsewhere still applies, and is never
# served or published (``memory.current`` has a null for it, as for a revocation).
# ``pending_review`` (held by the admission policy until a person reviews it) and ``rejected``
# (a reviewer refused it) are never served either (contract 1.2).
MemoryStatus = Literal["proposed", "verified", "revoked", "erased", "pending_review", "rejected"]
# What recall, search, the context view, the cache and the vector store may serve.
ELIGIBLE_STATUSES: tuple[MemoryStatus, ...] = ("verified", "proposed")
# What a dead letter keeps of the original value and key: with base64's growth by a third and
# the other fields, it stays well under MESSAGE_MAX_BYTES.
ORIGINAL_MAX_BYTES = 512 * 1024
KEY_MAX_CHARS = 4096


class MemoryRecord(Frozen):
    """One memory as the projection holds it, and as ``memory.current`` carries it."""

    tenant_id: Identifier
    memory_id: Identifier
    subject: Subject
    scope: Identifier
    kind: Identifier
    value: dict[str, Any]
    source: Source
    status: MemoryStatus
    version: int
    observed_at: Timestamp
    expires_at: Timestamp | None = None
    verification: str | None = None
    evidence_event_ids: tuple[str, ...] = ()
    created_at: Timestamp
    updated_at: Timestamp
    last_event_id: Identifier
    revoked_reason: str | None = None

    @property
    def servable(self) -> bool:
        """Whether its status lets any read path serve it (expiry aside)."""
        return self.status in ELIGIBLE_STATUSES

    def is_eligible(self, now: datetime) -> bool:
        """Recall may return it: of an eligible status and not expired (expiry is judged at
        read time)."""
        return self.servable and (self.expires_at is None or self.expires_at > now)


class RejectionReason(StrEnum):
    VERSION_CONFLICT = "version_conflict"
    UNKNOWN_MEMORY = "unknown_memory"
    REVOKED = "revoked"
    DUPLICATE_MISMATCH = "duplicate_mismatch"
    ERASED = "erased"
    # Governed writes (contract 1.2).
    KIND_NOT_ADMITTED = "kind_not_admitted"
    REVIEW_NOT_ALLOWED = "review_not_allowed"
    STALE_REVIEW = "stale_review"
    EVIDENCE_UNAVAILABLE = "evidence_unavailable"
    DERIVED_EVIDENCE = "derived_evidence"
    # Additions to the contract's list: a grant whose value lacks the grant's shape; a
    # verification of a version held for review (review it instead); a verification of a
    # memory whose only version a reviewer rejected.
    INVALID_GRANT = "invalid_grant"
    PENDING_REVIEW = "pending_review"
    REVIEW_REJECTED = "review_rejected"
    # Conversation reasons: an addition to the contract's list, on conversation.rejections.
    UNKNOWN_CONVERSATION = "unknown_conversation"
    CONVERSATION_EXISTS = "conversation_exists"
    MESSAGE_EXISTS = "message_exists"
    STALE_SUMMARY = "stale_summary"
    UNKNOWN_SOURCE_MESSAGE = "unknown_source_message"
    # Deletion reasons, on deletion.rejections.
    DELETION_EXISTS = "deletion_exists"
    UNKNOWN_DELETION = "unknown_deletion"
    LEGAL_HOLD = "legal_hold"


class Rejection(Frozen):
    """A well-formed event that was refused; published on ``memory.rejections`` (or
    ``conversation.rejections`` for conversation events)."""

    event_id: str
    reason: RejectionReason
    details: str
    tenant_id: str
    # The memory, conversation or deletion the refused event is about (the message key's id).
    entity_id: str
    event_type: str
    occurred_at: Timestamp
    # Whom it is about, where known: lets the deletion ledger find the rejection too.
    subject: Subject | None = None

    @classmethod
    def of(
        cls,
        event: EventLike,
        reason: RejectionReason,
        details: str,
        subject: Subject | None = None,
    ) -> Rejection:
        return cls(
            event_id=event.event_id,
            reason=reason,
            details=details,
            tenant_id=event.tenant_id,
            entity_id=event.entity_id,
            event_type=event.event_type,
            occurred_at=event.occurred_at,
            subject=subject,
        )


class DeadLetterReason(StrEnum):
    INVALID_KEY = "invalid_key"
    EMPTY_VALUE = "empty_value"
    MALFORMED_JSON = "malformed_json"
    UNKNOWN_EVENT_TYPE = "unknown_event_type"
    UNKNOWN_SCHEMA_VERSION = "unknown_schema_version"
    INVALID_EVENT = "invalid_event"
    KEY_MISMATCH = "key_mismatch"
    VALUE_TOO_LARGE = "value_too_large"
    UNREADABLE_SEAL = "unreadable_seal"
    # Valid under the contract, but PostgreSQL or Kafka cannot hold it (a NUL character, an
    # index entry or an output message over its size limit).
    UNSTORABLE = "unstorable"
    # Valid as far as decoding can tell, but applying it raised an error that is neither
    # transient nor about the environment: a bug this one message hits (the error names the
    # stage and the exception). Replayable once the bug is fixed.
    PROCESSING_FAILED = "processing_failed"


class SealedOriginal(Frozen):
    """The original message of a dead letter and its error detail, sealed (AES-256-GCM) under
    a data key of this letter alone; the key lives in PostgreSQL until the letter's owner is
    erased or its retention ends (``projections.deadletters``)."""

    format: str
    key_id: str
    ciphertext: str  # base64


class DeadLetter(Frozen):
    """A message not valid under the contract; published on ``<input topic>.dlq``.

    ``original`` and ``error`` are the contract; the rest are optional additions. memproj
    writes no plaintext of the message: ``original`` is empty (a reader that only knows the
    contract decodes it to no bytes) and ``sealed_original`` holds the original value, key and
    the error's detail; ``error`` names the reason, the stage and the exception class only,
    since the detail of a validation or database error can quote the input.
    """

    original: str  # base64 of the original bytes: "" when the original is sealed
    topic: str
    partition: int
    offset: int
    error: str
    error_code: DeadLetterReason
    key: str | None
    failed_at: datetime
    # Set when the sealed original holds only the first ORIGINAL_MAX_BYTES: a dead letter
    # must fit in one message.
    original_truncated: bool = False
    original_size: int | None = None
    sealed_original: SealedOriginal | None = None
