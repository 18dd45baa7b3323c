"""Keeps the cache fresh: a memory that changed invalidates every cache entry holding it or
its subject, so a cached recall never outlives the record it was built from."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError

from projections.cache.store import RedisCache
from streams.isolation import Isolation, stage
from streams.runner import Publisher
from topics.codec import InvalidMessage
from topics.messages import InputMessage
from topics.outputs import DeadLetterReason, MemoryRecord
from topics.registry import entity_of_message


class CacheFreshness:
    name = "cache-freshness"

    def __init__(self, cache: RedisCache, publisher: Publisher) -> None:
        self._cache = cache
        self._publisher = publisher

    async def apply(self, messages: Sequence[InputMessage], isolation: Isolation) -> None:
        """Invalidate what each change of ``memory.current`` makes stale (twice is harmless)."""
        dead = await isolation.each(messages, self._refresh)
        await isolation.dead_letters.keep(dead)  # a letter's key is durable before the letter
        await self._publisher.publish(dead)

    async def _refresh(self, message: InputMessage) -> None:
        with stage("decode"):
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
        with stage("invalidate"):
            await self._cache.invalidate(tenant_id, subject=subject, memory_ids=[memory_id])
