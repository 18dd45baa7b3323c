"""A lease on a duty that runs once among a worker kind's replicas (``projections.coordination``):
a session advisory lock held on a PostgreSQL connection of the lease's own.

Each round of a duty asks ``leads()`` first. The leader's session is checked (a live session
still holds its lock); a standby tries the lock. A leader that dies, SIGKILL included,
releases the lock with its session, and a survivor takes the duty at its next round. A
leader whose session fails (the database restarted, the network dropped it) stands down at
once: the lock went with the session, and another replica may hold it already.

Correctness never rests on the lease alone: every duty it guards is idempotent (a redelivery
is marked in the transaction that queues it, a verification or an expiry done twice finds
nothing left to do). The lease keeps the work from being done once per replica.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from mode import Service

from projections import coordination
from projections.coordination import LockSession, PostgresLockSession, Seen
from streams.failures import loggable
from streams.metrics import Metrics

log = logging.getLogger(__name__)

# How long a look at the lease may take: past it the session counts as failed.
DEFAULT_TIMEOUT_SECONDS = 5.0


def in_postgres(conninfo: str) -> Callable[[], Awaitable[LockSession]]:
    """How a lease opens its session: a PostgreSQL connection of its own."""
    return partial(PostgresLockSession.connect, conninfo)


class Lease(Service):
    def __init__(
        self,
        connect: Callable[[], Awaitable[LockSession]],
        duty: str,
        metrics: Metrics,
        on_lost: Callable[[], None] = lambda: None,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        **kwargs: Any,
    ) -> None:
        """``connect`` opens the lease's session (``in_postgres``); ``on_lost``: what a
        replica that stands down undoes (the gauges only a leader exports)."""
        self._connect = connect
        self.duty = duty
        self._metrics = metrics
        self._on_lost = on_lost
        self._timeout = timeout_seconds
        self._session: LockSession | None = None
        self._leader = False
        # Duties of one process share the lease: one look at a time.
        self._looking = asyncio.Lock()
        super().__init__(**kwargs)

    @property
    def leader(self) -> bool:
        """Whether the last look found this replica leading (``leads`` looks again)."""
        return self._leader

    async def on_start(self) -> None:
        self._metrics.duty_leader.labels(self.duty).set(0)

    async def leads(self) -> bool:
        """Whether this replica runs the duty's round now."""
        async with self._looking:
            seen = await self._look()
            change = coordination.step(self._leader, seen)
            self._leader = coordination.leads(change)
        self._metrics.duty_leader.labels(self.duty).set(1 if self._leader else 0)
        if change == "took":
            log.info("leading %s", self.duty)
        elif change == "lost":
            log.warning("standing down from %s: its lease's session ended", self.duty)
            self._on_lost()
        return self._leader

    async def _look(self) -> Seen:
        try:
            return await asyncio.wait_for(self._ask(), self._timeout)
        except Exception as exc:
            log.debug("lease of %s: %s", self.duty, loggable(exc))
            await self._close()
            return "failed"

    async def _ask(self) -> Seen:
        if self._leader:
            session = self._session
            return "alive" if session is not None and await session.alive() else "failed"
        if self._session is None:
            self._session = await self._connect()
        return "acquired" if await self._session.try_hold(self.duty) else "refused"

    async def _close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            try:
                await session.close()
            except Exception as exc:
                log.debug("lease of %s: closing: %s", self.duty, loggable(exc))

    async def on_stop(self) -> None:
        """The session's end releases the lock: a standby takes the duty at its next round."""
        async with self._looking:
            await self._close()
            self._leader = False
