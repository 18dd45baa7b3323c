"""Isolation's pure parts: bisection, the breaker's judgement, byte-bounded parts."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.failures import SystemicFailure
from streams.isolation import CircuitBreaker, Failure, bisect, stage
from streams.loop import split_by_bytes
from support.fakes import message
from topics.outputs import DeadLetterReason


def failure(stage_name: str = "write", error: str = "ValueError") -> Failure:
    return Failure(DeadLetterReason.PROCESSING_FAILED, stage_name, error, "boom")


@given(st.lists(st.booleans(), min_size=1, max_size=64))
def test_bisect_applies_every_good_item_in_order_and_isolates_every_bad_one(
    bad: list[bool],
) -> None:
    applied: list[int] = []

    async def attempt(part: Sequence[int]) -> None:
        with stage("apply"):
            if any(bad[i] for i in part):
                raise ValueError("poison")
        applied.extend(part)

    _, failed = asyncio.run(bisect(list(range(len(bad))), attempt))
    assert applied == [i for i, b in enumerate(bad) if not b]
    assert [i for i, _ in failed] == [i for i, b in enumerate(bad) if b]


def test_bisect_lets_transient_and_environment_failures_through() -> None:
    for error in (psycopg.OperationalError, psycopg.errors.UndefinedTable):

        async def attempt(part: Sequence[int], error: type[Exception] = error) -> None:
            raise error("not about a message")

        with pytest.raises(error):
            asyncio.run(bisect([1, 2, 3], attempt))


def test_one_poison_pill_in_a_batch_does_not_trip_the_breaker() -> None:
    CircuitBreaker("w").check(100, [failure()])


def test_most_of_a_batch_failing_the_same_way_trips_the_breaker() -> None:
    with pytest.raises(SystemicFailure, match="circuit breaker"):
        CircuitBreaker("w").check(10, [failure()] * 6)


def test_different_failures_are_judged_apart() -> None:
    mixed = [failure(error=f"Error{i % 3}") for i in range(6)]
    CircuitBreaker("w").check(10, mixed)


def test_a_trickle_of_single_failing_messages_trips_after_min_failures() -> None:
    breaker = CircuitBreaker("w", min_failures=5, window=20)
    for _ in range(4):
        breaker.check(1, [failure()])
    with pytest.raises(SystemicFailure):
        breaker.check(1, [failure()])


def test_successes_between_failures_keep_the_breaker_closed() -> None:
    breaker = CircuitBreaker("w", min_failures=5, window=20)
    for _ in range(30):
        breaker.check(1, [failure()])
        breaker.check(3, [])


@given(st.lists(st.integers(0, 300), max_size=40), st.integers(1, 600))
def test_parts_are_bounded_in_bytes_and_keep_every_message_in_order(
    sizes: list[int], max_bytes: int
) -> None:
    messages = [message(i, b"x" * size) for i, size in enumerate(sizes)]
    parts = list(split_by_bytes(messages, max_bytes))
    assert [m for part in parts for m in part] == messages
    for part in parts:
        total = sum(len(m.value or b"") + len(m.key or b"") for m in part)
        assert len(part) == 1 or total <= max_bytes
