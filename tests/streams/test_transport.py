"""Inline delivery in the faust transport: a coroutine started inline behaves as the task
faust would have made of it. Pure: no service (the faust app is built, never started)."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from pathlib import Path
from typing import Any

import pytest

from streams.app import build_app
from streams.settings import Settings
from streams.transport import InlineDeliveryConsumer, start_inline

trace: contextvars.ContextVar[str] = contextvars.ContextVar("trace", default="")


async def finishes_at_once(steps: list[str]) -> str:
    steps.append("ran")
    return "done"


async def records_cancellation(gate: asyncio.Future[None], seen: list[str], label: str) -> None:
    try:
        await gate
    except asyncio.CancelledError:
        seen.append(label)
        raise


async def cancel_once_running(started: asyncio.Future[Any]) -> None:
    await asyncio.sleep(0)  # the task running the rest has taken its first step
    started.cancel()
    with pytest.raises(asyncio.CancelledError):
        await started


async def waits_for(gate: asyncio.Future[str], steps: list[str]) -> str:
    steps.append("before")
    value = await gate
    steps.append("after")
    return value


def test_a_coroutine_that_never_waits_finishes_inline_without_a_task() -> None:
    async def scenario() -> None:
        steps: list[str] = []
        tasks_before = asyncio.all_tasks()
        started = start_inline(finishes_at_once(steps))
        assert started.done() and started.result() == "done"
        assert steps == ["ran"]
        assert asyncio.all_tasks() == tasks_before

    asyncio.run(scenario())


def test_a_coroutine_that_waits_goes_on_as_a_task_once_what_it_awaits_is_done() -> None:
    async def scenario() -> None:
        steps: list[str] = []
        gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        started = start_inline(waits_for(gate, steps))
        assert steps == ["before"] and not started.done()
        await asyncio.sleep(0)
        assert steps == ["before"]
        gate.set_result("opened")
        assert await started == "opened"
        assert steps == ["before", "after"]

    asyncio.run(scenario())


def test_errors_surface_where_a_task_would_raise_them() -> None:
    async def fails_at_once() -> None:
        raise ValueError("first step")

    async def fails_later(gate: asyncio.Future[None]) -> None:
        await gate
        raise KeyError("after the wait")

    async def scenario() -> None:
        with pytest.raises(ValueError, match="first step"):
            start_inline(fails_at_once())
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        started = start_inline(fails_later(gate))
        gate.set_result(None)
        with pytest.raises(KeyError):
            await started

    asyncio.run(scenario())


def test_cancelling_the_rest_cancels_the_coroutine_where_it_waits() -> None:
    seen: list[str] = []

    async def scenario() -> None:
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await cancel_once_running(
            start_inline(records_cancellation(gate, seen, "cancelled at the wait"))
        )
        assert gate.cancelled()

    asyncio.run(scenario())
    assert seen == ["cancelled at the wait"]


def test_a_cancellation_before_the_rest_ever_ran_still_reaches_the_coroutine() -> None:
    seen: list[str] = []

    async def at_a_bare_yield() -> None:
        try:
            await asyncio.sleep(0)
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen.append("bare yield")
            raise

    async def scenario() -> None:
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        at_a_future = records_cancellation(gate, seen, "future")
        for started in (start_inline(at_a_bare_yield()), start_inline(at_a_future)):
            started.cancel()  # before the task's first step
            with pytest.raises(asyncio.CancelledError):
                await started
        assert gate.cancelled()

    asyncio.run(scenario())
    assert seen == ["bare yield", "future"]


def test_a_cancellation_at_a_bare_yield_is_thrown_into_the_coroutine() -> None:
    seen: list[str] = []

    async def yields_to_the_loop() -> str:
        try:
            for _ in range(5):
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "finished"

    async def scenario() -> None:
        await cancel_once_running(start_inline(yields_to_the_loop()))  # between bare yields

    asyncio.run(scenario())
    assert seen == ["cancelled"]


def test_cancelling_while_it_awaits_a_task_cancels_that_task_first() -> None:
    async def scenario() -> None:
        inner = asyncio.ensure_future(asyncio.sleep(10))

        async def awaits_a_task() -> None:
            await inner

        await cancel_once_running(start_inline(awaits_a_task()))
        assert inner.cancelled()

    asyncio.run(scenario())


def test_bare_yields_and_context_variables_behave_as_in_a_task() -> None:
    async def traced() -> str:
        trace.set("inside")
        await asyncio.sleep(0)  # a bare yield
        await asyncio.sleep(0.001)  # a real wait
        return trace.get()

    async def scenario() -> None:
        started = start_inline(traced())
        assert trace.get() == ""  # the coroutine's context is its own, as a task's is
        assert await started == "inside"

    asyncio.run(scenario())


def consumer(tmp_path: Path) -> InlineDeliveryConsumer:
    app = build_app(Settings(data_dir=tmp_path), "transport-test")
    built = app.consumer
    assert isinstance(built, InlineDeliveryConsumer)
    return built


def test_the_app_consumes_through_inline_delivery_and_closes_what_it_never_started(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        flow_stopped = asyncio.Event()
        steps: list[str] = []
        race_arm = flow_stopped.wait()
        results = await consumer(tmp_path).wait_first(finishes_at_once(steps), race_arm)
        assert steps == ["ran"]
        assert results.results == ["done"] and not results.stopped
        assert inspect.getcoroutinestate(race_arm) == inspect.CORO_CLOSED

    asyncio.run(scenario())


def test_an_error_in_the_first_step_propagates_and_closes_the_rest(tmp_path: Path) -> None:
    async def fails_at_once() -> None:
        raise ValueError("bad message")

    async def scenario() -> None:
        race_arm = asyncio.Event().wait()
        with pytest.raises(ValueError, match="bad message"):
            await consumer(tmp_path).wait_first(fails_at_once(), race_arm)
        assert inspect.getcoroutinestate(race_arm) == inspect.CORO_CLOSED

    asyncio.run(scenario())


def test_a_stopping_consumer_leaves_the_decision_to_faust(tmp_path: Path) -> None:
    async def scenario() -> None:
        stopping = consumer(tmp_path)
        stopping._stopped.set()  # what Service.stop() sets first
        results = await stopping.wait_first(finishes_at_once([]), asyncio.Event().wait())
        assert results.stopped and results.results == []

    asyncio.run(scenario())


def test_a_delivery_that_must_wait_still_races_the_flow_stopping(tmp_path: Path) -> None:
    async def scenario() -> None:
        flow_stopped = asyncio.Event()
        steps: list[str] = []
        gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        race = asyncio.ensure_future(
            consumer(tmp_path).wait_first(waits_for(gate, steps), flow_stopped.wait())
        )
        await asyncio.sleep(0.01)
        assert not race.done()
        flow_stopped.set()  # a rebalance stops the flow while the delivery waits
        results = await race
        assert results.results == [True]  # the flow's event won; faust cancels the delivery
        await asyncio.sleep(0)
        assert gate.cancelled() and steps == ["before"]

    asyncio.run(scenario())
