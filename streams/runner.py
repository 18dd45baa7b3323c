"""Applies one batch of input messages to a projection, exactly once in effect.

The order of a batch, and why:

1. In one PostgreSQL transaction: skip messages at or below the tracked offset (a
   redelivery), decode the rest (invalid ones become dead letters), reduce, write the
   projection, the processed event ids, the rejections, the outbox (every message to publish)
   and the new tracking offsets.
2. Publish the outbox to Kafka and wait until the broker has every message (flush the sink).
3. Delete the published outbox rows.
4. Only then does the caller acknowledge the input offsets to Kafka (commit offsets).

A crash anywhere leaves either nothing (1 rolled back: the messages are redelivered and
applied) or a committed batch whose messages are redelivered and skipped by the tracking
offsets, while its outbox rows are republished by ``drain_outbox`` at the next start.
Transient failures (database, broker) retry the whole batch with backoff; a batch is never
dropped. A message that PostgreSQL or Kafka cannot hold (``UNSTORABLE``) would fail its batch
forever: the batch is split until that message is alone, and it becomes a dead letter.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import astuple, dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Generic, Protocol, TypeVar

from psycopg_pool import AsyncConnectionPool

from projections import bookkeeping
from projections.bookkeeping import Conn, OutboxMessage, RejectionRow
from projections.idempotency import EventKey, ProcessedEvent
from streams.failures import UNSTORABLE, OversizedOutput, retry_transient
from streams.metrics import Metrics
from topics.codec import InvalidMessage, encode
from topics.envelope import EventLike
from topics.messages import InputMessage
from topics.outputs import DeadLetter, DeadLetterReason, Rejection
from topics.registry import DLQ_SUFFIX, MESSAGE_MAX_BYTES, TopicNames, TopicSpec, entity_key

log = logging.getLogger(__name__)

EventT = TypeVar("EventT", bound=EventLike)
EventContra = TypeVar("EventContra", bound=EventLike, contravariant=True)
StateT = TypeVar("StateT")
OutcomeT = TypeVar("OutcomeT", bound="Outcome")
T = TypeVar("T")


class Outcome(Protocol):
    """What every reducer's batch result exposes to the runner."""

    @property
    def processed(self) -> list[ProcessedEvent]: ...

    @property
    def rejections(self) -> list[Rejection]: ...

    @property
    def redelivered(self) -> int: ...

    @property
    def shredded(self) -> int: ...

    def applied_event_types(self) -> list[str]: ...


class Publisher(Protocol):
    async def publish(self, messages: Sequence[OutboxMessage]) -> None:
        """Return once the broker has every message."""
        ...


class Codec(Protocol):
    def decode(self, key: bytes | None, value: bytes | None) -> EventLike:
        """The event, or ``InvalidMessage`` with the reason it goes to the dead-letter topic."""
        ...


class Projection(Protocol[EventContra, StateT, OutcomeT]):
    """The projection-specific half of a worker: state loading, the pure reducer, persistence
    and the messages the new state publishes."""

    @property
    def name(self) -> str: ...

    @property
    def input_specs(self) -> tuple[TopicSpec, ...]: ...

    @property
    def rejections_spec(self) -> TopicSpec: ...

    @property
    def codec(self) -> Codec: ...

    @property
    def tracks_event_ids(self) -> bool:
        """Whether the reducer decides each event once (and so needs the ids already seen)."""
        ...

    async def prepare_decode(self, conn: Conn, messages: Sequence[InputMessage]) -> None:
        """Read what decoding the batch needs (the sealed log's data keys), in its
        transaction."""

    async def load(self, conn: Conn, events: Sequence[EventContra]) -> StateT: ...

    def reduce(
        self, events: Sequence[EventContra], state: StateT, seen: dict[EventKey, bytes]
    ) -> OutcomeT: ...

    async def save(self, conn: Conn, outcome: OutcomeT) -> None: ...

    def outputs(self, outcome: OutcomeT) -> list[OutboxMessage]: ...

    def committed(self, outcome: OutcomeT) -> None:
        """Called once the batch is committed: projection-specific observations."""


@dataclass(frozen=True, slots=True)
class BatchReport:
    messages: int
    skipped_offsets: int
    shredded: int
    dead_letters: int
    applied: int
    rejected: int
    redelivered_events: int

    def plus(self, other: BatchReport) -> BatchReport:
        """The report of two consecutive parts of one batch."""
        pairs = zip(astuple(self), astuple(other), strict=True)
        return BatchReport(*(mine + theirs for mine, theirs in pairs))


