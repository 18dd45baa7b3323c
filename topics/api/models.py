"""Bodies the HTTP API answers with. Memories are the contract's own ``MemoryRecord``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

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
