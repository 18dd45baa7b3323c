"""Batches from a faust stream, and the one way every agent is registered on a faust app."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import cast

import faust

from streams.loop import Batch, BatchLimits, BatchLoop
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


class FaustStreamSource:
    """Takes batches from a faust stream without acknowledging them; ``ack`` does, once the
    loop has applied them (faust then commits those offsets to Kafka)."""

    def __init__(self, stream: faust.StreamT[bytes], limits: BatchLimits) -> None:
        self._stream = stream
        self._limits = limits

    async def batches(self) -> AsyncIterator[Batch]:
        taking = self._stream.noack_take(  # type: ignore[attr-defined]
            self._limits.max_events, within=self._limits.max_wait_seconds
        )
        try:
            async for taken in taking:
                # noack_take yields events, not values (faust's annotation says otherwise).
                events = cast(Events, taken)
                yield Batch(to_input(events), events)
        finally:
            # Closing noack_take turns faust's automatic acknowledgement back on, and the
            # stream goes on taking messages in the background: they would be acknowledged
            # (committed) unapplied, and lost. A loop that stops taking batches (a drained
            # one, at shutdown) must leave its messages unacknowledged, to be redelivered.
            # No other task runs between the close and the reset (nothing here waits).
            await taking.aclose()
            self._stream.enable_acks = False

    async def ack(self, batch: Batch) -> None:
        for event in cast(Events, batch.token):
            await self._stream.ack(event)


def add_batch_agent(
    app: faust.App, agent_name: str, topic_names: Sequence[str], loop: BatchLoop
) -> None:
    """Registers ``loop`` as the agent ``agent_name`` on ``topic_names``."""
    topic = app.topic(*topic_names, key_type=bytes, value_type=bytes, allow_empty=True)

    async def run(stream: faust.StreamT[bytes]) -> None:
        # Nothing may be awaited before the stream is iterated: faust subscribes the topic
        # when iteration starts, and a late subscription waits 45 s for a resubscribe.
        await loop.run(FaustStreamSource(stream, loop.limits))

    app.agent(topic, name=agent_name)(run)
