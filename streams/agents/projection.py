"""The agent that feeds a projection runner from its input topic.

The agent only gathers batches; a writer task applies them, one at a time and in order, so
that batch N is written to PostgreSQL while faust gathers batch N + 1. Events are
acknowledged only after ``runner.apply`` has committed their batch and published its outputs;
faust then commits those offsets to Kafka.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

import faust

from streams.runner import ProjectionRunner
from topics.messages import InputMessage, header_pairs

Events = Sequence[faust.EventT[bytes]]


def to_input(events: Events) -> list[InputMessage]:
    return [
        InputMessage(
            event.message.topic,
            event.message.partition,
            event.message.offset,
            event.message.key,
            event.message.value,
            header_pairs(event.message.headers),
        )
        for event in events
    ]


def add_projection_agent(
    app: faust.App,
    topic_names: Sequence[str],
    runner: ProjectionRunner[Any, Any, Any],
    batch_max_events: int,
    batch_max_wait_seconds: float,
) -> None:
    topic = app.topic(*topic_names, key_type=bytes, value_type=bytes, allow_empty=True)

    async def project(stream: faust.StreamT[bytes]) -> None:
        # Nothing may be awaited before the stream is iterated: faust subscribes the topic
        # when iteration starts, and a late subscription waits 45 s for a resubscribe.
        pending: asyncio.Queue[Events] = asyncio.Queue(maxsize=1)

        async def apply_in_order() -> None:
            try:
                while True:
                    events = await pending.get()
                    await runner.apply(to_input(events))
                    for event in events:
                        await stream.ack(event)
            except Exception as exc:
                # Transient failures were retried inside the runner; what arrives here is a
                # bug or a broken environment. Faust would restart the agent and carry on
                # without it, so stop the whole worker instead: the batch was not
                # acknowledged, nothing is lost, and the exit is visible to whatever
                # supervises the process.
                await app.crash(exc)
                raise

        writer = asyncio.create_task(apply_in_order(), name=f"{runner.projection.name}-writer")
        try:
            async for batch in stream.noack_take(  # type: ignore[attr-defined]
                batch_max_events, within=batch_max_wait_seconds
            ):
                # noack_take yields events, not values (faust's annotation says otherwise).
                await pending.put(cast(Events, batch))
        finally:
            writer.cancel()

    app.agent(topic, name=f"{runner.projection.name}-projection")(project)
