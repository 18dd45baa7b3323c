"""Keeps the cache fresh: a memory that changed invalidates every cache entry holding it or
its subject, so a cached recall never outlives the record it was built from.

A batch of ``memory.current`` is invalidated in one ``invalidate_each`` (two round trips for
the batch): at 5,000 events/s, one invalidation per message (one or two round trips each,
about 240 µs of CPU) kept the cache worker's one core busy, and its tombstones waited for that
event loop (ops/decisions/cache-erasure.md). A failure that is about one message makes the
batch be invalidated one message at a time, so that only that one is dead-lettered.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

from pydantic import ValidationError

from projections.cache.entries import Holdings
from projections.cache.port import RecallCache
from projections.deadletters.sealing import Position
from streams.failures import FailureKind, classify, loggable
from streams.isolation import Isolation, position, raise_refused, stage
from streams.runner import Publisher
from topics.codec import InvalidMessage
from topics.messages import InputMessage
from topics.outputs import DeadLetterReason, MemoryRecord
from topics.registry import entity_of_message

log = logging.getLogger(__name__)


def stale_targets(message: InputMessage) -> tuple[str, Holdings]:
    """The tenant and what a change of ``memory.current`` makes stale: the memory, and its
    subject's entries when the change carries a record (a null names only the memory)."""
    try:
        tenant_id, memory_id = entity_of_message(message.key, message.headers)
    except UnicodeDecodeError as exc:
        raise InvalidMessage(DeadLetterReason.INVALID_KEY, str(exc)) from exc
    subject = None
    if message.value:
        try:
            record = MemoryRecord.model_validate_json(message.value)
        except ValidationError as exc:
            raise InvalidMessage(DeadLetterReason.INVALID_EVENT, str(exc)[:500]) from exc
        subject = (record.subject.type, record.subject.id)
    return tenant_id, Holdings.targets(subject, (), [memory_id])


class CacheFreshness:
    name = "cache-freshness"

    def __init__(self, cache: RecallCache, publisher: Publisher) -> None:
        self._cache = cache
        self._publisher = publisher

    async def apply(self, messages: Sequence[InputMessage], isolation: Isolation) -> None:
        """Invalidate what the batch's changes make stale, in one invalidation (twice is
        harmless), or one message at a time when that fails because of one of them."""
        stale, refused = self._sort(messages)
        # The batch invalidated, only the messages refused are left to isolation.
        handle: Callable[[InputMessage], Awaitable[None]] = partial(raise_refused, refused)
        try:
            await self._cache.invalidate_each(stale)
        except Exception as exc:
            if classify(exc) is not FailureKind.MESSAGE:
                raise
            log.warning(
                "cache: invalidating a batch of %d failed (%s); one message at a time",
                len(stale),
                loggable(exc),
            )
            handle = self._refresh
        dead = await isolation.each(messages, handle)
        await isolation.dead_letters.keep(dead)  # a letter's key is durable before the letter
        await self._publisher.publish(dead)

    @staticmethod
    def _sort(
        messages: Sequence[InputMessage],
    ) -> tuple[list[tuple[str, Holdings]], dict[Position, Exception]]:
        """What each message makes stale, in order, and what refused the messages that do not
        decode (left to isolation, which dead-letters them)."""
        stale: list[tuple[str, Holdings]] = []
        refused: dict[Position, Exception] = {}
        for message in messages:
            try:
                stale.append(stale_targets(message))
            except Exception as exc:
                refused[position(message)] = exc
        return stale, refused

    async def _refresh(self, message: InputMessage) -> None:
        with stage("decode"):
            tenant_id, targets = stale_targets(message)
        with stage("invalidate"):
            await self._cache.invalidate_each([(tenant_id, targets)])
