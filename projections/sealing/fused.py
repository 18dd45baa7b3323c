"""One stage from the raw topic to the projection: seal and project in one transaction
(ops/decisions/one-hop.md).

``SealingProjection(sealer, projection)`` is a ``streams.runner.Projection`` on the raw topic.
Per batch, in the runner's one transaction: the sealer's codec validates each message once
(invalid ones become dead letters, as the sealer made them); the sealer's erasures and data
keys and the projection's state are read. For a projection that locks late (memory) that
read takes no tenant lock and writes nothing: a missing data key is made, not stored; once
the batch is reduced, ``lock`` takes the shared tenant locks, re-reads the erasures of the
same keys and stores the new keys, or, if an erasure was recorded since (or another worker
stored one of the keys), reads again under the locks and the runner reduces again. For one
that does not (conversations), the shared tenant locks are taken first, then everything is
read and the missing keys created, as before the memory stage's late locks. The validated events are
sealed (``Sealer.reduce``: the sealed log's messages,
erased entities written without their personal fields) and reduced by the projection's own
reducer; the projection is saved, and the sealed messages are outbox outputs like
``memory.current``: same key, same order as their input partition. The runner tracks the raw
topic's offsets under the projection's name.

What it writes equals what the unchanged projection computes from the sealed log it
publishes: the projection decodes a sealed event to the event the sealer sealed (contract
1.1's ``exclude_unset``), an erased one to an unreadable copy that its erasure guard refuses
as ``erased`` exactly as the live event is refused (the projection's erasure keys include the
sealer's), and its idempotency and rejections are decided by the same reducer on the same
events in the same order. Rebuilds (``memproj replay``) read the sealed log with the
projection alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from projections.deletion import guard as erasure_guard
from projections.idempotency import EventKey, ProcessedEvent
from projections.outbox import OutboxMessage
from projections.outcome import Outcome
from projections.sealing.sealer import Sealed, Sealer, SealingState
from projections.sql import Conn
from topics.codec import EventCodec
from topics.envelope import Envelope
from topics.messages import InputMessage
from topics.outputs import Rejection
from topics.registry import TopicSpec

EventT = TypeVar("EventT", bound=Envelope)
EventContra = TypeVar("EventContra", bound=Envelope, contravariant=True)
StateT = TypeVar("StateT")
OutcomeT = TypeVar("OutcomeT", bound="ShreddingOutcome")


class ShreddingOutcome(Outcome, Protocol):
    """A projection's batch result, and the data keys the batch destroys, which the fused
    stage needs to decide events as a replay of the sealed log will."""

    @property
    def keys_to_shred(self) -> Mapping[tuple[str, str], str]:
        """(tenant, entity id) -> the deletion: the data keys the batch destroys."""
        ...


class SealedLogProjection(Protocol[EventContra, StateT, OutcomeT]):
    """The part of ``streams.runner.Projection`` the fused stage uses of a projection of the
    sealed log (its codec and inputs are the sealer's here)."""

    @property
    def name(self) -> str: ...

    @property
    def rejections_spec(self) -> TopicSpec: ...

    @property
    def tracks_event_ids(self) -> bool: ...

    @property
    def locks_late(self) -> bool:
        """Whether ``load`` reads without the shared tenant locks and ``lock`` takes them and
        says whether the state still holds (``streams.runner.Projection``); otherwise ``load``
        takes them first and ``lock`` returns the state as it is."""
        ...

    async def load(self, conn: Conn, events: Sequence[EventContra]) -> StateT: ...

    async def lock(self, conn: Conn, events: Sequence[EventContra], state: StateT) -> StateT: ...

    def reduce(
        self, events: Sequence[EventContra], state: StateT, seen: dict[EventKey, bytes]
    ) -> OutcomeT: ...

    async def save(self, conn: Conn, outcome: OutcomeT) -> None: ...

    def outputs(self, outcome: OutcomeT) -> list[OutboxMessage]: ...

    def committed(self, outcome: OutcomeT) -> None: ...


@dataclass(frozen=True, slots=True)
class FusedState(Generic[StateT]):
    sealing: SealingState
    projection: StateT


@dataclass(frozen=True, slots=True)
class FusedOutcome(Generic[OutcomeT]):
    sealed: Sealed
    projection: OutcomeT

    @property
    def processed(self) -> list[ProcessedEvent]:
        return self.projection.processed

    @property
    def rejections(self) -> list[Rejection]:
        return self.projection.rejections

    @property
    def redelivered(self) -> int:
        return self.projection.redelivered

    @property
    def shredded(self) -> int:
        return self.projection.shredded

    def applied_event_types(self) -> list[str]:
        return self.projection.applied_event_types()


class SealingProjection(Generic[EventT, StateT, OutcomeT]):
    """``projection`` fed from the raw topic through ``sealer`` (whose ``input_specs`` are
    that one raw topic), the sealed log among its outputs."""

    def __init__(
        self, sealer: Sealer, projection: SealedLogProjection[EventT, StateT, OutcomeT]
    ) -> None:
        self.sealer = sealer
        self.projection = projection

    @property
    def name(self) -> str:
        return self.projection.name

    @property
    def input_specs(self) -> tuple[TopicSpec, ...]:
        return self.sealer.input_specs

    @property
    def rejections_spec(self) -> TopicSpec:
        return self.projection.rejections_spec

    @property
    def codec(self) -> EventCodec:
        return self.sealer.codec

    @property
    def tracks_event_ids(self) -> bool:
        return self.projection.tracks_event_ids

    @property
    def locks_late(self) -> bool:
        return self.projection.locks_late

    async def prepare_decode(self, conn: Conn, messages: Sequence[InputMessage]) -> None:
        """Raw input is plaintext: nothing to prepare."""

    async def load(self, conn: Conn, events: Sequence[EventT]) -> FusedState[StateT]:
        if self.projection.locks_late:
            # Nothing written, no tenant lock: ``lock`` takes them and checks what was read.
            sealing = await self.sealer.read(conn, events, locked=False)
            return FusedState(
                sealing, await self.projection.load(conn, self._stamped(events, sealing))
            )
        # The shared tenant locks first, once for the batch: a deletion of these tenants
        # either committed before (its erasures are read below, and no key is created for
        # what it erased) or waits until this batch commits. The projection's own load takes
        # them again (granted at once: this transaction holds them).
        await erasure_guard.lock_tenants(conn, (e.tenant_id for e in events), exclusive=False)
        sealing = await self.sealer.read(conn, events, locked=True)
        return FusedState(sealing, await self.projection.load(conn, self._stamped(events, sealing)))

    def _stamped(self, events: Sequence[EventT], sealing: SealingState) -> list[EventT]:
        """The events as the sealed log gives them to the projection: with their admission
        stamps (the projection reads the policies they name)."""
        return [self.sealer.stamped(e, sealing) for e in events]  # type: ignore[misc]

    async def lock(
        self, conn: Conn, events: Sequence[EventT], state: FusedState[StateT]
    ) -> FusedState[StateT]:
        """The shared tenant locks, then ``state`` if it still holds (the sealer's proposed
        keys stored), else what is read again under the locks: the sealer's part if an erasure
        of its entities was recorded since it was read (or one of its keys was created by
        another worker meanwhile), the projection's as the projection's ``lock`` says."""
        if not self.projection.locks_late:
            return state  # read under the locks
        await erasure_guard.lock_tenants(conn, (e.tenant_id for e in events), exclusive=False)
        sealing = state.sealing
        if not await self.sealer.confirm(conn, sealing):
            sealing = await self.sealer.read(conn, events, locked=True)
        projection = await self.projection.lock(
            conn, self._stamped(events, sealing), state.projection
        )
        if sealing is state.sealing and projection is state.projection:
            return state
        return FusedState(sealing, projection)

    def reduce(
        self, events: Sequence[EventT], state: FusedState[StateT], seen: dict[EventKey, bytes]
    ) -> FusedOutcome[OutcomeT]:
        # Every validated event is sealed, whatever the projection decides of it (a rejection,
        # a redelivery): the sealed log is the input of every rebuild, which decides again.
        sealed = self.sealer.reduce(events, state.sealing, {})
        # What the sealed log will give its readers of an event, where that is not the event:
        # an erased entity's (written without its personal fields), and every event of this
        # batch sealed with a key the projection destroys with it (it refuses one of them as
        # erased). The projection decides those as a replay will: unreadable placeholders,
        # which its erasure guard refuses or it skips as shredded, with the same body hashes.
        # Rare (an erasure in the batch), and a fixed point in a pass or two.
        unreadable = set(sealed.erased_at)
        while True:
            read = [
                self.sealer.as_read_from_the_log(sealed.messages[i])
                if i in unreadable
                else self.sealer.stamped(e, state.sealing)
                for i, e in enumerate(events)
            ]
            outcome = self.projection.reduce(read, state.projection, seen)  # type: ignore[arg-type]
            shredding = unreadable | {
                i
                for i, e in enumerate(events)
                if (e.tenant_id, e.entity_id) in outcome.keys_to_shred and self.sealer.seals(e)
            }
            if shredding == unreadable:
                return FusedOutcome(sealed, outcome)
            unreadable = shredding

    async def save(self, conn: Conn, outcome: FusedOutcome[OutcomeT]) -> None:
        await self.projection.save(conn, outcome.projection)

    def outputs(self, outcome: FusedOutcome[OutcomeT]) -> list[OutboxMessage]:
        return [*outcome.sealed.messages, *self.projection.outputs(outcome.projection)]

    def committed(self, outcome: FusedOutcome[OutcomeT]) -> None:
        self.projection.committed(outcome.projection)
