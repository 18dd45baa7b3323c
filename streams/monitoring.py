"""The monitor worker's duties: consumer lag of every memproj group, and the reconciliation
audit of every derived store (``memproj_ghost_items``).

With several monitors, one leads (``streams.coordination.Lease``): it alone collects and
exports the lag and ghost gauges; a standby exports ``memproj_duty_leader{duty="monitor"} 0``
and none of them, and clears them if it stands down. So a sum over the gauges stays right,
and the ghost audit, which reads every store, runs once."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from mode import Service
from psycopg_pool import AsyncConnectionPool

from projections.deletion.audit import audit_ghosts
from projections.sql import Conn
from projections.stores import DerivedStore
from streams.coordination import Lease
from streams.lag import LagCollector
from streams.metrics import Metrics

log = logging.getLogger(__name__)


class MonitorService(Service):
    def __init__(
        self,
        lag: LagCollector,
        pool: AsyncConnectionPool[Conn],
        stores: Sequence[DerivedStore],
        metrics: Metrics,
        interval: timedelta,
        audit_interval: timedelta,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        lease: Lease | None = None,
        **kwargs: Any,
    ) -> None:
        """``lease``: the duties run where it leads (None: here, always)."""
        self._lag = lag
        self._lease = lease
        self._pool = pool
        self._stores = stores
        self._metrics = metrics
        self._interval = interval.total_seconds()
        self._audit_interval = audit_interval.total_seconds()
        self._clock = clock
        self._last_audit = float("-inf")
        super().__init__(**kwargs)

    @Service.task
    async def _duties(self) -> None:
        while not self.should_stop:
            await self.round()
            await self.sleep(self._interval)

    async def round(self) -> bool:
        """One round, where this monitor leads: lag, and the ghost audit when it is due.
        Whether it led."""
        if self._lease is not None and not await self._lease.leads():
            # The leader's audit is not this replica's: a new leader audits at once.
            self._last_audit = float("-inf")
            return False
        try:
            self._metrics.consumer_lag(await asyncio.to_thread(self._lag.collect))
        except Exception:
            log.exception("monitor: lag collection failed")
        if time.monotonic() - self._last_audit >= self._audit_interval:
            try:
                await self.audit()
            except Exception:
                log.exception("monitor: ghost audit failed")
        return True

    @property
    def stores(self) -> Sequence[DerivedStore]:
        """The derived stores the ghost audit reads."""
        return self._stores

    async def audit(self) -> None:
        async with self._pool.connection() as conn:
            results = await audit_ghosts(conn, self._stores, self._clock())
        self._last_audit = time.monotonic()
        self._metrics.ghost_items({store: len(r.ghosts) for store, r in results.items()})
        for result in results.values():
            if result.ghosts:
                # Their ids are for `memproj audit ghosts`, not for a log no erasure reaches.
                log.error("ghost audit: %d items in %s", len(result.ghosts), result.store)
