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

At shutdown (``drain``) the loop takes no new batch: the batch being applied finishes
(committed, published, acknowledged) or, past the deadline, is cancelled, which rolls its
transaction back; a batch queued behind it was never started and is redelivered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from streams.failures import retry_transient
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
        self._draining = False
        self._applying = False

    async def apply(self, batch: Batch) -> None:
        """Apply every part of ``batch`` (transient failures retried until they pass)."""
        name = self.handler.name

        def retried(exc: Exception) -> None:
            self._observer.retried(name, type(exc).__name__)

        for part in split_by_bytes(batch.messages, self.limits.max_bytes):
            await retry_transient(
                f"{name}: batch",
                partial(self.handler.apply, part, self.isolation),
                self._max_backoff,
                retried,
            )

    async def run(self, source: BatchSource) -> None:
        """Apply every batch of ``source`` until it ends (a consumer's never does: the
        worker's stop cancels it, and what was not acknowledged is redelivered)."""
        waiting = Waiting(self.limits)
        changed = asyncio.Condition()
        ended = False

        async def apply_in_order() -> None:
            try:
                while not self._draining:
                    async with changed:
                        await changed.wait_for(lambda: bool(waiting.batches) or ended)
                        if self._draining or not waiting.batches:
                            return
                        batches = waiting.take()
                        self._applying = True
                        changed.notify_all()
                    try:
                        await self.apply(merged(batches))
                        for batch in batches:
                            await source.ack(batch)
                    finally:
                        self._applying = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.critical("%s: stopping the worker: %s", self.handler.name, exc)
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
        # A writer that failed has asked the worker to stop: the loop returns instead of
        # raising, so that the failure is reported once, through ``stop``, while the worker
        # stops (with two agents failing together, a supervisor's restart hung a worker).
        if writer.done() and not writer.cancelled():
            writer.exception()  # retrieved: it was reported through ``stop``

    async def drain(self, within_seconds: float) -> bool:
        """Take no new batch; wait up to ``within_seconds`` for the batch being applied to be
        committed, published and acknowledged. True if it was (or none was being applied);
        False if it was cancelled at the deadline (its transaction rolls back, it is
        redelivered)."""
        self._draining = True
        writer = self._writer
        if writer is None or writer.done():
            return True
        abandoned = self._applying
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
