"""Keeps the cache fresh: a memory that changed invalidates every cache entry holding it or
its subject, so a cached recall never outlives the record it was built from."""

from __future__ import annotations

from typing import cast

import faust

from projections.cache.store import RedisCache
from topics.messages import header_pairs
from topics.outputs import MemoryRecord
from topics.registry import entity_of_message


def add_cache_freshness_agent(app: faust.App, topic_name: str, cache: RedisCache) -> None:
    topic = app.topic(topic_name, key_type=bytes, value_type=bytes, allow_empty=True)

    async def refresh(stream: faust.StreamT[bytes]) -> None:
        async for batch in stream.noack_take(500, within=0.1):  # type: ignore[attr-defined]
            for event in cast(list[faust.EventT[bytes]], batch):
                message = event.message
                tenant_id, memory_id = entity_of_message(message.key, header_pairs(message.headers))
                subject = None
                if message.value:
                    record = MemoryRecord.model_validate_json(message.value)
                    subject = (record.subject.type, record.subject.id)
                await cache.invalidate(tenant_id, subject=subject, memory_ids=[memory_id])
                await stream.ack(event)

    app.agent(topic, name="cache-freshness")(refresh)
