"""The handler that makes a derived store honour tombstones, a batch at a time.

The batch's tombstones for its store are erased in one ``erase_many`` (one purge of the
vector store's old versions for them all, not one each), checked unreachable, then their
``deletion.acknowledged`` published in one publish; the batch loop acknowledges the
tombstones' offsets only after that. A transient failure (the store unreachable, items still
reachable) publishes a ``failed`` acknowledgement (the ledger records it) and is retried with
backoff until it passes; a crash anywhere redelivers the tombstones, and removing twice is
harmless. A failure that is about a tombstone itself (a bug it hits) makes the batch be
honoured one tombstone at a time, so that only that one publishes a ``failed``
acknowledgement and is dead-lettered: the ledger keeps its deletion pending, redelivers it
and reports it overdue, and the others are honoured meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from functools import partial

from pydantic import ValidationError

from projections.deadletters.sealing import Position
from projections.outbox import OutboxMessage
from projections.stores import STORES, StoreRegistry
from projections.stores.base import DerivedStore, Erased
from streams.failures import FailureKind, classify, loggable, retry_transient
from streams.isolation import Isolation, position, raise_refused, stage
from streams.metrics import Metrics
from streams.runner import Publisher
from topics.codec import InvalidMessage, encode
from topics.deletion import Acknowledgement, AckStatus, Tombstone
from topics.messages import InputMessage
from topics.outputs import DeadLetterReason
from topics.registry import DELETION_ACKS, TopicNames, is_key_of, output_key

log = logging.getLogger(__name__)


def _still_reachable(erased: Erased) -> str:
    """The error of a ``failed`` acknowledgement for items a store still holds."""
    return f"still reachable: {', '.join(erased.reachable[:5])}"[:500]


class TombstoneHandler:
    def __init__(
        self,
        store: DerivedStore,
        publisher: Publisher,
        topics: TopicNames,
        metrics: Metrics,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        max_backoff_seconds: float = 30.0,
        stores: StoreRegistry = STORES,
    ) -> None:
        self.store = store
        # A tombstone that names a store memproj does not have was not written by its ledger.
        self._known = frozenset(stores.names)
        self._publisher = publisher
        self._acks_topic = topics.name(DELETION_ACKS)
        self._metrics = metrics
        self._clock = clock
        self._max_backoff = max_backoff_seconds

    @property
    def name(self) -> str:
        return f"{self.store.name}-tombstones"

    async def apply(self, messages: Sequence[InputMessage], isolation: Isolation) -> None:
        """Honour the batch's tombstones together, or one at a time when that fails because
        of one of them; dead letters are published before the batch is acknowledged."""
        ours, refused = self._sort(messages)
        # The batch honoured, only the messages refused are left to isolation.
        handle: Callable[[InputMessage], Awaitable[None]] = partial(raise_refused, refused)
        try:
            await self._honour(ours, alone=False)
        except Exception as exc:
            if classify(exc) is not FailureKind.MESSAGE:
                raise
            log.warning(
                "%s: a batch of %d tombstones failed (%s); honouring them one at a time",
                self.store.name,
                len(ours),
                loggable(exc),
            )
            handle = self.handle
        dead = await isolation.each(messages, handle, "erase")
        await isolation.dead_letters.keep(dead)  # a letter's key is durable before the letter
        await self._publish(f"{self.store.name}: {len(dead)} dead letters", dead)

    async def handle(self, message: InputMessage) -> None:
        """Honour one tombstone on its own."""
        with stage("decode"):
            tombstone = self._decode(message)
        if tombstone.is_for(self.store.name):
            with stage("erase"):
                await self._honour([tombstone], alone=True)

    def _sort(
        self, messages: Sequence[InputMessage]
    ) -> tuple[list[Tombstone], dict[Position, Exception]]:
        """The tombstones for this store, in order, and what refused the messages that do
        not decode (left to isolation, which dead-letters them)."""
        ours: list[Tombstone] = []
        refused: dict[Position, Exception] = {}
        for message in messages:
            try:
                tombstone = self._decode(message)
            except Exception as exc:
                refused[position(message)] = exc
                continue
            if tombstone.is_for(self.store.name):
                ours.append(tombstone)
        return ours, refused

    async def _honour(self, tombstones: Sequence[Tombstone], alone: bool) -> None:
        """Erase the tombstones and verify them, retrying the unverified ones and transient
        failures with backoff, then publish every ``done`` acknowledgement in one publish.

        A failure about a tombstone is raised, and acknowledged ``failed`` only when
        ``alone`` (one tombstone honoured on its own): in a batch it is not known whose it
        is. An environment fault is acknowledged ``failed`` and raised: the worker stops.
        """
        pending = list(tombstones)
        done: list[tuple[Tombstone, Erased, int]] = []
        attempt = 0
        while pending:
            attempt += 1
            try:
                erased = await self.store.erase_many(pending)
                if len(erased) != len(pending):
                    raise RuntimeError(f"{len(erased)} results of {len(pending)} tombstones")
            except Exception as exc:
                kind = classify(exc)
                if kind is not FailureKind.MESSAGE or alone:
                    # The ack is published and kept in the ledger: no text that may quote.
                    await self._acknowledge(
                        [self._ack(t, "failed", 0, attempt, loggable(exc)[:500]) for t in pending]
                    )
                if kind is not FailureKind.TRANSIENT:
                    raise
                await self._back_off(attempt, pending, loggable(exc))
                continue
            unverified = [(t, e) for t, e in zip(pending, erased, strict=True) if e.reachable]
            done += [
                (t, e, attempt) for t, e in zip(pending, erased, strict=True) if not e.reachable
            ]
            if unverified:
                await self._acknowledge(
                    [self._ack(t, "failed", 0, attempt, _still_reachable(e)) for t, e in unverified]
                )
                await self._back_off(attempt, [t for t, _ in unverified], "still reachable")
            pending = [t for t, _ in unverified]
        await self._acknowledge([self._ack(t, "done", e.removed, n, None) for t, e, n in done])
        for _, erased_one, _ in done:
            self._metrics.tombstone_applied(self.store.name, erased_one.removed)

    async def _back_off(self, attempt: int, tombstones: Sequence[Tombstone], why: str) -> None:
        delay = min(self._max_backoff, 0.2 * 2**attempt)
        log.warning(
            "%s: %d tombstones failed (%s), first %s; retry in %.1fs",
            self.store.name,
            len(tombstones),
            why,
            tombstones[0].deletion_id,
            delay,
        )
        await asyncio.sleep(delay)

    def _ack(
        self,
        tombstone: Tombstone,
        status: AckStatus,
        removed: int,
        attempt: int,
        error: str | None,
    ) -> OutboxMessage:
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
        key = output_key(tombstone.tenant_id, tombstone.deletion_id).encode()
        return OutboxMessage(self._acks_topic, key, encode(ack))

    async def _acknowledge(self, acks: list[OutboxMessage]) -> None:
        # Published and flushed before the tombstones' offsets move: an ack is never lost.
        # A failed publish is retried here, not left to escape: the store has removed the
        # items already, and an escape would redo the erasure of the whole batch.
        await self._publish(f"{self.store.name}: {len(acks)} acks", acks)

    async def _publish(self, what: str, messages: list[OutboxMessage]) -> None:
        if messages:
            await retry_transient(
                what, partial(self._publisher.publish, messages), self._max_backoff
            )

    def _decode(self, message: InputMessage) -> Tombstone:
        try:
            tombstone = Tombstone.model_validate_json(message.value or b"")
        except ValidationError as exc:
            raise InvalidMessage(DeadLetterReason.INVALID_EVENT, str(exc)[:500]) from exc
        if not is_key_of(message.key, tombstone.tenant_id, tombstone.deletion_id):
            raise InvalidMessage(DeadLetterReason.KEY_MISMATCH, "key does not match the tombstone")
        unknown = sorted({*tombstone.required_stores, *(tombstone.for_stores or ())} - self._known)
        if unknown:
            raise InvalidMessage(DeadLetterReason.INVALID_EVENT, f"unknown stores {unknown}")
        return tombstone
