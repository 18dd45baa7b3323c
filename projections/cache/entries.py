"""What a cache entry is: a recall result or a context view as JSON, and what it holds (the
subjects, memories and conversations a deletion may target, ``Holdings``), read from its
content alone. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from topics.envelope import source_conversation

Subject = tuple[str, str]
# What ``RecallCache.entries`` answers for a value that is not a JSON object.
UNREADABLE: dict[str, Any] = {"unreadable": True}


@dataclass(frozen=True, slots=True)
class Holdings:
    """The subjects, memories and conversations a cache entry holds, or a deletion targets."""

    subjects: frozenset[Subject] = frozenset()
    memory_ids: frozenset[str] = frozenset()
    conversation_ids: frozenset[str] = frozenset()

    @classmethod
    def targets(
        cls, subject: Subject | None, conversation_ids: Sequence[str], memory_ids: Sequence[str]
    ) -> Holdings:
        # A bare string is a Sequence[str] too: "conv_1" would target conversations "c", "o", ...
        # and the proof would then vouch for the wrong ids.
        if isinstance(conversation_ids, str) or isinstance(memory_ids, str):
            raise TypeError("conversation_ids and memory_ids take a sequence of ids, not a str")
        return cls(
            frozenset() if subject is None else frozenset([(subject[0], subject[1])]),
            frozenset(memory_ids),
            frozenset(conversation_ids),
        )

    def overlaps(self, other: Holdings) -> bool:
        return bool(
            self.subjects & other.subjects
            or self.memory_ids & other.memory_ids
            or self.conversation_ids & other.conversation_ids
        )


def as_subject(value: Any) -> Subject | None:
    """A subject as entries store it ([type, id]) or as a memory record does ({type, id})."""
    if isinstance(value, Mapping):
        value = (value.get("type"), value.get("id"))
    if (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(v, str) for v in value)
    ):
        return (value[0], value[1])
    return None


def source_conversations(record: Mapping[str, Any]) -> set[str]:
    """The conversation a memory came from, if its source points into one
    (``topics.envelope.source_conversation``)."""
    source = record.get("source")
    if not isinstance(source, Mapping):
        return set()
    source_type, ref = source.get("type"), source.get("ref")
    if not isinstance(source_type, str) or not isinstance(ref, str):
        return set()
    conversation = source_conversation(source_type, ref)
    return set() if conversation is None else {conversation}


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def holdings_of(entry: Mapping[str, Any]) -> Holdings:
    """What an entry holds, read from any JSON object so that entries written by someone else
    are judged by their content, not by how this module writes them."""
    records = [r for r in _as_list(entry.get("records")) if isinstance(r, Mapping)]
    subjects = [entry.get("subject"), entry.get("owner"), *(r.get("subject") for r in records)]
    memory_ids = [*_as_list(entry.get("memory_ids")), *(r.get("memory_id") for r in records)]
    conversation_ids = [
        entry.get("conversation_id"),
        *(c for r in records for c in source_conversations(r)),
    ]
    return Holdings(
        frozenset(s for s in map(as_subject, subjects) if s is not None),
        frozenset(m for m in memory_ids if isinstance(m, str)),
        frozenset(c for c in conversation_ids if isinstance(c, str)),
    )


def recall_entry(subject: Subject, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {
        "subject": list(subject),
        "memory_ids": [record["memory_id"] for record in records],
        "records": [dict(record) for record in records],
    }


def context_entry(conversation_id: str, owner: Subject, view: Mapping[str, Any]) -> dict[str, Any]:
    return {"conversation_id": conversation_id, "owner": list(owner), "view": dict(view)}


def decode_entry(value: bytes | str) -> dict[str, Any] | None:
    """The entry, or None when the value is not a JSON object."""
    try:
        entry = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    return entry if isinstance(entry, dict) else None