@dataclass(frozen=True, slots=True)
class _Committed:
    report: BatchReport
    outbox_batch: uuid.UUID | None
    outbox: list[OutboxMessage]
    applied_event_types: list[str]
    newest_occurred_at: datetime | None


# Room left in a message for its headers and the record's own framing.
OUTPUT_MAX_BYTES = MESSAGE_MAX_BYTES - 16 * 1024


class ProjectionRunner(Generic[EventT, StateT, OutcomeT]):
    def __init__(
        self,
        projection: Projection[EventT, StateT, OutcomeT],
        pool: AsyncConnectionPool[Conn],
        publisher: Publisher,
        topics: TopicNames,
        metrics: Metrics,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        max_backoff_seconds: float = 30.0,
        failpoint: str = "",
    ) -> None:
        self.projection = projection
        self._kill_after_commit = failpoint == f"{projection.name}:after_commit"
        self._pool = pool
        self._publisher = publisher
        self._topics = topics
        self._metrics = metrics
        self._clock = clock
        self._max_backoff = max_backoff_seconds

    async def apply(self, messages: Sequence[InputMessage]) -> BatchReport:
        """Apply a batch; returns when it is committed and its outputs are published.

        Transient failures are retried until they pass: a stuck database stalls the
        projection (visible as lag and staleness) rather than losing a message.

        A batch that fails because of what one of its messages holds (``UNSTORABLE``) is
        split in two halves, applied in order, until the message is found alone: it becomes
        a dead letter (``unstorable``) and every other message is applied as usual.
        """
        try:
            return await self._apply(messages)
        except UNSTORABLE as exc:
            if len(messages) == 1:
                log.warning(
                    "%s: %s:%d@%d cannot be stored (%s): dead-lettered",
                    self.projection.name,
                    messages[0].topic,
                    messages[0].partition,
                    messages[0].offset,
                    exc,
                )
                return await self._apply(messages, unstorable=exc)
            half = len(messages) // 2
            first = await self.apply(messages[:half])
            return first.plus(await self.apply(messages[half:]))

    async def _apply(
        self, messages: Sequence[InputMessage], unstorable: Exception | None = None
    ) -> BatchReport:
        started = time.perf_counter()
        name = self.projection.name

        def retried(exc: Exception) -> None:
            self._metrics.retried(name, type(exc).__name__)

        committed = await retry_transient(
            f"{name}: batch",
            partial(self._commit, messages, unstorable),
            self._max_backoff,
            retried,
        )
        if self._kill_after_commit and committed.outbox:
            os.kill(os.getpid(), signal.SIGKILL)  # the crash the outbox is for

        async def publish() -> None:
            # The batch is in the database: a retry only republishes.
            await self._publisher.publish(committed.outbox)
            async with self._pool.connection() as conn:
                await bookkeeping.remove_outbox_batch(conn, committed.outbox_batch)

        await retry_transient(f"{name}: publish", publish, self._max_backoff, retried)
        self._metrics.batch_applied(
            self.projection.name,
            committed.applied_event_types,
            committed.newest_occurred_at,
            time.perf_counter() - started,
        )
        return committed.report

    async def _commit(
        self, messages: Sequence[InputMessage], unstorable: Exception | None = None
    ) -> _Committed:
        projection = self.projection
        async with self._pool.connection() as conn, conn.transaction():
            tracked = await bookkeeping.lock_offsets(
                conn, projection.name, ((m.topic, m.partition) for m in messages)
            )
            fresh = [m for m in messages if m.offset >= tracked.get((m.topic, m.partition), 0)]
            if unstorable is None:
                await projection.prepare_decode(conn, fresh)
                events, positions, dead = self._decode(fresh)
            else:
                reason = InvalidMessage(DeadLetterReason.UNSTORABLE, str(unstorable))
                events, positions, dead = [], {}, [self._dead_letter(m, reason) for m in fresh]
            seen = (
                await bookkeeping.load_seen(
                    conn, projection.name, [(e.tenant_id, e.event_id) for e in events]
                )
                if projection.tracks_event_ids
                else {}
            )
            state = await projection.load(conn, events)
            outcome = projection.reduce(events, state, seen)
            await bookkeeping.claim_processed(conn, projection.name, outcome.processed)
            await projection.save(conn, outcome)
            rejection_rows = [
                RejectionRow(rejection, *positions[(rejection.tenant_id, rejection.event_id)])
                for rejection in outcome.rejections
            ]
            await bookkeeping.record_rejections(conn, projection.name, rejection_rows)
            outbox = [
                *projection.outputs(outcome),
                *(self._rejection_message(r) for r in outcome.rejections),
                *dead,
            ]
            _check_sizes(outbox)
            outbox_batch = await bookkeeping.add_to_outbox(conn, projection.name, outbox)
            await bookkeeping.save_offsets(conn, projection.name, _next_offsets(messages))
        projection.committed(outcome)
        applied_event_types = outcome.applied_event_types()
        for rejection in outcome.rejections:
            self._metrics.rejected(rejection.reason.value)
        skipped = len(messages) - len(fresh)
        self._metrics.redelivered(projection.name, "offset", skipped)
        self._metrics.shredded(projection.name, outcome.shredded)
        self._metrics.redelivered(projection.name, "event_id", outcome.redelivered)
        report = BatchReport(
            messages=len(messages),
            skipped_offsets=skipped,
            shredded=outcome.shredded,
            dead_letters=len(dead),
            applied=len(applied_event_types),
            rejected=len(outcome.rejections),
            redelivered_events=outcome.redelivered,
        )
        return _Committed(
            report,
            outbox_batch,
            outbox,
            applied_event_types,
            max((e.occurred_at for e in events), default=None),
        )

    def _decode(
        self, messages: Iterable[InputMessage]
    ) -> tuple[list[EventT], dict[EventKey, tuple[str, int, int]], list[OutboxMessage]]:
        events: list[EventT] = []
        positions: dict[EventKey, tuple[str, int, int]] = {}
        dead: list[OutboxMessage] = []
        codec = self.projection.codec
        for message in messages:
            try:
                event = codec.decode(message.key, message.value)
            except InvalidMessage as invalid:
                dead.append(self._dead_letter(message, invalid))
                continue
            events.append(event)  # type: ignore[arg-type]
            positions.setdefault(
                (event.tenant_id, event.event_id),
                (message.topic, message.partition, message.offset),
            )
        return events, positions, dead

    def _dead_letter(self, message: InputMessage, invalid: InvalidMessage) -> OutboxMessage:
        self._metrics.dead_lettered(message.topic, invalid.code.value)
        record = DeadLetter.of(
            message.value,
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            error=invalid.detail,
            error_code=invalid.code,
            key=message.key,
            failed_at=self._clock(),
        )
        return OutboxMessage(message.topic + DLQ_SUFFIX, message.key, encode(record))

    def _rejection_message(self, rejection: Rejection) -> OutboxMessage:
        return OutboxMessage(
            self._topics.name(self.projection.rejections_spec),
            entity_key(rejection.tenant_id, rejection.entity_id).encode(),
            encode(rejection),
        )

    async def drain_outbox(self) -> int:
        """Publish what a previous run committed but did not get to publish."""
        drained = 0
        while True:
            async with self._pool.connection() as conn:
                pending = await bookkeeping.pending_outbox(conn, self.projection.name)
            if not pending:
                return drained
            await self._publisher.publish([message for _, message in pending])
            async with self._pool.connection() as conn:
                await bookkeeping.remove_from_outbox(conn, [outbox_id for outbox_id, _ in pending])
            drained += len(pending)


def _check_sizes(outbox: Iterable[OutboxMessage]) -> None:
    for message in outbox:
        size = len(message.value or b"") + len(message.key or b"")
        size += sum(len(name) + len(value) for name, value in message.headers)
        if size > OUTPUT_MAX_BYTES:
            raise OversizedOutput(
                f"an output for {message.topic} would be {size} bytes,"
                f" above the limit of {OUTPUT_MAX_BYTES}"
            )


def _next_offsets(messages: Iterable[InputMessage]) -> dict[tuple[str, int], int]:
    next_offsets: dict[tuple[str, int], int] = {}
    for message in messages:
        position = (message.topic, message.partition)
        next_offsets[position] = max(next_offsets.get(position, 0), message.offset + 1)
    return next_offsets
