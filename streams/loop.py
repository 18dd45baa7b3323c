"""The one batched loop every agent runs: batches in, handled, acknowledged.

Where batches come from is a seam of its own (``BatchSource``): a confluent-kafka batch
consumer in the workers (``streams.consumer``), replay's reader, a test's fake; batching,
isolation, retries and acknowledgement stay the same. For each batch the loop:

1. splits it into parts of at most ``max_bytes`` (a message larger than that is a part alone);
2. hands each part to the handler, retrying transient failures with backoff until they pass
   (a stuck database stalls the worker, visible as lag, and loses nothing); the handler
   isolates the messages that fail (``streams.isolation``) and dead-letters them;
3. acknowledges the batch to its source, only once every part is applied;
4. stops the worker on anything else (an environment fault, a tripped breaker, a bug outside
   any one message): the batch is not acknowledged, so nothing is lost, and the exit is
   visible to whatever supervises the process.

A writer task applies batch N while the source gathers the next ones. The batches the source
hands over while the writer is busy wait together, and the writer applies them as one (up to
``max_events`` and ``max_bytes``), then acknowledges each in order: a short gathering wait
(``max_wait_seconds``) keeps an event's latency low when the writer keeps up, and a busy
writer's next transaction holds whatever arrived meanwhile instead of a queue of small ones,
each paying a transaction's fixed cost (ops/decisions/freshness.md).

A handler that commits in two steps (``CommittingHandler``: the projection runners) has
batch N's outputs published while batch N + 1's transaction runs: the publication was on
the writer's path, and a batch's events are visible at its commit, not at its publication.
Publications run one at a time, in the order of the commits (an entity's outputs keep their
order), and a batch is acknowledged only once its outputs are delivered: a revoked partition
is given up only after them, so its next owner's outputs come after. A crash between a
commit and its publication leaves the outbox rows in PostgreSQL, published at the next start.
A worker thus holds one more batch: the one whose outputs are being published.

At shutdown (``drain``) the loop takes no new batch: the batch being applied and the one
being published finish (committed, published, acknowledged) or, past the deadline, are
cancelled: a transaction rolls back, a publication's outbox rows stay for the next start; a
batch queued behind them was never started and is redelivered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, runtime_checkable

from streams.failures import loggable, retry_transient
from streams.isolation import CircuitBreaker, Isolation
from topics.messages import InputMessage

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Batch:
    messages: Sequence[InputMessage]
    # What the source needs to acknowledge the batch (the offsets it commits).
    token: Any = None


class BatchSource(Protocol):
    def batches(self) -> AsyncIterator[Batch]: ...

    async def ack(self, batch: Batch) -> None:
        """The batch is applied: its offsets may be committed."""


class BatchHandler(Protocol):
    @property
    def name(self) -> str: ...

    async def apply(self, messages: Sequence[InputMessage], isolation: Isolation) -> object:
        """Apply ``messages``; return once they are durable and their outputs published.
        A failure that is about one message is isolated with ``isolation``."""


class Publication(Protocol):
    async def publish(self) -> None:
        """Publish a committed batch's outputs; return once the broker has every one."""


@runtime_checkable
class CommittingHandler(BatchHandler, Protocol):
    async def commit(self, messages: Sequence[InputMessage], isolation: Isolation) -> Publication:
        """Make ``messages`` durable (as ``apply``) and return the step that publishes their
        outputs: the loop runs it while the next batch commits."""


class _Published:
    """The publication of a handler that publishes in ``apply``."""

    async def publish(self) -> None:
        return None


class RetryObserver(Protocol):
    def retried(self, projection: str, error: str) -> None: ...


@dataclass(frozen=True, slots=True)
class BatchLimits:
    max_events: int = 2000
    max_wait_seconds: float = 0.25
    max_bytes: int = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    ratio: float = 0.5
    min_failures: int = 5
    window: int = 20

    def breaker(self, name: str) -> CircuitBreaker:
        return CircuitBreaker(name, self.ratio, self.min_failures, self.window)


def message_bytes(message: InputMessage) -> int:
    return len(message.value or b"") + len(message.key or b"")


