"""The erasure guard. Pure: decides whether an event or an index update is about something
erased at or after the time it happened.

Erasure covers events that occurred at or before the request, including those that arrive
late or are replayed later; events that occur after it are new data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from topics.envelope import Subject

# (tenant_id, entity_type, subject_type, entity_id); subject_type is "" except for subjects.
EntityKey = tuple[str, str, str, str]


@dataclass(frozen=True, slots=True)
class ErasureScope:
    """What one erasure removes, as plain data: its tenant, its deletion, the subject it names
    (if any), the memories and conversations it resolved, and its cut-off. Every eraser of the
    erasure orchestrator (``projections.deletion.erasers``) takes it."""

    tenant_id: str
    deletion_id: str
    subject: Subject | None
    memories: tuple[str, ...]
    conversations: tuple[str, ...]
    cut_off: datetime
    # The conversations whose derived memories (their history, their source keys) the erasure
    # covers: all of them, except for a content erasure (retention), which leaves those.
    sources: tuple[str, ...]


def subject_key(tenant_id: str, subject_type: str, subject_id: str) -> EntityKey:
    return (tenant_id, "subject", subject_type, subject_id)


def conversation_key(tenant_id: str, conversation_id: str) -> EntityKey:
    return (tenant_id, "conversation", "", conversation_id)


def conversation_content_key(tenant_id: str, conversation_id: str) -> EntityKey:
    """A conversation's content erased (a retention erasure): its messages, summaries and
    context view, not the memories whose source points into it."""
    return (tenant_id, "conversation_content", "", conversation_id)


def memory_key(tenant_id: str, memory_id: str) -> EntityKey:
    return (tenant_id, "memory", "", memory_id)


@dataclass(frozen=True, slots=True)
class Erasure:
    deletion_id: str
    cut_off: datetime

    def describe(self) -> str:
        """Why an event is refused, for its rejection's details."""
        return f"erased by {self.deletion_id} (cut-off {self.cut_off.isoformat()})"


ErasureRow = tuple[EntityKey, str, datetime]  # (key, deletion_id, cut_off)


def erasure_row(
    columns: tuple[str, str, str, str, str, datetime],
) -> ErasureRow:
    """A row of ``tenant_id, entity_type, subject_type, entity_id, deletion_id, cut_off``
    (every query of the erasure index selects them in that order) as (key, deletion id,
    cut-off)."""
    tenant, entity_type, subject_type, entity_id, deletion_id, cut_off = columns
    return (tenant, entity_type, subject_type, entity_id), deletion_id, cut_off


def latest_erasures(rows: Iterable[ErasureRow]) -> dict[EntityKey, Erasure]:
    """The erasure that counts per entity among ``(key, deletion_id, cut_off)`` rows: the
    latest cut-off (a tie broken by deletion id, so the answer does not depend on the rows'
    order)."""
    entries: dict[EntityKey, Erasure] = {}
    for key, deletion_id, cut_off in rows:
        known = entries.get(key)
        if known is None or (cut_off, deletion_id) > (known.cut_off, known.deletion_id):
            entries[key] = Erasure(deletion_id, cut_off)
    return entries


@dataclass(frozen=True, slots=True)
class ErasureIndex:
    """The erasures that matter to one batch: the latest cut-off per erased entity."""

    entries: Mapping[EntityKey, Erasure] = field(default_factory=dict)

    def covering(self, keys: Iterable[EntityKey], occurred_at: datetime) -> Erasure | None:
        """The erasure of any of ``keys`` whose cut-off is at or after ``occurred_at``.

        ``keys`` may be lazy: with no erasures to match (the common case), it is not read.
        """
        if not self.entries:
            return None
        for key in keys:
            erasure = self.entries.get(key)
            if erasure is not None and occurred_at <= erasure.cut_off:
                return erasure
        return None

    def __bool__(self) -> bool:
        return bool(self.entries)


NO_ERASURES = ErasureIndex()
