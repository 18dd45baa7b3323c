"""The deletion worker's periodic duties: redeliver overdue tombstones and report them,
verify completed deletions with the retrieval probe, purge what completed deletions left
(``streams.purge``), refresh the deletion metrics, and trim the API's read audit past its
retention.

With several deletion workers, one leads the duties (``streams.coordination.Lease``); every
one refreshes the deletion metrics, read from PostgreSQL and so the same in each (the alert
rules and dashboards take their max)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from mode import Service
from psycopg_pool import AsyncConnectionPool

from projections import outbox, rebuilds
from projections.access import audit as read_audit
from projections.admission import flags as evidence_flags
from projections.deadletters.keys import destroy_expired
from projections.deletion import lifecycle, probes, queries
from projections.deletion.verify import verify
from projections.memory import store as memory_store
from projections.outbox import OutboxMessage
from projections.sql import Conn, KeyLookups
from projections.stores import DerivedStore
from streams.coordination import Lease
from streams.kafka import KafkaPublisher
from streams.metrics import Metrics
from streams.purge import PurgeRound
from topics.codec import encode
from topics.registry import DELETION_STATUS, DELETION_TOMBSTONES, TopicNames, output_key

log = logging.getLogger(__name__)
PRODUCER = "deletion-maintenance"


class LedgerMaintenance(Service):
    def __init__(
        self,
        pool: AsyncConnectionPool[Conn],
        publisher: KafkaPublisher,
        stores: Sequence[DerivedStore],
        topics: TopicNames,
        metrics: Metrics,
        interval: timedelta,
        redelivery_interval: timedelta,
        rebuild_grace: timedelta,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        audit_retention: timedelta | None = None,
        purge: PurgeRound | None = None,
        purge_interval: timedelta = timedelta(seconds=30),
        lease: Lease | None = None,
        *,
        lookups: KeyLookups,
        **kwargs: Any,
    ) -> None:
        """``audit_retention``: the API's read audit rows are kept this long (None: forever).
        ``purge``: the purge checks, run every ``purge_interval`` (None: not run).
        ``lease``: the duties run where it leads (None: here, always)."""
        self._pool = pool
        self._lookups = lookups
        self._publisher = publisher
        self._stores = stores
        self._topics = topics
        self._metrics = metrics
        self._interval = interval.total_seconds()
        self._redelivery_interval = redelivery_interval
        self._rebuild_grace = rebuild_grace
        self._clock = clock
        self._audit_retention = audit_retention
        self._purge = purge
        self._purge_interval = purge_interval.total_seconds()
        self._purged_round_at = float("-inf")
        self._lease = lease
        super().__init__(**kwargs)

    @Service.task
    async def _duties(self) -> None:
        while not self.should_stop:
            await self.sleep(self._interval)
            duties: tuple[Callable[[], Awaitable[object]], ...] = (self.refresh_metrics,)
            if self._lease is None or await self._lease.leads():
                duties = (
                    self.redeliver_overdue,
                    self.verify_completed,
                    *duties,
                    self.drop_expired_rebuilds,
                    self.drop_expired_probes,
                    self.destroy_expired_letter_keys,
                    self.trim_read_audit,
                    self.check_purges,
                )
            for duty in duties:
                try:
                    await duty()
                except Exception:
                    # A failed round is retried next round; the metrics show it stalling.
                    log.exception("deletion maintenance: %s failed", duty.__name__)

    async def redeliver_overdue(self) -> int:
        """Redeliver each overdue tombstone to the store that has not acknowledged it, and
        publish ``deletion.overdue``, through the outbox like every other output."""
        now = self._clock()
        async with self._pool.connection() as conn, conn.transaction():
            rows = await lifecycle.overdue(conn, now, self._redelivery_interval)
            if not rows:
                return 0
            messages: list[OutboxMessage] = []
            for tenant_id, deletion_id, store_name in rows:
                tombstone = await lifecycle.tombstone_of(conn, tenant_id, deletion_id)
                key = output_key(tenant_id, deletion_id).encode()
                messages.append(
                    OutboxMessage(
                        self._topics.name(DELETION_TOMBSTONES),
                        key,
                        encode(tombstone.model_copy(update={"for_stores": (store_name,)})),
                    )
                )
            await lifecycle.mark_redelivered(conn, rows, now)
            states = await lifecycle.load_states(conn, {(t, d) for t, d, _ in rows}, self._lookups)
            for state in states.values():
                overdue = {
                    name: ack.model_copy(update={"status": "overdue"})
                    if ack.status != "done" and ack.deadline_at < now
                    else ack
                    for name, ack in state.stores.items()
                }
                status = state.status("deletion.overdue").model_copy(update={"stores": overdue})
                messages.append(
                    OutboxMessage(
                        self._topics.name(DELETION_STATUS),
                        output_key(state.tenant_id, state.deletion_id).encode(),
                        encode(status),
                    )
                )
            batch = await outbox.add_to_outbox(conn, PRODUCER, messages)
        await self._publisher.publish(messages)
        async with self._pool.connection() as conn:
            await outbox.remove_outbox_batch(conn, batch)
        log.warning("redelivered %d overdue tombstones", len(rows))
        return len(rows)

    @property
    def stores(self) -> Sequence[DerivedStore]:
        """The derived stores the verification probe reads and whose copies expire."""
        return self._stores

    async def verify_completed(self) -> int:
        async with self._pool.connection() as conn:
            # Anything a crash left in this duty's outbox goes out first.
            pending = await outbox.pending_outbox(conn, PRODUCER)
            if pending:
                await self._publisher.publish([message for _, message in pending])
                await outbox.remove_from_outbox(conn, [row_id for row_id, _ in pending])
            done = 0
            for tenant_id, deletion_id in await lifecycle.unverified(conn):
                result = await verify(conn, self._stores, tenant_id, deletion_id)
                await lifecycle.save_verification(
                    conn, tenant_id, deletion_id, result, self._clock()
                )
                await conn.commit()
                if not result["clean"]:
                    log.error(
                        "deletion %s/%s: verification found %s",
                        tenant_id,
                        deletion_id,
                        result["found"],
                    )
                done += 1
            return done

    async def drop_expired_rebuilds(self) -> list[str]:
        """Rebuild shadows and retired tables are kept for the grace period only."""
        now = self._clock()
        async with self._pool.connection() as conn, conn.transaction():
            dropped = await rebuilds.drop_expired(conn, now, self._rebuild_grace)
        for store in self._stores:  # the copies stores keep outside PostgreSQL (vector tables)
            dropped += await store.expire_copies(now, self._rebuild_grace)
        if dropped:
            log.warning("dropped rebuild schemas past their grace period: %s", dropped)
        return dropped

    async def drop_expired_probes(self) -> int:
        """Probes are kept until their deletion is verified or its deadline passes, whichever
        comes first (verification deletes its own)."""
        async with self._pool.connection() as conn, conn.transaction():
            dropped = await probes.drop_expired_probes(conn, self._clock())
        if dropped:
            log.warning("dropped %d deletion probes at their deadline, unverified", dropped)
        return dropped

    async def destroy_expired_letter_keys(self) -> int:
        """A dead letter opens until the end of its retention (the DLQ topics' too): then its
        key is destroyed, whatever the topic still holds."""
        async with self._pool.connection() as conn, conn.transaction():
            destroyed = await destroy_expired(conn, self._clock())
        if destroyed:
            log.info("destroyed %d dead-letter keys at the end of their retention", destroyed)
        return destroyed

    async def trim_read_audit(self) -> int:
        """The API's read audit is kept for its retention (MEMPROJ_API_AUDIT_RETENTION_SECONDS)."""
        if self._audit_retention is None:
            return 0
        async with self._pool.connection() as conn, conn.transaction():
            trimmed = await read_audit.trim(conn, self._clock(), self._audit_retention)
        if trimmed:
            log.info("trimmed %d read audit rows past their retention", trimmed)
        return trimmed

    async def check_purges(self) -> int:
        """Every ``purge_interval``: one purge round (``streams.purge.PurgeRound``), then
        ``deletion.purged`` on ``deletion.status`` for each deletion it purged, through the
        outbox like every other output."""
        loop_time = asyncio.get_running_loop().time()
        if self._purge is None or loop_time - self._purged_round_at < self._purge_interval:
            return 0
        self._purged_round_at = loop_time
        purged = await self._purge.run()
        if not purged:
            return 0
        async with self._pool.connection() as conn, conn.transaction():
            states = await lifecycle.load_states(conn, purged, self._lookups)
            times = await lifecycle.purge_times(conn, purged, self._lookups)
            messages = []
            for key, state in sorted(states.items()):
                purged_at, places = times.get(key, (None, {}))
                if purged_at is None:
                    continue
                self._metrics.deletion_purged((purged_at - state.requested_at).total_seconds())
                stores = {
                    name: store.model_copy(update={"purged_at": places.get(name)})
                    for name, store in state.stores.items()
                }
                status = state.status("deletion.purged").model_copy(
                    update={"stores": stores, "purged_at": purged_at, "purged": places}
                )
                messages.append(
                    OutboxMessage(
                        self._topics.name(DELETION_STATUS),
                        output_key(state.tenant_id, state.deletion_id).encode(),
                        encode(status),
                    )
                )
            batch = await outbox.add_to_outbox(conn, PRODUCER, messages)
        await self._publisher.publish(messages)
        async with self._pool.connection() as conn:
            await outbox.remove_outbox_batch(conn, batch)
        log.info("%d deletions purged: no copy left anywhere memproj writes", len(messages))
        return len(messages)

    async def refresh_metrics(self) -> None:
        async with self._pool.connection() as conn:
            pending = await lifecycle.pending_by_store(conn, self._clock())
            blocked = await queries.blocked_reads(conn)
            unpurged = await lifecycle.unpurged_by_place(conn, self._clock())
            flagged = await evidence_flags.flagged_memories(conn)
            reviews = await memory_store.review_queue(conn, self._clock())
        self._metrics.memories_evidence_erased.set(flagged)
        self._metrics.review_queue(reviews)
        if self._purge is not None:
            self._metrics.unpurged_deletions(unpurged, self._purge.places)
        self._metrics.pending_deletions(pending, tuple(s.name for s in self._stores))
        self._metrics.deletion_slos({s.name: s.deletion_slo_seconds for s in self._stores})
        self._metrics.blocked_reads(blocked)
