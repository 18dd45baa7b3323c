"""The batch loop: batches that wait for a busy writer are applied together
(ops/decisions/freshness.md), each acknowledged in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
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


@dataclass
class TwoStepHandler:
    """A ``CommittingHandler``: records commits and publications; each publication waits
    until its gate (by the first offset of its batch) is opened."""

    name: str = "two-step"
    events: list[str] = field(default_factory=list)
    gates: dict[int, asyncio.Event] = field(default_factory=dict)
    committed: asyncio.Condition = field(default_factory=asyncio.Condition)
    failing: frozenset[int] = frozenset()

    def gate(self, offset: int) -> asyncio.Event:
        return self.gates.setdefault(offset, asyncio.Event())

    async def apply(self, messages: Sequence[InputMessage], isolation: Isolation) -> object:
        raise AssertionError("the loop commits a committing handler's batches")

    async def commit(self, messages: Sequence[InputMessage], isolation: Isolation) -> Publishing:
        first = messages[0].offset
        async with self.committed:
            self.events.append(f"commit {first}")
            self.committed.notify_all()
        return Publishing(self, first)


@dataclass
class Publishing:
    handler: TwoStepHandler
    first: int

    async def publish(self) -> None:
        self.handler.events.append(f"publishing {self.first}")
        await self.handler.gate(self.first).wait()
        if self.first in self.handler.failing:
            raise RuntimeError("the broker refused it")
        self.handler.events.append(f"published {self.first}")


@dataclass
class ListSource:
    """Hands out its batches one by one as the test allows, then never ends."""

    batches_to_give: asyncio.Queue[Batch] = field(default_factory=asyncio.Queue)
    events: list[str] = field(default_factory=list)
    acked: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def batches(self) -> AsyncIterator[Batch]:
        while True:
            yield await self.batches_to_give.get()

    async def ack(self, batch: Batch) -> None:
        async with self.acked:
            self.events.append(f"ack {batch.token}")
            self.acked.notify_all()


def two_step_loop(handler: TwoStepHandler, stops: Stops) -> BatchLoop:
    metrics = Metrics(CollectorRegistry())
    isolation = Isolation(CircuitBreaker(handler.name), metrics, memory_dead_letters())
    limits = BatchLimits(max_events=100, max_wait_seconds=0.01, max_bytes=1 << 20)
    return BatchLoop(handler, isolation, limits, metrics, stops, max_backoff_seconds=0.01)


async def wait_for(condition: asyncio.Condition, predicate: Callable[[], bool]) -> None:
    async with condition:
        await condition.wait_for(predicate)


def test_a_batch_commits_while_the_one_before_publishes_and_each_is_acknowledged_after_it() -> None:
    async def run() -> list[str]:
        handler, source = TwoStepHandler(), ListSource()
        loop = two_step_loop(handler, Stops())
        running = asyncio.create_task(loop.run(source))
        source.batches_to_give.put_nowait(batch(0))
        await wait_for(handler.committed, lambda: "commit 0" in handler.events)
        source.batches_to_give.put_nowait(batch(1))
        # Batch 1 commits while batch 0's publication is held; its own publication waits.
        await wait_for(handler.committed, lambda: "commit 1" in handler.events)
        source.batches_to_give.put_nowait(batch(2))
        handler.gate(1).set()
        handler.gate(2).set()
        handler.gate(0).set()
        await wait_for(source.acked, lambda: len(source.events) == 3)
        running.cancel()
        await asyncio.wait((running,))
        return [*handler.events, *source.events]

    events = asyncio.run(run())
    assert events.index("commit 1") < events.index("published 0")
    publications = [e for e in events if e.startswith("publishing")]
    assert publications == ["publishing 0", "publishing 1", "publishing 2"]  # in commit order
    assert events.index("published 0") < events.index("publishing 1")  # one at a time
    assert [e for e in events if e.startswith("ack")] == ["ack (0,)", "ack (1,)", "ack (2,)"]


def test_the_drain_waits_for_the_publication_in_progress() -> None:
    async def run() -> tuple[bool, list[str]]:
        handler, source = TwoStepHandler(), ListSource()
        loop = two_step_loop(handler, Stops())
        running = asyncio.create_task(loop.run(source))
        source.batches_to_give.put_nowait(batch(0))
        await wait_for(handler.committed, lambda: "commit 0" in handler.events)
        # The writer is idle, batch 0's publication held.
        draining = asyncio.create_task(loop.drain(within_seconds=60))
        handler.gate(0).set()
        drained = await draining
        running.cancel()
        await asyncio.wait((running,))
        return drained, [*handler.events, *source.events]

    drained, events = asyncio.run(run())
    assert drained
    assert events == ["commit 0", "publishing 0", "published 0", "ack (0,)"]


def test_a_failed_publication_stops_the_worker_and_its_batch_is_not_acknowledged() -> None:
    async def run() -> tuple[list[BaseException], list[str]]:
        handler, source, stops = TwoStepHandler(failing=frozenset({0})), ListSource(), Stops()
        loop = two_step_loop(handler, stops)
        running = asyncio.create_task(loop.run(source))
        source.batches_to_give.put_nowait(batch(0))
        await wait_for(handler.committed, lambda: "commit 0" in handler.events)
        handler.gate(0).set()
        source.batches_to_give.put_nowait(batch(1))
        await wait_for(handler.committed, lambda: "commit 1" in handler.events)
        await asyncio.wait((running,))  # the writer ends: the loop returns
        return stops.stopped, [*handler.events, *source.events]

    stopped, events = asyncio.run(run())
    assert [str(exc) for exc in stopped] == ["the broker refused it"]
    assert not [e for e in events if e.startswith("ack")]
    assert "publishing 1" not in events  # committed, not published: its rows wait in the outbox
