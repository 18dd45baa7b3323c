"""Applies one batch of input messages to a projection, exactly once in effect.

The order of a batch, and why:

1. In one PostgreSQL transaction: skip messages at or below the tracked offset (a
   redelivery), decode the rest (invalid ones become dead letters), load the state and
   reduce; take the tenant locks (``Projection.lock``: if an erasure was recorded since the
   state was read, the state is read again under them and reduced again); then write the
   projection, the processed event ids, the rejections, the outbox (every message to publish)
   and the new tracking offsets. A projection whose ``load`` takes the tenant locks itself
   (the ledger, conversations) has nothing left to check at ``lock``; the memory projection
   reads without them, so that a deletion waits only for the writing tail of its batches
   (ops/decisions/erasure-latency.md). Either way the tenant locks are held before the
   batch writes a row of a projection, so the lock order (tenant locks, then rows) holds.
2. Publish the outbox to Kafka and wait until the broker has every message (flush the sink).
3. Delete the published outbox rows.
4. Only then does the caller acknowledge the input offsets to Kafka (commit offsets).

``apply`` does all of it; ``commit`` does 1 and returns the rest, which the batch loop runs
while the next batch's transaction runs (ops/decisions/freshness.md).

A crash anywhere leaves either nothing (1 rolled back: the messages are redelivered and
applied) or a committed batch whose messages are redelivered and skipped by the tracking
offsets, while its outbox rows are republished by ``drain_outbox`` at the next start.
Transient failures (database, broker) retry the whole batch with backoff; a batch is never
dropped. A failure that is about a message (``streams.failures``: a bug one message hits, or
what PostgreSQL or Kafka cannot hold) would fail its batch forever: the batch is applied again
in one transaction, each part in a savepoint, split until the failing message is alone; it
becomes a dead letter (``processing_failed`` or ``unstorable``, with its stage) in the same
commit as the rest, unless the circuit breaker judges the failures systemic and stops the
worker with nothing committed.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import astuple, dataclass
from datetime import datetime
from functools import partial
from typing import Generic, Protocol, TypeVar

from psycopg_pool import AsyncConnectionPool

from projections.bookkeeping import Tracking
from projections.idempotency import EventKey
from projections.outbox import OutboxMessage
from projections.outcome import Outcome
from projections.rejections import RejectionRow
from projections.sql import Conn
from streams.failures import OversizedOutput, retry_transient
from streams.isolation import Failure, Isolation, message_failure, stage
from streams.metrics import Metrics
from topics.codec import InvalidMessage, encode
from topics.envelope import EventLike
from topics.messages import InputMessage
from topics.outputs import Rejection
from topics.registry import MESSAGE_MAX_BYTES, TopicNames, TopicSpec, output_key

log = logging.getLogger(__name__)

EventT = TypeVar("EventT", bound=EventLike)
EventContra = TypeVar("EventContra", bound=EventLike, contravariant=True)
StateT = TypeVar("StateT")
OutcomeT = TypeVar("OutcomeT", bound="Outcome")
T = TypeVar("T")


class Publisher(Protocol):
    async def publish(self, messages: Sequence[OutboxMessage]) -> None:
        """Return once the broker has every message."""
        ...


class Codec(Protocol):
    def decode(self, key: bytes | None, value: bytes | None, topic: str | None = None) -> EventLike:
        """The event, or ``InvalidMessage`` with the reason it goes to the dead-letter topic;
        ``topic`` is the one it arrived on (an event type may belong on one topic only)."""
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

    @property
    def locks_late(self) -> bool:
        """Whether ``load`` reads without the tenant locks (``lock`` takes them and checks the
        state); otherwise ``load`` takes them before it reads and ``lock`` has nothing to do."""
        ...

    async def prepare_decode(self, conn: Conn, messages: Sequence[InputMessage]) -> None:
        """Read what decoding the batch needs (the sealed log's data keys), in its
        transaction."""

    async def load(self, conn: Conn, events: Sequence[EventContra]) -> StateT:
        """The batch's state; writes nothing (a projection whose load takes the tenant locks
        first may: it holds them)."""
        ...

    async def lock(self, conn: Conn, events: Sequence[EventContra], state: StateT) -> StateT:
        """Take the tenant locks the batch writes under (if ``load`` did not); ``state`` if it
        still holds, else the state read again under them (an erasure was recorded since)."""
        ...

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


@dataclass(frozen=True, slots=True)
class CommittedBatch:
    """A committed batch whose outputs are still to publish (steps 2 and 3)."""

    report: BatchReport
    publishing: Callable[[], Awaitable[None]]

    async def publish(self) -> None:
        """Publish the outbox, then delete its rows; transient failures retried."""
        await self.publishing()


# Room left in a message for its headers and the record's own framing.
OUTPUT_MAX_BYTES = MESSAGE_MAX_BYTES - 16 * 1024


@dataclass(frozen=True, slots=True)
class _Part:
    """One part of a batch, applied in the batch's transaction."""

    outcome: Outcome
    events: list[EventLike]
    outbox: list[OutboxMessage]
    failed: list[tuple[InputMessage, Failure]]
    dead_letters: int


