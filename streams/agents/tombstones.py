"""The handler that makes a derived store honour tombstones.

For every tombstone meant for its store: remove the items, check they are unreachable, then
publish ``deletion.acknowledged``; the batch loop acknowledges the tombstones' offsets only
after that. A transient failure (the store unreachable, items still reachable) publishes a
``failed`` acknowledgement (the ledger records it) and is retried with backoff until it
passes; a crash anywhere redelivers the tombstone, and removing twice is harmless. A failure
that is about the tombstone itself (a bug it hits) publishes a ``failed`` acknowledgement and
dead-letters it: the ledger keeps the deletion pending, redelivers it and reports it overdue,
and the tombstones after it are honoured meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial

from pydantic import ValidationError

from projections.bookkeeping import OutboxMessage
from projections.stores import STORE_NAMES
from projections.stores.base import DerivedStore
from streams.failures import FailureKind, classify, retry_transient
from streams.isolation import Isolation, stage
from streams.metrics import Metrics
from streams.runner import Publisher
from topics.codec import InvalidMessage, encode
from topics.deletion import Acknowledgement, AckStatus, Tombstone
from topics.messages import InputMessage
from topics.outputs import DeadLetterReason
from topics.registry import DELETION_ACKS, TopicNames, entity_key

log = logging.getLogger(__name__)

# A tombstone that names a store memproj does not have was not written by its ledger.
KNOWN = frozenset(STORE_NAMES)


class StillReachable(RuntimeError):
    pass


class TombstoneHandler:
    def __init__(
        self,
        store: DerivedStore,
        publisher: Publisher,
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

    @property
    def name(self) -> str:
        return f"{self.store.name}-tombstones"

    async def apply(self, messages: Sequence[InputMessage], isolation: Isolation) -> None:
        """Honour every tombstone in order; dead letters are published before the batch is
        acknowledged."""
        dead = await isolation.each(messages, self.handle, "erase")
        await isolation.dead_letters.keep(dead)  # a letter's key is durable before the letter
        await self._publish(f"{self.store.name}: {len(dead)} dead letters", dead)

    async def handle(self, message: InputMessage) -> None:
        with stage("decode"):
            tombstone = self._decode(message)
        if not tombstone.is_for(self.store.name):
            return
        attempt = 0
        while True:
            attempt += 1
            try:
                with stage("erase"):
                    erased = await self.store.erase(tombstone)
                if erased.reachable:
                    raise StillReachable(f"still reachable: {', '.join(erased.reachable[:5])}")
            except Exception as exc:
                await self._acknowledge(tombstone, "failed", 0, attempt, str(exc)[:500])
                if not (isinstance(exc, StillReachable) or classify(exc) is FailureKind.TRANSIENT):
                    raise  # about this tombstone: isolated; the ledger redelivers it later
                delay = min(self._max_backoff, 0.2 * 2**attempt)
                log.warning(
                    "%s: tombstone %s failed (%s); retry in %.1fs",
                    self.store.name,
                    tombstone.deletion_id,
                    exc,
                    delay,
                )
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
        # items already, and an escape would redo the erasure of the whole batch.
        await self._publish(
            f"{self.store.name}: {status} ack of {tombstone.deletion_id}",
            [OutboxMessage(self._acks_topic, key, encode(ack))],
        )

    async def _publish(self, what: str, messages: list[OutboxMessage]) -> None:
        if messages:
            await retry_transient(
                what, partial(self._publisher.publish, messages), self._max_backoff
            )

    @staticmethod
    def _decode(message: InputMessage) -> Tombstone:
        try:
            tombstone = Tombstone.model_validate_json(message.value or b"")
        except ValidationError as exc:
            raise InvalidMessage(DeadLetterReason.INVALID_EVENT, str(exc)[:500]) from exc
        if message.key != entity_key(tombstone.tenant_id, tombstone.deletion_id).encode():
            raise InvalidMessage(DeadLetterReason.KEY_MISMATCH, "key does not match the tombstone")
        unknown = sorted({*tombstone.required_stores, *(tombstone.for_stores or ())} - KNOWN)
        if unknown:
            raise InvalidMessage(DeadLetterReason.INVALID_EVENT, f"unknown stores {unknown}")
        return tombstone
