"""``DeliveringProducer``: awaited deliveries against the real broker."""

from __future__ import annotations

import asyncio

import pytest

from streams.kafka import DeliveringProducer, PublishFailed
from support.environment import Env
from topics.registry import DELETION_REQUESTS, MESSAGE_MAX_BYTES

pytestmark = pytest.mark.integration


def test_each_delivery_is_awaited_and_a_refused_message_raises(env: Env) -> None:
    producer = DeliveringProducer(env.settings.kafka)
    topic = env.topic(DELETION_REQUESTS)

    async def deliver() -> None:
        await asyncio.gather(
            *(producer.deliver(topic, f"k{i}".encode(), f"v{i}".encode()) for i in range(20))
        )
        with pytest.raises(PublishFailed):
            await producer.deliver(topic, b"big", b"x" * (MESSAGE_MAX_BYTES + 1))

    try:
        asyncio.run(deliver())
    finally:
        producer.close()
    delivered = {message.value for message in env.read_messages(DELETION_REQUESTS)}
    assert delivered == {f"v{i}".encode() for i in range(20)}
