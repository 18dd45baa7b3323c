"""The contract's idempotency rule, shared by every reducer.

An ``event_id`` is applied once. Seen again with the same body it is a redelivery and changes
nothing; seen again with a different body it is refused as ``duplicate_mismatch``. Refused
events count as seen too, so a redelivery cannot be decided differently the second time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from topics.envelope import EventLike

EventKey = tuple[str, str]  # (tenant_id, event_id)
DUPLICATE_MISMATCH = "event_id was seen before with a different body"


@dataclass(frozen=True, slots=True)
class ProcessedEvent:
    tenant_id: str
    event_id: str
    body_hash: bytes


class Seen(Enum):
    NEW = "new"
    REDELIVERED = "redelivered"
    MISMATCH = "mismatch"


@dataclass(slots=True)
class IdempotencyCheck:
    """Tracks the event ids of one batch on top of those stored before it."""

    stored: Mapping[EventKey, bytes]
    processed: list[ProcessedEvent] = field(default_factory=list)
    redelivered: int = 0
    _batch: dict[EventKey, bytes] = field(default_factory=dict)

    def check(self, event: EventLike) -> Seen:
        key = (event.tenant_id, event.event_id)
        body_hash = event.body_hash()
        previous = self._batch.get(key) or self.stored.get(key)
        if previous is not None and not event.readable:
            # Its fields were shredded, so its hash cannot match the one seen before.
            self.redelivered += 1
            return Seen.REDELIVERED
        if previous is None:
            self._batch[key] = body_hash
            self.processed.append(ProcessedEvent(event.tenant_id, event.event_id, body_hash))
            return Seen.NEW
        if previous == body_hash:
            self.redelivered += 1
            return Seen.REDELIVERED
        return Seen.MISMATCH
