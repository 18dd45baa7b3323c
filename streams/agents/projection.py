"""The agent that feeds a projection runner from its input topic."""

from __future__ import annotations

from typing import Any, cast

import faust

from streams.runner import InputMessage, ProjectionRunner


def add_projection_agent(
    app: faust.App,
    topic_name: str,
    runner: ProjectionRunner[Any, Any, Any],
    batch_max_events: int,
    batch_max_wait_seconds: float,
) -> None:
    topic = app.topic(topic_name, key_type=bytes, value_type=bytes, allow_empty=True)

    async def project(stream: faust.StreamT[bytes]) -> None:
        await runner.drain_outbox()
        # noack_take leaves acknowledgement to us: offsets move only after ``runner.apply``
        # has committed the batch and published its outputs.
        async for batch in stream.noack_take(  # type: ignore[attr-defined]
            batch_max_events, within=batch_max_wait_seconds
        ):
            # noack_take yields events, not values (faust's annotation says otherwise).
            events = cast(list[faust.EventT[bytes]], batch)
            await runner.apply(
                [
                    InputMessage(
                        event.message.topic,
                        event.message.partition,
                        event.message.offset,
                        event.message.key,
                        event.message.value,
                    )
                    for event in events
                ]
            )
            for event in events:
                await stream.ack(event)

    app.agent(topic, name=f"{runner.projection.name}-projection")(project)
