"""The agent that makes a derived store honour tombstones.

For every tombstone meant for its store: remove the items, check they are unreachable, then
publish ``deletion.acknowledged`` and only after that acknowledge the tombstone's offset.
A failure publishes a ``failed`` acknowledgement (the ledger records it) and is retried with
backoff until it succeeds; a crash anywhere redelivers the tombstone, and removing twice is
harmless. Publishing an acknowledgement or a dead letter is retried like any transient
failure; anything else that escapes stops the worker (as the projection agents do), rather
than letting faust restart the agent and carry on without it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import cast

import faust
from pydantic import ValidationError

from projections.bookkeeping import OutboxMessage
from projections.deletion.derived import DerivedStore
from streams.failures import retry_transient
from streams.kafka import KafkaPublisher
from streams.metrics import Metrics
from topics.codec import encode
from topics.deletion import Acknowledgement, AckStatus, Tombstone
from topics.outputs import DeadLetter, DeadLetterReason
from topics.registry import DELETION_ACKS, DLQ_SUFFIX, TopicNames, entity_key

log = logging.getLogger(__name__)


class StillReachable(RuntimeError):
    pass


class TombstoneHandler:
    def __init__(
        self,
        store: DerivedStore,
        publisher: KafkaPublisher,
        topics: TopicNames,
        metrics: Metrics,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        max_backoff_seconds: float = 30.0,
    ) -> None:
        self.store = store
        self._publisher = publisher
        self._acks_topic = topics.name(DELETION_ACKS)
        self._metrics = metrics
        self._clock = clock
        self._max_backoff = max_backoff_seconds

    async def handle(self, message: faust.types.tuples.Message) -> None:
        tombstone = await self._decode(message)
        if tombstone is None or not tombstone.is_for(self.store.name):
            return
        attempt = 0
        while True:
            attempt += 1
            try:
                erased = await self.store.erase(tombstone)
                if erased.reachable:
                    raise StillReachable(f"still reachable: {', '.join(erased.reachable[:5])}")
            except Exception as exc:
                delay = min(self._max_backoff, 0.2 * 2**attempt)
                log.warning(
                    "%s: tombstone %s failed (%s); retry in %.1fs",
                    self.store.name,
                    tombstone.deletion_id,
                    exc,
                    delay,
                )
                await self._acknowledge(tombstone, "failed", 0, attempt, str(exc)[:500])
                await asyncio.sleep(delay)
                continue
            await self._acknowledge(tombstone, "done", erased.removed, attempt, None)
            self._metrics.tombstone_applied(self.store.name, erased.removed)
            return

    async def _acknowledge(
        self,
        tombstone: Tombstone,
        status: AckStatus,
        removed: int,
        attempt: int,
        error: str | None,
    ) -> None:
        ack = Acknowledgement(
            deletion_id=tombstone.deletion_id,
            tenant_id=tombstone.tenant_id,
            store=self.store.name,
            status=status,
            removed_count=removed,
            acked_at=self._clock(),
            error=error,
            attempt=attempt,
        )
        key = entity_key(tombstone.tenant_id, tombstone.deletion_id).encode()
        # Published and flushed before the tombstone's offset moves: an ack is never lost.
        # A failed publish is retried here, not left to escape: the store has removed the
        # items already, and an escape would leave the rest of the batch unhandled.
        await self._publish(
            f"{self.store.name}: {status} ack of {tombstone.deletion_id}",
            [OutboxMessage(self._acks_topic, key, encode(ack))],
        )

    async def _publish(self, what: str, messages: list[OutboxMessage]) -> None:
        await retry_transient(what, partial(self._publisher.publish, messages), self._max_backoff)

    async def _decode(self, message: faust.types.tuples.Message) -> Tombstone | None:
        try:
            tombstone = Tombstone.model_validate_json(message.value or b"")
            valid_key = (
                message.key == entity_key(tombstone.tenant_id, tombstone.deletion_id).encode()
            )
            if valid_key:
                return tombstone
            error, code = "key does not match the tombstone", DeadLetterReason.KEY_MISMATCH
        except ValidationError as exc:
            error, code = str(exc)[:500], DeadLetterReason.INVALID_EVENT
        letter = DeadLetter.of(
            message.value,
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            error=error,
            error_code=code,
            key=message.key,
            failed_at=self._clock(),
        )
        await self._publish(
            f"{self.store.name}: dead letter of {message.topic}@{message.offset}",
            [OutboxMessage(message.topic + DLQ_SUFFIX, message.key, encode(letter))],
        )
        self._metrics.dead_lettered(message.topic, code.value)
        return None


async def honour_tombstones(
    app: faust.App, stream: faust.StreamT[bytes], handler: TombstoneHandler
) -> None:
    """Handle every tombstone in order, acknowledging each after its store is done with it."""
    try:
        async for batch in stream.noack_take(100, within=0.1):  # type: ignore[attr-defined]
            for event in cast(list[faust.EventT[bytes]], batch):
                await handler.handle(event.message)
                await stream.ack(event)
    except Exception as exc:
        # Store failures and transient publish failures are retried inside the handler; what
        # arrives here is a bug or a broken environment. Faust would restart the agent and
        # carry on without it, leaving the rest of the batch unhandled until the deadline, so
        # stop the whole worker instead: the tombstone was not acknowledged, nothing is lost,
        # and the exit is visible to whatever supervises the process.
        await app.crash(exc)
        raise


def add_tombstone_agent(app: faust.App, topic_name: str, handler: TombstoneHandler) -> None:
    topic = app.topic(topic_name, key_type=bytes, value_type=bytes, allow_empty=True)

    async def honour(stream: faust.StreamT[bytes]) -> None:
        await honour_tombstones(app, stream, handler)

    app.agent(topic, name=f"{handler.store.name}-tombstones")(honour)
