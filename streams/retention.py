"""The retention schedule, a duty of the deletion worker: every round it issues the erasures
retention and expiry have made due (``projections.retention.schedule`` decides), as
``deletion.requested`` on ``deletion.requests`` through the outbox, and refreshes the retention
metrics from the receipt.

Safe with any number of replicas: a round is led by whoever takes the advisory lock (the
others skip it), each issue is recorded once (``retention_issued``) in the transaction that
adds its message to the outbox, and an issue's event is the same whoever builds it, so a copy
that still got through is dropped by the ledger's idempotency.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from mode import Service
from psycopg_pool import AsyncConnectionPool

from projections import coordination, outbox
from projections.outbox import OutboxMessage
from projections.retention import classes, holds
from projections.retention import store as schedule_store
from projections.retention.schedule import (
    Issue,
    Period,
    plan_conversations,
    plan_expiries,
)
from projections.sql import Conn, KeyLookups
from streams.deletion_requests import build_deletion_request
from streams.kafka import KafkaPublisher
from streams.metrics import Metrics
from streams.settings import Settings
from topics.envelope import ActorType
from topics.registry import DELETION_REQUESTS, TopicNames

log = logging.getLogger(__name__)
PRODUCER = "retention-schedule"
ACTOR: tuple[ActorType, str] = ("service", "memproj-retention")


@dataclass(frozen=True, slots=True)
class RetentionSettings:
    interval: timedelta
    global_default: Period
    expiry_grace: timedelta
    batch_size: int


def retention_settings(settings: Settings) -> RetentionSettings:
    return RetentionSettings(
        interval=timedelta(seconds=settings.retention_check_seconds),
        global_default=settings.retention_default,
        expiry_grace=timedelta(seconds=settings.expiry_grace_seconds),
        batch_size=settings.retention_batch_size,
    )


def request_message(issue: Issue, topics: TopicNames) -> OutboxMessage:
    """``issue`` as its ``deletion.requested``: the same bytes whoever builds it."""
    request = build_deletion_request(
        issue.tenant_id,
        {"type": issue.target_type, "id": issue.target_id},
        issue.reason,
        ACTOR,
        issue.requested_at,
        deletion_id=issue.deletion_id,
        event_id=issue.event_id,
        scope="content" if issue.target_type == "conversation" else None,
    )
    return OutboxMessage(topics.name(DELETION_REQUESTS), request.key, request.value)


class RetentionScheduler(Service):
    def __init__(
        self,
        pool: AsyncConnectionPool[Conn],
        publisher: KafkaPublisher,
        topics: TopicNames,
        metrics: Metrics,
        settings: RetentionSettings,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        *,
        lookups: KeyLookups,
        **kwargs: Any,
    ) -> None:
        self._lookups = lookups
        self._pool = pool
        self._publisher = publisher
        self._topics = topics
        self._metrics = metrics
        self._settings = settings
        self._clock = clock
        super().__init__(**kwargs)

    @Service.task
    async def _rounds(self) -> None:
        while not self.should_stop:
            await self.sleep(self._settings.interval.total_seconds())
            for duty in (self.issue_due, self.refresh_metrics):
                try:
                    await duty()
                except Exception:
                    # Retried next round; memproj_retention_overdue_seconds shows it stalling.
                    log.exception("retention schedule: %s failed", duty.__name__)

    async def issue_due(self) -> list[Issue]:
        """One round: what is due now and held by nothing, recorded and published."""
        await self._publish_left_over()
        now = self._clock()
        settings = self._settings
        async with self._pool.connection() as conn, conn.transaction():
            # Normally one replica issues, the others skip the round (correctness does not
            # rest on it: ``record_issued`` and the ledger's idempotency do).
            if not await coordination.try_lead_round(conn, PRODUCER):
                return []
            conversations = await schedule_store.conversation_candidates(
                conn, now, settings.global_default, settings.batch_size
            )
            memories = await schedule_store.memory_candidates(
                conn, now, settings.expiry_grace, settings.batch_size
            )
            policies = await classes.policies(
                conn, {c.tenant_id for c in conversations}, settings.global_default, self._lookups
            )
            on_conversations = await holds.on_conversations(
                conn, ((c.tenant_id, c.conversation_id) for c in conversations)
            )
            on_memories = await holds.on_memories(
                conn, ((m.tenant_id, m.memory_id) for m in memories)
            )
            issues = plan_conversations(
                conversations,
                policies,
                {key: [h.window for h in found] for key, found in on_conversations.items()},
                now,
                settings.global_default,
            ) + plan_expiries(
                memories,
                settings.expiry_grace,
                {key: [h.window for h in found] for key, found in on_memories.items()},
                now,
            )
            recorded = await schedule_store.record_issued(conn, issues, now)
            issued = [issue for issue in issues if issue.deletion_id in recorded]
            messages = [request_message(issue, self._topics) for issue in issued]
            batch = await outbox.add_to_outbox(conn, PRODUCER, messages)
        if messages:
            await self._publisher.publish(messages)
            async with self._pool.connection() as conn:
                await outbox.remove_outbox_batch(conn, batch)
            log.info(
                "retention issued %d erasures (%d conversations, %d expired memories)",
                len(issued),
                sum(1 for i in issued if i.reason == "retention"),
                sum(1 for i in issued if i.reason == "expired"),
            )
        return issued

    async def _publish_left_over(self) -> None:
        """What a crash left in the schedule's outbox goes out first."""
        async with self._pool.connection() as conn:
            pending = await outbox.pending_outbox(conn, PRODUCER)
            if pending:
                await self._publisher.publish([message for _, message in pending])
                await outbox.remove_from_outbox(conn, [row_id for row_id, _ in pending])

    async def refresh_metrics(self) -> None:
        now = self._clock()
        async with self._pool.connection() as conn:
            lines = await schedule_store.receipt(conn, now, self._settings.global_default)
            configured = {row.retention_class for row in await classes.list_classes(conn)}
        due: dict[str, int] = {}
        oldest = 0.0
        for line in lines:
            if line.retention_class == schedule_store.EXPIRED_MEMORIES:
                label = "expired_memories"
            elif line.retention_class in configured:
                label = line.retention_class
            else:
                label = "default"
            due[label] = due.get(label, 0) + line.due
            oldest = max(oldest, line.oldest_overdue_seconds)
        self._metrics.retention(due, oldest)
