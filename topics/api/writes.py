"""Bodies of the HTTP API's writes: proposals (a contract event, as producers send it to the
input topics) and deletion requests, and what the API answers."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from topics.conversation import CONVERSATION_EVENT_TYPES
from topics.deletion import DeletionTarget
from topics.envelope import Envelope, Text
from topics.memory import MEMORY_EVENT_TYPES

# The most a deletion request may give its stores (the ledger's deadline, not the API's).
MAX_DEADLINE_SECONDS = 30 * 86400.0
MEMORY_EVENT_SCHEMA = "MemoryEvent"
CONVERSATION_EVENT_SCHEMA = "ConversationEvent"


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ProposalAnswer(_Body):
    event_id: str
    event_type: str
    status: Literal["accepted", "duplicate"] = Field(
        description="accepted: produced to the input topic now; duplicate: this event id was "
        "accepted before (nothing was produced this time)"
    )
    accepted_at: datetime = Field(description="when the event id was first accepted")


class DeletionRequestBody(_Body):
    target: DeletionTarget = Field(
        description="what to delete: a subject (with subject_type), a conversation or a memory "
        "of the key's tenant"
    )
    reason: Text = "requested through the API"
    deadline_seconds: float | None = Field(
        None,
        gt=0,
        le=MAX_DEADLINE_SECONDS,
        description="how long the stores have; default: the deployment's deletion deadline",
    )


class DeletionAccepted(_Body):
    deletion_id: str
    tenant_id: str
    requested_at: datetime
    status_url: str = Field(
        description="GET it for the per-store status: 404 until the deletion worker has "
        "recorded the request (usually within a second)"
    )


class StoreProgress(_Body):
    status: str = Field(description="pending, done or failed")
    deadline_at: datetime
    acked_at: datetime | None
    removed_count: int | None
    attempts: int
    redeliveries: int
    last_redelivered_at: datetime | None
    error: str | None
    seconds_to_ack: float | None = None
    purged_at: datetime | None = Field(
        None, description="when no copy was left in the store (null: not purged yet)"
    )


class PlacePurge(_Body):
    due_at: datetime = Field(description="when the deletion was completed (the check began)")
    purged_at: datetime | None = Field(description="when no copy was left here")
    seconds_to_purge: float | None = None


class DeletionProgress(_Body):
    """One deletion as the ledger holds it (``projections.deletion.lifecycle.request_detail``):
    ids, counts and timings, never content."""

    tenant_id: str
    deletion_id: str
    kind: str = Field(description="erasure or revocation")
    target_type: str
    target_id: str
    subject_type: str | None
    reason: str
    cut_off: datetime
    recorded_at: datetime
    deadline_at: datetime
    required_stores: list[str]
    status: str = Field(description="pending or completed")
    completed_at: datetime | None
    seconds_to_complete: float | None = None
    verification: dict[str, Any] | None
    verified_at: datetime | None
    items: dict[str, int] = Field(description="per item type, how many the deletion covers")
    stores: dict[str, StoreProgress]
    purged_at: datetime | None = Field(
        None,
        description="when no copy was left anywhere memproj writes (every place of purge); "
        "null until then",
    )
    seconds_to_purge: float | None = None
    purge: dict[str, PlacePurge] = Field(
        default_factory=dict,
        description="per place a copy can remain after completion (the stores, "
        "memory.current, raw_input, postgres, rebuild_copies): when it was purged",
    )


def _event_union(models: Sequence[type[Envelope]]) -> Any:
    return Annotated[Union[tuple(models)], Field(discriminator="event_type")]  # noqa: UP007


def event_schemas() -> dict[str, Any]:
    """The JSON schemas of the proposal bodies, as OpenAPI components: one per input topic
    (``MEMORY_EVENT_SCHEMA``, ``CONVERSATION_EVENT_SCHEMA``) and the models they refer to.
    Documentation only: a proposal is validated by the contract's codec (``EventCodec``),
    which also upcasts older schema versions and bounds sizes."""
    components: dict[str, Any] = {}
    for name, models in (
        (MEMORY_EVENT_SCHEMA, MEMORY_EVENT_TYPES),
        (CONVERSATION_EVENT_SCHEMA, CONVERSATION_EVENT_TYPES),
    ):
        schema = TypeAdapter(_event_union(models)).json_schema(
            ref_template="#/components/schemas/{model}"
        )
        components.update(schema.pop("$defs", {}))
        components[name] = schema
    return components
