"""The batch fold every reducer shares. Pure: no I/O, no clock.

A batch is folded in order over the state it touches (the batch's own changes first, then what
was loaded), and every event passes the same checks before its reducer decides it:

1. the contract's idempotency rule (``projections.idempotency``): a redelivery is skipped, an
   ``event_id`` reused with another body is refused as ``duplicate_mismatch``;
2. the erasure guard: an event an erasure covers is refused as ``erased``. Covering the whole
   entity, its data key is destroyed with the batch (the sealer may have given it one, not
   knowing every subject an event is about, and the deletion did not know it); covering only
   the content the event brings, the reducer keeps the event's place without it;
3. an event whose personal fields a deletion shredded (unreadable) is skipped and counted;
4. the reducer's ``apply``: its ``evolve`` decides, and the decision is recorded or refused.

A reducer supplies the state lookup, its refusals, what erasure covers an event, and ``apply``
(``BatchReducer``); the fold and the counts (``BatchOutcome``) are the same for all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from projections.deletion.erasure import Erasure
from projections.idempotency import (
    DUPLICATE_MISMATCH,
    EventKey,
    IdempotencyCheck,
    ProcessedEvent,
    Seen,
)
from topics.envelope import EventLike
from topics.outputs import Rejection, RejectionReason

EntityKey = tuple[str, str]  # (tenant_id, entity_id)

EventT = TypeVar("EventT", bound=EventLike)
StateT = TypeVar("StateT")


@dataclass(slots=True)
class BatchOutcome:
    """What the fold of one batch counts, whatever its reducer; each reducer's batch result
    adds what its events decided."""

    rejections: list[Rejection] = field(default_factory=list)
    processed: list[ProcessedEvent] = field(default_factory=list)
    # Events already decided (same event_id, same body): redeliveries, counted and skipped.
    redelivered: int = 0
    # Events whose data key a deletion destroyed, and that no erasure covers: skipped.
    shredded: int = 0
    # Entities refused as erased, by the deletion that covers them wholly: their data keys
    # are destroyed with this batch.
    keys_to_shred: dict[EntityKey, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Covered:
    """The erasure that covers an event: the whole entity, or only the content it brings."""

    erasure: Erasure
    whole: bool = True


class BatchReducer(Generic[EventT, StateT]):
    """What one reducer supplies to the fold, over one batch."""

    def current(self, key: EntityKey) -> StateT | None:
        """The entity's state: as this batch left it, else as loaded."""
        raise NotImplementedError

    def refuse(
        self, event: EventT, reason: RejectionReason, details: str, current: StateT | None
    ) -> Rejection:
        raise NotImplementedError

    def covered(self, event: EventT, current: StateT | None) -> Covered | None:
        """The erasure that covers the event, if any. By default none (the ledger's events)."""
        return None

    def keep_erased(self, event: EventT, key: EntityKey, current: StateT | None) -> None:
        """Record the event's place without its content (an erasure covers only that)."""

    def apply(self, event: EventT, key: EntityKey, current: StateT | None) -> Rejection | None:
        """Decide the event (``evolve``) and record the decision; a refusal is returned."""
        raise NotImplementedError


def fold(
    events: Iterable[EventT],
    seen: Mapping[EventKey, bytes],
    reducer: BatchReducer[EventT, StateT],
    outcome: BatchOutcome,
) -> None:
    """Fold ``events`` in order through ``reducer``, counting into ``outcome``; ``seen`` maps
    the event ids processed before the batch to their hashes."""
    idempotency = IdempotencyCheck(seen)
    for event in events:
        seen_before = idempotency.check(event)
        if seen_before is Seen.REDELIVERED:
            continue
        key = (event.tenant_id, event.entity_id)
        current = reducer.current(key)
        if seen_before is Seen.MISMATCH:
            outcome.rejections.append(
                reducer.refuse(
                    event, RejectionReason.DUPLICATE_MISMATCH, DUPLICATE_MISMATCH, current
                )
            )
            continue
        covered = reducer.covered(event, current)
        if covered is not None:
            if covered.whole:
                outcome.keys_to_shred[key] = covered.erasure.deletion_id
            else:
                reducer.keep_erased(event, key, current)
            outcome.rejections.append(
                reducer.refuse(event, RejectionReason.ERASED, covered.erasure.describe(), current)
            )
            continue
        if not event.readable:
            outcome.shredded += 1
            continue
        refused = reducer.apply(event, key, current)
        if refused is not None:
            outcome.rejections.append(refused)
    outcome.processed = idempotency.processed
    outcome.redelivered = idempotency.redelivered
