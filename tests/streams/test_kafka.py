"""Reading a topic in batches (``streams.kafka.gather``), on a consumer that hands out what has
arrived: no service."""

from __future__ import annotations

from typing import Any, cast

import pytest

from streams import kafka
from streams.kafka import gather


class ArrivingConsumer:
    """Hands out the messages that have arrived, a slice per ``consume``, and records each ask."""

    def __init__(self, slices: list[list[str]]) -> None:
        self.slices = slices
        self.asks: list[tuple[int, float]] = []

    def consume(self, num_messages: int, timeout: float) -> list[str]:
        self.asks.append((num_messages, timeout))
        arrived = self.slices.pop(0) if self.slices else []
        assert len(arrived) <= num_messages
        return arrived


def gathered(consumer: ArrivingConsumer, count: int) -> list[Any]:
    return list(gather(cast(Any, consumer), count, 60.0, lambda: False))


def test_a_read_ends_as_soon_as_nothing_more_is_wanted() -> None:
    consumer = ArrivingConsumer([["a", "b"], ["c"], ["d"]])
    seen: list[Any] = []
    for message in gather(cast(Any, consumer), 500, 60.0, done=lambda: "c" in seen):
        seen.append(message)
    assert seen == ["a", "b", "c"]
    assert len(consumer.asks) == 2


def test_a_batch_is_filled_up_to_its_count_from_what_arrives() -> None:
    consumer = ArrivingConsumer([["a", "b"], [], ["c", "d"], ["e"]])
    assert gathered(consumer, 4) == ["a", "b", "c", "d"]
    assert [wanted for wanted, _ in consumer.asks] == [4, 2, 2]


def test_each_ask_waits_at_most_the_poll_interval() -> None:
    consumer = ArrivingConsumer([[], ["a"]])
    assert gathered(consumer, 1) == ["a"]
    assert all(timeout <= kafka.GATHER_POLL_SECONDS for _, timeout in consumer.asks)


@pytest.mark.parametrize("timeout", [0.0, -1.0])
def test_a_read_past_its_timeout_asks_for_nothing(timeout: float) -> None:
    consumer = ArrivingConsumer([["a"]])
    assert list(gather(cast(Any, consumer), 10, timeout, lambda: False)) == []
    assert consumer.asks == []
