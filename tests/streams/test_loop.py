"""The batch loop: batches that wait for a busy writer are applied together
(ops/decisions/freshness.md), each acknowledged in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from streams.isolation import CircuitBreaker, Isolation
from streams.loop import Batch, BatchLimits, BatchLoop, Waiting, merged
from streams.metrics import Metrics
from support.deadletters import memory_dead_letters
from support.fakes import Stops, message
from topics.messages import InputMessage


def batch(*offsets: int, value: bytes = b"{}") -> Batch:
    return Batch([message(offset, value) for offset in offsets], token=offsets)


def test_batches_wait_together_up_to_the_event_bound() -> None:
    waiting = Waiting(BatchLimits(max_events=3, max_bytes=1 << 20))
    first, second, third = batch(0, 1), batch(2), batch(3)
    assert waiting.fits(first)
    waiting.add(first)
    assert waiting.fits(second)
    waiting.add(second)
    assert not waiting.fits(third)  # four events: it waits for the next take
    assert waiting.take() == [first, second]
    assert waiting.fits(third) and waiting.take() == []


def test_batches_wait_together_up_to_the_byte_bound_and_one_alone_always_fits() -> None:
    size = len(b"acme:m0") + 100
    waiting = Waiting(BatchLimits(max_events=100, max_bytes=2 * size))
    large = batch(0, 1, 2, value=b"x" * 100)  # three messages: more than the bound alone
    assert waiting.fits(large)
    waiting.add(large)
    assert not waiting.fits(batch(3, value=b"x" * 100))
    waiting.take()
    waiting.add(batch(4, value=b"x" * 100))
    assert waiting.fits(batch(5, value=b"x" * 100))
    assert not waiting.fits(batch(6, 7, value=b"x" * 100))


def test_merged_batches_keep_their_order_and_one_batch_stays_itself() -> None:
    one = batch(0)
    assert merged([one]) is one
    assert [m.offset for m in merged([batch(0, 1), batch(2), batch(3)]).messages] == [0, 1, 2, 3]


@dataclass
class GatedHandler:
    """Records each apply's offsets; the first apply waits until ``release`` is set."""

    name: str = "gated"
    started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    applies: list[list[int]] = field(default_factory=list)

    async def apply(self, messages: Sequence[InputMessage], isolation: Isolation) -> object:
        self.started.set()
        await self.release.wait()
        self.applies.append([m.offset for m in messages])
        return None


@dataclass
class BurstSource:
    """Hands out its first batch, and the others once the writer is busy with it."""

    first: Batch
    rest: list[Batch]
    writer_busy: asyncio.Event
    last_yielded: asyncio.Event = field(default_factory=asyncio.Event)
    handed_over: asyncio.Event = field(default_factory=asyncio.Event)
    acked: list[object] = field(default_factory=list)
    all_acked: asyncio.Event = field(default_factory=asyncio.Event)

    async def batches(self) -> AsyncIterator[Batch]:
        yield self.first
        await self.writer_busy.wait()
        for number, one in enumerate(self.rest, start=1):
            if number == len(self.rest):
                self.last_yielded.set()  # the ones before it are handed over
            yield one
        self.handed_over.set()
        await asyncio.Event().wait()  # like a consumer: never ends

    async def ack(self, batch: Batch) -> None:
        self.acked.append(batch.token)
        if len(self.acked) == 1 + len(self.rest):
            self.all_acked.set()


def applied_during_a_busy_apply(max_events: int) -> tuple[list[list[int]], list[object]]:
    async def run() -> tuple[list[list[int]], list[object]]:
        handler = GatedHandler()
        source = BurstSource(batch(0), [batch(1), batch(2, 3), batch(4)], handler.started)
        metrics = Metrics(CollectorRegistry())
        isolation = Isolation(CircuitBreaker(handler.name), metrics, memory_dead_letters())
        limits = BatchLimits(max_events=max_events, max_wait_seconds=0.01, max_bytes=1 << 20)
        loop = BatchLoop(handler, isolation, limits, metrics, Stops(), max_backoff_seconds=0.01)
        running = asyncio.create_task(loop.run(source))
        # The last batch does not fit with the others under a small bound: it is handed over
        # only once the writer took them.
        await (source.handed_over if max_events > 4 else source.last_yielded).wait()
        handler.release.set()
        await source.all_acked.wait()
        running.cancel()
        await asyncio.wait((running,))
        return handler.applies, source.acked

    return asyncio.run(run())


def test_batches_handed_over_while_the_writer_is_busy_are_applied_as_one() -> None:
    applies, acked = applied_during_a_busy_apply(max_events=100)
    assert applies == [[0], [1, 2, 3, 4]]
    assert acked == [(0,), (1,), (2, 3), (4,)]  # every batch acknowledged, in order


def test_batches_applied_as_one_stay_within_the_event_bound() -> None:
    applies, acked = applied_during_a_busy_apply(max_events=3)
    assert applies == [[0], [1, 2, 3], [4]]
    assert acked == [(0,), (1,), (2, 3), (4,)]
