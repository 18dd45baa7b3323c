"""The duty locks' contract (``projections.coordination.LockSession``): one session holds a
duty at a time, holds it again for as long as it lives, and releases it by ending.

Run against the in-memory fake and against PostgreSQL (tests/projections/test_duty_locks.py,
the latter under the integration marker). A backend gives ``sessions``: a way to open a new
session on one shared lock space, run in its own event loop by ``run``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest

from projections.coordination import LockSession

T = TypeVar("T")
Sessions = Callable[[], Awaitable[LockSession]]


def run(scenario: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(scenario)


class LockSessionContract:
    """Every ``LockSession``. ``sessions``: opens sessions on one lock space, empty of the
    duties the contract uses (each test names its own)."""

    @pytest.fixture
    def sessions(self) -> Sessions:
        raise NotImplementedError("a backend's subclass gives its sessions")

    def test_one_session_holds_a_duty_and_keeps_it(self, sessions: Sessions) -> None:
        async def scenario() -> list[bool]:
            first, second = await sessions(), await sessions()
            try:
                return [
                    await first.try_hold("contract-hold"),
                    await second.try_hold("contract-hold"),
                    await first.try_hold("contract-hold"),
                    await first.alive(),
                    await second.try_hold("contract-hold"),
                ]
            finally:
                await first.close()
                await second.close()

        assert run(scenario()) == [True, False, True, True, False]

    def test_duties_are_held_apart(self, sessions: Sessions) -> None:
        async def scenario() -> list[bool]:
            first, second = await sessions(), await sessions()
            try:
                return [
                    await first.try_hold("contract-a"),
                    await second.try_hold("contract-b"),
                    await second.try_hold("contract-a"),
                ]
            finally:
                await first.close()
                await second.close()

        assert run(scenario()) == [True, True, False]

    def test_a_session_that_ends_releases_its_duty(self, sessions: Sessions) -> None:
        async def scenario() -> list[bool]:
            first, second = await sessions(), await sessions()
            try:
                held = [await first.try_hold("contract-end"), await second.try_hold("contract-end")]
                await first.close()
                # A server ends the closed session's backend, and its locks, a moment after
                # the client has let go: the duty is free within that moment.
                for _ in range(100):
                    if await second.try_hold("contract-end"):
                        return [*held, True]
                    await asyncio.sleep(0.05)
                return [*held, False]
            finally:
                await second.close()

        assert run(scenario()) == [True, False, True]
