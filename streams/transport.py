"""The faust transport memproj's apps run on: faust's aiokafka transport, reading committed
data only (``ReadCommittedConsumerThread``), with each fetched message handed to the agents'
streams inline whenever that needs no waiting.

Faust's drain loop delivers every message through
``consumer.wait_first(callback(message), consumer.suspend_flow.wait())``: the delivery is
raced against a rebalance stopping the flow, so that a delivery blocked on a full stream
buffer cannot hold up the rebalance. ``mode.Service.wait_first`` wraps each argument, and the
service's own stopped and crashed events, in a task and waits on all four with
``asyncio.wait``. Per message that was about half of faust's CPU time (a no-op agent: 61 µs
per event, 28 µs without it).

Almost every delivery finishes without waiting: the stream buffer has room. A delivery that
finishes in its first step has finished first, so there is no race to run.
``InlineDeliveryConsumer.wait_first`` runs that first step on the spot; a delivery that has
to wait goes on as a task, into faust's race, exactly as before. Only the first argument is
started inline, and only while the consumer is neither stopping nor crashed: when it is,
faust's own ``wait_first`` decides.

One thing changes by design: the drain loop no longer gives the event loop a turn at every
message, only at each fetch and every 100 messages (faust's own yield), so the agents,
heartbeats and rebalance callbacks wait at most that long: a few milliseconds.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import types
from collections.abc import AsyncIterator, Coroutine, Generator, Sequence
from typing import Any, TypeVar

import faust
from faust.transport.drivers import aiokafka
from faust.types import TP, Message
from mode.services import WaitArgT, WaitResults
from mode.utils.times import Seconds

T = TypeVar("T")


def start_inline(coroutine: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """Run ``coroutine`` until it first waits, now, in a copy of the current context.

    Returns a future that is already done if the coroutine finished without waiting (no task
    was created), or otherwise the task running the rest of it. An exception raised before
    the first wait propagates from here. Unlike in a task, ``asyncio.current_task()`` during
    that first step is the caller's: the first step must not depend on it (``asyncio.timeout``
    and ``TaskGroup`` do; faust's delivery does not).
    """
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    try:
        awaited = context.run(coroutine.send, None)
    except StopIteration as stop:
        finished: asyncio.Future[T] = loop.create_future()
        finished.set_result(stop.value)
        return finished
    rest = loop.create_task(_steps(coroutine, awaited), context=context)
    rest.add_done_callback(functools.partial(_unwind_if_never_resumed, coroutine, awaited))
    return rest


@types.coroutine
def _steps(coroutine: Coroutine[Any, Any, T], awaited: Any) -> Generator[Any, Any, T]:
    """Hand the task what the coroutine waits on, and the coroutine what the task sends or
    throws (a cancellation): the task steps the coroutine exactly as if it had started it."""
    while True:
        try:
            sent = yield awaited
        except BaseException as thrown:
            step = functools.partial(coroutine.throw, thrown)
        else:
            step = functools.partial(coroutine.send, sent)
        try:
            awaited = step()
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]


def _unwind_if_never_resumed(
    coroutine: Coroutine[Any, Any, Any], awaited: Any, rest: asyncio.Task[Any]
) -> None:
    """A task cancelled before its first step never reaches the coroutine: cancel what the
    coroutine waits on and throw the cancellation in here instead, so that its cleanup runs."""
    if not rest.cancelled() or inspect.getcoroutinestate(coroutine) != inspect.CORO_SUSPENDED:
        return
    if isinstance(awaited, asyncio.Future):
        awaited.cancel()
    try:
        coroutine.throw(asyncio.CancelledError())
    except (asyncio.CancelledError, StopIteration):
        return
    coroutine.close()  # it wants to wait again, and nothing is left to drive it


def _close_unstarted(coros: Sequence[WaitArgT]) -> None:
    for other in coros:
        if asyncio.iscoroutine(other):
            other.close()  # never started: nothing to wait for or clean up


READ_COMMITTED = "read_committed"


class ReadCommittedConsumerThread(aiokafka.AIOKafkaConsumerThread):
    """faust's aiokafka consumer thread, reading committed data only (contract 1.1: an aborted
    transaction's events are never applied).

    faust reads with ``read_committed`` only in exactly-once mode (``processing_guarantee``),
    which would also make every commit transactional: memproj does not use it. faust has no
    setting for the isolation level and passes no extra arguments to ``AIOKafkaConsumer``, so
    the level is set on the consumer faust built, before it starts: ``AIOKafkaConsumer``
    keeps its constructor argument as ``_isolation_level`` and hands it to its fetcher in
    ``start()`` (which rejects an unknown value). The attribute is checked first, so an aiokafka
    that renames it fails here instead of silently reading uncommitted data.
    """

    def _create_worker_consumer(self, transport: aiokafka.Transport) -> Any:
        consumer = super()._create_worker_consumer(transport)
        if getattr(consumer, "_isolation_level", None) not in ("read_uncommitted", READ_COMMITTED):
            raise RuntimeError(
                "aiokafka.AIOKafkaConsumer no longer keeps its isolation level in"
                " _isolation_level: memproj cannot make it read committed data only"
            )
        consumer._isolation_level = READ_COMMITTED
        return consumer


class InlineDeliveryConsumer(aiokafka.Consumer):
    def _new_consumer_thread(self) -> ReadCommittedConsumerThread:
        return ReadCommittedConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def getmany(self, timeout: float) -> AsyncIterator[tuple[TP, Message]]:  # noqa: ASYNC109  # faust's signature
        """faust's messages, with the one offset gap faust misses recorded first.

        Transactions leave offsets a consumer never receives: their markers (at any isolation
        level) and, read committed, aborted messages. faust commits an offset only past
        consecutive acknowledged offsets, so its drain loop records such a gap when a
        message's offset jumps past the previous one's, but only if that one's offset is
        truthy (``if gap > 1 and r_offset``): after a message at offset 0 the gap is never
        recorded, and the partition's committed offset stays at 1 for good (its consumer
        lag never reaches 0). This records that gap exactly as faust records the others,
        before the drain loop sees the message (it reads the previous offset the same way).
        """
        read_offset = self._read_offset
        acks_enabled_for = self.app.topics.acks_enabled_for
        async for tp, message in super().getmany(timeout):
            if read_offset[tp] == 0 and message.offset > 1 and acks_enabled_for(message.topic):
                await self._add_gap(tp, 1, message.offset)
            yield tp, message

    # The signature is mode's, timeout included.
    async def wait_first(self, *coros: WaitArgT, timeout: Seconds = None) -> WaitResults:  # type: ignore[assignment]  # noqa: ASYNC109
        first = coros[0] if coros else None
        if asyncio.iscoroutine(first) and not (self.should_stop or self.crashed):
            try:
                started = start_inline(first)
            except BaseException:
                _close_unstarted(coros[1:])
                raise
            if started.done():
                _close_unstarted(coros[1:])
                return WaitResults([first], [started.result()], False)
            coros = (started, *coros[1:])
        return await super().wait_first(*coros, timeout=timeout)


class Transport(aiokafka.Transport):
    Consumer = InlineDeliveryConsumer


def install(app: faust.App) -> None:
    """Make ``app`` consume through ``Transport``; call before anything uses the app."""
    app.transport = Transport(app.conf.broker_consumer, app)