def split_by_bytes(
    messages: Sequence[InputMessage], max_bytes: int
) -> Iterator[Sequence[InputMessage]]:
    """Consecutive parts of at most ``max_bytes`` (a larger message is a part of its own)."""
    start, size = 0, 0
    for index, message in enumerate(messages):
        length = message_bytes(message)
        if index > start and size + length > max_bytes:
            yield messages[start:index]
            start, size = index, 0
        size += length
    if start < len(messages):
        yield messages[start:]


@dataclass(slots=True)
class Waiting:
    """The batches handed over and not yet taken by the writer, applied together once it
    takes them: at most ``max_events`` and ``max_bytes`` in all (a batch alone may exceed
    them: the source bounds its own batches)."""

    limits: BatchLimits
    batches: list[Batch] = field(default_factory=list)
    events: int = 0
    size: int = 0

    def fits(self, batch: Batch) -> bool:
        if not self.batches:
            return True
        return (
            self.events + len(batch.messages) <= self.limits.max_events
            and self.size + sum(message_bytes(m) for m in batch.messages) <= self.limits.max_bytes
        )

    def add(self, batch: Batch) -> None:
        self.batches.append(batch)
        self.events += len(batch.messages)
        self.size += sum(message_bytes(m) for m in batch.messages)

    def take(self) -> list[Batch]:
        taken, self.batches, self.events, self.size = self.batches, [], 0, 0
        return taken


def merged(batches: Sequence[Batch]) -> Batch:
    """Consecutive batches of one source as one, in order (the tokens are theirs)."""
    if len(batches) == 1:
        return batches[0]
    return Batch([m for batch in batches for m in batch.messages])


