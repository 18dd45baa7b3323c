"""Bodies the HTTP API answers with. Memories are the contract's own ``MemoryRecord``."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from topics.envelope import Text
from topics.outputs import MemoryRecord


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Blocked(_Body):
    """What the hydration guard dropped: per store, per reason, a count (never the items)."""

    total: int = Field(ge=0)
    stores: dict[str, dict[str, int]] = Field(
        description="per store (cache, embeddings, context), per reason (erased, deleted, "
        "revoked, superseded, expired, other_tenant): how many candidates were dropped"
    )


class MemoryList(_Body):
    memories: list[MemoryRecord]
    blocked: Blocked


class MemoryVersion(_Body):
    version: int
    status: str
    value: dict[str, Any]
    source: dict[str, Any]
    observed_at: str
    verification: str | None
    expires_at: str | None
    event_id: str
    event_type: str
    occurred_at: str
    actor: dict[str, str]
    superseded_at: str | None
    policy_version: int = Field(
        0, description="the admission policy version it was decided under (0: no policy)"
    )
    review_rule: str | None = Field(
        None, description="the rule that held it for review, if one did"
    )


class MemoryDetail(_Body):
    """A memory with its provenance and every version, oldest first."""

    memory: MemoryRecord
    eligible: bool = Field(description="recall may return it now (not revoked, not expired)")
    history: list[MemoryVersion]


class ConversationDetail(_Body):
    """A conversation's messages in order and its summaries, each with its source messages."""

    conversation: dict[str, Any]
    messages: list[dict[str, Any]]
    summaries: list[dict[str, Any]]


class ContextView(_Body):
    """The model-ready context view of a conversation."""

    conversation_id: str
    view: dict[str, Any]


class Health(_Body):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)


class RetentionClassReceipt(_Body):
    """One line of the retention receipt (``projections.retention.schedule.ClassReceipt``):
    counts and times, never content."""

    tenant_id: str
    retention_class: str
    period_seconds: float | None = Field(description="null: kept")
    inside_period: int
    held: int
    due: int
    erased_on_time: int
    erased_late: int
    oldest_overdue_seconds: float


class RetentionReceipt(_Body):
    at: str
    classes: list[RetentionClassReceipt]


class EvidenceMessage(_Body):
    """A message a held write cites, as memproj stored it (redacted when applied)."""

    event_id: str
    conversation_id: str
    message_id: str
    role: str
    content: list[dict[str, Any]]
    occurred_at: datetime
    redactions: dict[str, int]


class ReviewDiff(_Body):
    """What a reviewer decides on: the held version beside the version served meanwhile, the
    evidence it cites and the rule that asked for review. Approve or reject ``version``."""

    memory_id: str
    version: int = Field(description="the held version: the one a decision names")
    kind: str
    scope: str
    subject: dict[str, str]
    proposed_value: dict[str, Any]
    event_type: str = Field(description="the event that was held (a proposal or a correction)")
    proposed_by: dict[str, str]
    proposed_at: datetime
    source: dict[str, str]
    expires_at: datetime | None
    verification: str | None
    served: MemoryRecord | None = Field(
        description="the version served meanwhile (a held correction's predecessor), or null"
    )
    review_rule: str | None = Field(
        description="the rule that asked for review: policy:<kind>[/<scope>], policy:default, "
        "instruction:<rule> or grant"
    )
    policy_version: int = Field(description="the admission policy version it was decided under")
    evidence_event_ids: list[str]
    evidence: list[EvidenceMessage] = Field(
        description="the cited messages memproj holds; a cited id missing here is a memory "
        "event, or no longer available"
    )


class ReviewList(_Body):
    reviews: list[ReviewDiff] = Field(description="held versions, oldest first")


class ReviewDecisionBody(_Body):
    version: int = Field(ge=1, description="the held version the reviewer saw")
    decision: Literal["approved", "rejected"]
    note: Text | None = None


class ReviewAccepted(_Body):
    event_id: str
    memory_id: str
    version: int
    decision: str
    produced_at: datetime = Field(
        description="memory.reviewed was produced to memory.events: the memory worker applies "
        "it (a stale or refused review reaches memory.rejections)"
    )
