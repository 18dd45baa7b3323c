"""Deletion on the wire: requests in, tombstones out to every derived store, acknowledgements
back, and the status of each request (contract version 1, with compatible additions)."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from topics.envelope import (
    Envelope,
    Frozen,
    Identifier,
    NotPersonal,
    StoredInt,
    Subject,
    Text,
    Timestamp,
    Wire,
    model_json,
)

TargetType = Literal["subject", "conversation", "memory"]
# A derived store's name. The contract names memproj's four (embeddings, summaries, cache,
# context); which stores exist is the registry's (``projections.stores``), and the ledger's
# codec refuses an acknowledgement from a store it does not know.
StoreName = Identifier


class DeletionTarget(Wire):
    type: TargetType
    id: Identifier
    # Required for a subject: subjects are (type, id) pairs, as in memory.proposed.
    subject_type: Identifier | None = None

    @model_validator(mode="after")
    def _subject_has_a_type(self) -> DeletionTarget:
        if self.type == "subject" and self.subject_type is None:
            raise ValueError("a subject target needs subject_type")
        return self

    def subject(self) -> Subject | None:
        if self.type != "subject" or self.subject_type is None:
            return None
        return Subject(type=self.subject_type, id=self.id)


class DeletionRequestedPayload(Wire):
    deletion_id: Identifier
    target: DeletionTarget
    # The deletion ledger's receipt of why: kept after the erasure it records, so not sealed
    # under any key the erasure destroys (ops/decisions/personal-fields.md).
    reason: Annotated[Text, NotPersonal("the deletion ledger's receipt, kept after the erasure")]
    deadline_at: Timestamp | None = None
    # Addition: ``content`` erases a conversation's content (messages, summaries, context view
    # and their copies) and leaves the memories taken from it to their own lifecycle (a
    # retention erasure); absent, a conversation's erasure covers those memories too.
    scope: Literal["content"] | None = None

    @model_validator(mode="after")
    def _content_of_a_conversation(self) -> DeletionRequestedPayload:
        if self.scope == "content" and self.target.type != "conversation":
            raise ValueError("scope 'content' applies to a conversation target only")
        return self


class DeletionRequested(Envelope):
    entity_field: ClassVar[str] = "deletion_id"
    entity_type: ClassVar[str] = "deletion"
    event_type: Literal["deletion.requested"]
    payload: DeletionRequestedPayload


DELETION_EVENT_TYPES: tuple[type[Envelope], ...] = (DeletionRequested,)

ItemType = Literal["memory", "conversation", "message", "summary", "context"]


class TombstoneItem(Frozen):
    """One derived copy to remove. ``conversation_id`` locates messages, summaries and
    context views; ``id`` is the memory, conversation or message id (the summary version for
    a summary)."""

    type: ItemType
    id: str
    conversation_id: str | None = None


class Tombstone(Frozen):
    """``deletion.tombstone`` on ``deletion.tombstones``.

    ``deletion_id``, ``target``, ``items``, ``issued_at`` and ``required_stores`` are the
    contract. ``tenant_id``, ``kind``, ``cut_off``, ``deadline_at`` and ``for_stores`` are
    additions: a redelivered tombstone names the stores it is for (the others ignore it).
    """

    event_type: Literal["deletion.tombstone"] = "deletion.tombstone"
    deletion_id: str
    tenant_id: str
    kind: Literal["erasure", "revocation"]
    target: DeletionTarget
    items: tuple[TombstoneItem, ...]
    issued_at: datetime
    cut_off: datetime
    deadline_at: datetime
    required_stores: tuple[StoreName, ...]
    for_stores: tuple[StoreName, ...] | None = None
    # Addition: ``content`` for a conversation's content only (no memory taken from it).
    scope: Literal["all", "content"] = "all"

    def is_for(self, store: str) -> bool:
        return store in self.required_stores and (
            self.for_stores is None or store in self.for_stores
        )

    def ids(self, item_type: ItemType) -> list[str]:
        return [item.id for item in self.items if item.type == item_type]

    def conversation_ids(self) -> list[str]:
        found = {item.id for item in self.items if item.type == "conversation"}
        found.update(
            item.conversation_id
            for item in self.items
            if item.type != "memory" and item.conversation_id is not None
        )
        return sorted(found)


AckStatus = Literal["done", "failed"]


class Acknowledgement(Frozen):
    """``deletion.acknowledged`` on ``deletion.acks``: a store has removed the tombstone's items
    and checked that they are unreachable (``done``), or could not (``failed``)."""

    event_type: Literal["deletion.acknowledged"] = "deletion.acknowledged"
    deletion_id: str
    tenant_id: str
    store: StoreName
    status: AckStatus
    removed_count: StoredInt = Field(ge=0)
    acked_at: datetime
    error: str | None = None
    attempt: int = 1

    # An acknowledgement is an event of the ledger: these make it one for the runner.
    @property
    def event_id(self) -> str:
        return f"ack:{self.deletion_id}:{self.store}:{self.status}:{self.acked_at.isoformat()}"

    @property
    def entity_id(self) -> str:
        return self.deletion_id

    @property
    def occurred_at(self) -> datetime:
        return self.acked_at

    def body_hash(self) -> bytes:
        return hashlib.sha256(model_json(self)).digest()

    @property
    def readable(self) -> bool:
        return True


StoreStatus = Literal["pending", "done", "failed", "overdue"]


class StoreState(Frozen):
    status: StoreStatus
    deadline_at: datetime
    acked_at: datetime | None = None
    removed_count: int | None = None
    attempts: int = 0
    redeliveries: int = 0
    error: str | None = None
    # When no copy of the deletion is left in the store (``deletion.purged``); additive.
    purged_at: datetime | None = None


class DeletionStatus(Frozen):
    """``deletion.completed``, ``deletion.overdue`` or ``deletion.purged`` on
    ``deletion.status`` (compacted). ``deletion.purged`` is the last of a deletion: every
    place a copy could remain (``purged``: the stores and the places outside them) holds none
    any more."""

    event_type: Literal["deletion.completed", "deletion.overdue", "deletion.purged"]
    deletion_id: str
    tenant_id: str
    kind: Literal["erasure", "revocation"]
    target: DeletionTarget
    requested_at: datetime
    stores: dict[str, StoreState]
    completed_at: datetime | None = None
    purged_at: datetime | None = None
    # Per place a copy can remain (stores, memory.current, raw input, PostgreSQL's dead
    # tuples, rebuild copies): when it was purged.
    purged: dict[str, datetime] = Field(default_factory=dict)
