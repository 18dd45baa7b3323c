"""Schema versions per event type, and the upcasters that lift older versions to the current.

``schema_version`` is per event type. A known older version is upcast step by step (v1 -> v2
-> ...) before validation; a version newer than the current one, or an older one with no
upcaster, is refused rather than guessed at.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from topics.conversation import (
    ConversationStarted,
    MessageAdded,
    SummaryUpdated,
    message_content_v1_to_v2,
)
from topics.deletion import DeletionRequested
from topics.envelope import Envelope
from topics.memory import MEMORY_EVENT_TYPES

RawEvent = dict[str, Any]
# Takes the whole envelope at version N and returns it at version N + 1.
Upcaster = Callable[[RawEvent], RawEvent]


class UnknownSchemaVersion(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class EventSchema:
    model: type[Envelope]
    current_version: int = 1
    upcasters: Mapping[int, Upcaster] = field(default_factory=dict)

    @property
    def event_type(self) -> str:
        return self.model.declared_event_type()

    def upcast(self, raw: RawEvent, version: int) -> RawEvent:
        if version > self.current_version:
            raise UnknownSchemaVersion(
                f"{self.event_type} schema_version {version} is newer than the supported "
                f"{self.current_version}"
            )
        while version < self.current_version:
            step = self.upcasters.get(version)
            if step is None:
                raise UnknownSchemaVersion(
                    f"{self.event_type} schema_version {version} has no upcaster"
                )
            raw = step(raw)
            version += 1
            raw["schema_version"] = version
        return raw


class SchemaRegistry:
    def __init__(self, schemas: Iterable[EventSchema]) -> None:
        self._by_type = {schema.event_type: schema for schema in schemas}

    def get(self, event_type: str) -> EventSchema | None:
        return self._by_type.get(event_type)

    def event_types(self) -> frozenset[str]:
        return frozenset(self._by_type)

    def models(self) -> tuple[type[Envelope], ...]:
        """The model of each event type, at its current version."""
        return tuple(schema.model for schema in self._by_type.values())

    def current_version(self, event_type: str) -> int:
        return self._by_type[event_type].current_version


def default_schemas() -> SchemaRegistry:
    return SchemaRegistry(
        [
            *(EventSchema(model) for model in MEMORY_EVENT_TYPES),
            EventSchema(ConversationStarted),
            EventSchema(MessageAdded, 2, {1: message_content_v1_to_v2}),
            EventSchema(SummaryUpdated),
            EventSchema(DeletionRequested),
        ]
    )