class ProjectionRunner(Generic[EventT, StateT, OutcomeT]):
    def __init__(
        self,
        projection: Projection[EventT, StateT, OutcomeT],
        pool: AsyncConnectionPool[Conn],
        publisher: Publisher,
        topics: TopicNames,
        metrics: Metrics,
        max_backoff_seconds: float = 30.0,
        failpoint: str = "",
        outbox_drain_max_bytes: int = 32 * 1024 * 1024,
        *,
        tracking: Tracking,
    ) -> None:
        self.projection = projection
        self._tracking = tracking
        self._kill_after_commit = failpoint == f"{projection.name}:after_commit"
        self._pool = pool
        self._publisher = publisher
        self._topics = topics
        self._metrics = metrics
        self._max_backoff = max_backoff_seconds
        self._drain_max_bytes = outbox_drain_max_bytes

    @property
    def name(self) -> str:
        return self.projection.name

    async def apply(self, messages: Sequence[InputMessage], isolation: Isolation) -> BatchReport:
        """Apply a batch; returns when it is committed and its outputs are published.

        Transient failures are retried until they pass: a stuck database stalls the
        projection (visible as lag and staleness) rather than losing a message. A failure
        that is about a message is isolated in the batch's transaction (savepoints, bisected
        around the failing messages): the failing messages become dead letters, the others
        are applied, all in one commit, unless the breaker judges the failures systemic.
        """
        committed = await self.commit(messages, isolation)
        await committed.publish()
        return committed.report

    async def commit(
        self, messages: Sequence[InputMessage], isolation: Isolation
    ) -> CommittedBatch:
        """Steps 1 of a batch (as ``apply``); the returned ``CommittedBatch`` does 2 and 3.
        The batch loop publishes it while the next batch commits (``streams.loop``)."""
        started = time.perf_counter()
        name = self.projection.name

        def retried(exc: Exception) -> None:
            self._metrics.retried(name, type(exc).__name__)

        committed = await retry_transient(
            f"{name}: batch", partial(self._commit, messages, isolation), self._max_backoff, retried
        )
        if self._kill_after_commit and committed.outbox:
            os.kill(os.getpid(), signal.SIGKILL)  # the crash the outbox is for
        return CommittedBatch(committed.report, partial(self._publish, committed, started))

    async def _publish(self, committed: _Committed, started: float) -> None:
        name = self.projection.name

        def retried(exc: Exception) -> None:
            self._metrics.retried(name, type(exc).__name__)

        async def publish() -> None:
            # The batch is in the database: a retry only republishes. Its rows stay locked
            # until deleted, so that an erasure's null comes after them (bookkeeping).
            async with self._pool.connection() as conn:
                await self._tracking.publish_outbox_batch(
                    conn, committed.outbox_batch, committed.outbox, self._publisher.publish
                )

        await retry_transient(f"{name}: publish", publish, self._max_backoff, retried)
        self._metrics.batch_applied(
            name,
            committed.applied_event_types,
            committed.newest_occurred_at,
            time.perf_counter() - started,
        )

    async def _commit(self, messages: Sequence[InputMessage], isolation: Isolation) -> _Committed:
        async with self._pool.connection() as conn:
            try:
                async with conn.transaction():
                    return await self._commit_in(conn, messages, isolation, isolate=False)
            except Exception as exc:
                failure = message_failure(exc)  # raises again what is not about a message
                log.warning(
                    "%s: a batch of %d failed (%s): isolating the failing messages",
                    self.projection.name,
                    len(messages),
                    failure.loggable(),
                )
            async with conn.transaction():
                return await self._commit_in(conn, messages, isolation, isolate=True)

    async def _commit_in(
        self, conn: Conn, messages: Sequence[InputMessage], isolation: Isolation, isolate: bool
    ) -> _Committed:
        projection = self.projection
        tracked = await self._tracking.lock_offsets(
            conn, projection.name, ((m.topic, m.partition) for m in messages)
        )
        fresh = [m for m in messages if m.offset >= tracked.get((m.topic, m.partition), 0)]
        if isolate:

            async def in_savepoint(part: Sequence[InputMessage]) -> _Part:
                async with conn.transaction():
                    return await self._apply_part(conn, part, isolation)

            parts, failed = await isolation.split(fresh, in_savepoint)
        else:
            parts, failed = [await self._apply_part(conn, fresh, isolation)], []
        failed = [*(f for part in parts for f in part.failed), *failed]
        # The breaker judges before anything of the batch is committed.
        dead = isolation.judge(len(fresh), failed)
        _check_sizes(dead)  # bounded by construction: a failure here is a bug, not a message
        outbox = [*(m for part in parts for m in part.outbox), *dead]
        # A dead letter opens only with its key: durable in the commit that stages it.
        await isolation.dead_letters.keep_in(conn, outbox)
        outbox_batch = await self._tracking.add_to_outbox(conn, projection.name, outbox)
        await self._tracking.save_offsets(conn, projection.name, _next_offsets(messages))
        report = BatchReport(len(messages), len(messages) - len(fresh), 0, len(dead), 0, 0, 0)
        applied_event_types: list[str] = []
        for part in parts:
            outcome = part.outcome
            projection.committed(outcome)  # type: ignore[arg-type]
            part_types = outcome.applied_event_types()
            applied_event_types += part_types
            for rejection in outcome.rejections:
                self._metrics.rejected(rejection.reason.value)
            self._metrics.shredded(projection.name, outcome.shredded)
            self._metrics.redelivered(projection.name, "event_id", outcome.redelivered)
            report = report.plus(
                BatchReport(
                    0,
                    0,
                    outcome.shredded,
                    part.dead_letters,
                    len(part_types),
                    len(outcome.rejections),
                    outcome.redelivered,
                )
            )
        self._metrics.redelivered(projection.name, "offset", report.skipped_offsets)
        return _Committed(
            report,
            outbox_batch,
            outbox,
            applied_event_types,
            max((e.occurred_at for p in parts for e in p.events), default=None),
        )

    async def _apply_part(
        self, conn: Conn, messages: Sequence[InputMessage], isolation: Isolation
    ) -> _Part:
        """Decode, reduce and write ``messages``; their outbox is returned, not yet staged."""
        projection = self.projection
        with stage("unseal"):
            await projection.prepare_decode(conn, messages)
        events, positions, dead, failed = self._decode(messages, isolation)
        with stage("load"):
            seen = (
                await self._tracking.load_seen(
                    conn, projection.name, [(e.tenant_id, e.event_id) for e in events]
                )
                if projection.tracks_event_ids
                else {}
            )
            state = await projection.load(conn, events)
        with stage("reduce"):
            outcome = projection.reduce(events, state, seen)
        with stage("lock"):
            current = await projection.lock(conn, events, state)
        if current is not state:
            with stage("reduce"):
                outcome = projection.reduce(events, current, seen)
        with stage("write"):
            await self._tracking.claim_processed(conn, projection.name, outcome.processed)
            await projection.save(conn, outcome)
            rejection_rows = [
                RejectionRow(rejection, *positions[(rejection.tenant_id, rejection.event_id)])
                for rejection in outcome.rejections
            ]
            await self._tracking.record_rejections(conn, projection.name, rejection_rows)
            outbox = [
                *projection.outputs(outcome),
                *(self._rejection_message(r) for r in outcome.rejections),
                *dead,
            ]
            _check_sizes(outbox)
        return _Part(outcome, list(events), outbox, failed, len(dead))

    def _decode(
        self, messages: Iterable[InputMessage], isolation: Isolation
    ) -> tuple[
        list[EventT],
        dict[EventKey, tuple[str, int, int]],
        list[OutboxMessage],
        list[tuple[InputMessage, Failure]],
    ]:
        events: list[EventT] = []
        positions: dict[EventKey, tuple[str, int, int]] = {}
        dead: list[OutboxMessage] = []
        failed: list[tuple[InputMessage, Failure]] = []
        codec = self.projection.codec
        for message in messages:
            try:
                event = codec.decode(message.key, message.value, message.topic)
            except InvalidMessage as invalid:
                dead.append(isolation.invalid(message, invalid))
                continue
            except Exception as exc:
                failed.append((message, message_failure(exc, "decode")))
                continue
            events.append(event)  # type: ignore[arg-type]
            positions.setdefault(
                (event.tenant_id, event.event_id),
                (message.topic, message.partition, message.offset),
            )
        return events, positions, dead, failed

    def _rejection_message(self, rejection: Rejection) -> OutboxMessage:
        return OutboxMessage(
            self._topics.name(self.projection.rejections_spec),
            output_key(rejection.tenant_id, rejection.entity_id).encode(),
            encode(rejection),
        )

    async def drain_outbox(self) -> int:
        """Publish what a previous run committed but did not get to publish, a bounded
        number of bytes at a time."""
        drained = 0
        while True:
            async with self._pool.connection() as conn:
                published = await self._tracking.publish_pending_outbox(
                    conn,
                    self.projection.name,
                    self._publisher.publish,
                    max_bytes=self._drain_max_bytes,
                )
            if not published:
                return drained
            drained += published


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