class StopOnce:
    """Stops the worker once, with the first failure: every agent of a worker shares one."""

    def __init__(self, stop: Callable[[BaseException], Awaitable[None]]) -> None:
        self._stop = stop
        self.failure: BaseException | None = None

    async def __call__(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
            await self._stop(exc)


class BatchLoop:
    def __init__(
        self,
        handler: BatchHandler,
        isolation: Isolation,
        limits: BatchLimits,
        observer: RetryObserver,
        stop: Callable[[BaseException], Awaitable[None]],
        max_backoff_seconds: float = 30.0,
    ) -> None:
        self.handler = handler
        self.isolation = isolation
        self.limits = limits
        self._observer = observer
        self._stop = stop
        self._max_backoff = max_backoff_seconds
        self._writer: asyncio.Task[None] | None = None
        self._publishing: asyncio.Task[bool] | None = None
        self._changed = asyncio.Condition()
        self._draining = False
        self._applying = False
        # A handler that commits in two steps has its outputs published behind the next commit.
        self._committer = handler if isinstance(handler, CommittingHandler) else None

    async def apply(self, batch: Batch) -> None:
        """Apply every part of ``batch``, outputs published."""
        await (await self.commit(batch)).publish()

    async def commit(self, batch: Batch) -> Publication:
        """Commit every part of ``batch`` (transient failures retried until they pass); the
        returned step publishes their outputs, in order."""
        name = self.handler.name

        def retried(exc: Exception) -> None:
            self._observer.retried(name, type(exc).__name__)

        publications: list[Publication] = []
        for part in split_by_bytes(batch.messages, self.limits.max_bytes):
            if self._committer is not None:
                step = partial(self._committer.commit, part, self.isolation)
            else:
                step = partial(_applied, self.handler, part, self.isolation)
            publications.append(
                await retry_transient(f"{name}: batch", step, self._max_backoff, retried)
            )
        return publications[0] if len(publications) == 1 else _InOrder(publications)

    async def run(self, source: BatchSource) -> None:
        """Apply every batch of ``source`` until it ends (a consumer's never does: the
        worker's stop cancels it, and what was not acknowledged is redelivered)."""
        waiting = Waiting(self.limits)
        changed = self._changed = asyncio.Condition()
        ended = False

        async def publish_then_ack(publication: Publication, batches: list[Batch]) -> bool:
            """False if it failed (the worker is asked to stop: the batches are not
            acknowledged, their outbox rows are published at the next start)."""
            try:
                await publication.publish()
                for batch in batches:
                    await source.ack(batch)
                return True
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.critical("%s: stopping the worker: %s", self.handler.name, loggable(exc))
                await self._stop(exc)
                return False

        async def apply_in_order() -> None:
            publishing: asyncio.Task[bool] | None = None
            try:
                while True:
                    async with changed:
                        await changed.wait_for(
                            lambda: bool(waiting.batches) or ended or self._draining
                        )
                        if self._draining or not waiting.batches:
                            break
                        batches = waiting.take()
                        self._applying = True
                        changed.notify_all()
                    try:
                        publication = await self.commit(merged(batches))
                        # One publication at a time, in the order of the commits.
                        if publishing is not None and not await publishing:
                            return  # it failed and asked the worker to stop
                        publishing = asyncio.create_task(
                            publish_then_ack(publication, batches),
                            name=f"{self.handler.name}-publisher",
                        )
                        self._publishing = publishing
                    finally:
                        self._applying = False
                if publishing is not None:
                    await publishing
            except asyncio.CancelledError:
                if publishing is not None:
                    publishing.cancel()
                raise
            except Exception as exc:
                log.critical("%s: stopping the worker: %s", self.handler.name, loggable(exc))
                await self._stop(exc)
                raise

        async def hand_over(batch: Batch) -> None:
            async with changed:
                await changed.wait_for(lambda: waiting.fits(batch))
                waiting.add(batch)
                changed.notify_all()

        async def end() -> None:
            nonlocal ended
            async with changed:
                ended = True
                changed.notify_all()

        writer = asyncio.create_task(apply_in_order(), name=f"{self.handler.name}-writer")
        self._writer = writer
        try:
            async for batch in source.batches():
                if not await self._unless_stopped(hand_over(batch), writer):
                    break
            else:
                await self._unless_stopped(end(), writer)
                await asyncio.wait((writer,))
        finally:
            writer.cancel()
            if self._publishing is not None:
                self._publishing.cancel()
        # A writer that failed has asked the worker to stop: the loop returns instead of
        # raising, so that the failure is reported once, through ``stop``, while the worker
        # stops (with two agents failing together, a supervisor's restart hung a worker).
        if writer.done() and not writer.cancelled():
            writer.exception()  # retrieved: it was reported through ``stop``

    async def drain(self, within_seconds: float) -> bool:
        """Take no new batch; wait up to ``within_seconds`` for the batch being applied and
        the one being published to be committed, published and acknowledged. True if they
        were (or none was in progress); False if they were cancelled at the deadline (a
        transaction rolls back and its batch is redelivered; a publication's outbox rows are
        published at the next start, its batch redelivered and skipped)."""
        self._draining = True
        writer = self._writer
        if writer is None or writer.done():
            return True
        publishing = self._publishing
        abandoned = self._applying or (publishing is not None and not publishing.done())
        async with self._changed:
            self._changed.notify_all()  # an idle writer ends, after the publication
        if abandoned:
            done, _ = await asyncio.wait((writer,), timeout=within_seconds)
            if done:
                return True
            log.warning("%s: abandoning the batch in progress at shutdown", self.handler.name)
        writer.cancel()  # idle (waiting for a batch) or past the deadline
        await asyncio.wait((writer,))
        return not abandoned

    @staticmethod
    async def _unless_stopped(handing_over: Awaitable[None], writer: asyncio.Task[None]) -> bool:
        """Hand a batch (or the end) to the writer; False if the writer stopped (it takes no
        more)."""
        put = asyncio.ensure_future(handing_over)
        await asyncio.wait((put, writer), return_when=asyncio.FIRST_COMPLETED)
        if writer.done():
            put.cancel()
            return False
        return True


async def _applied(
    handler: BatchHandler, messages: Sequence[InputMessage], isolation: Isolation
) -> Publication:
    await handler.apply(messages, isolation)
    return _Published()


@dataclass(frozen=True, slots=True)
class _InOrder:
    """The publications of a batch's parts, one after the other."""

    publications: Sequence[Publication]

    async def publish(self) -> None:
        for publication in self.publications:
            await publication.publish()
