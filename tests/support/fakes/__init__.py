"""Fakes of the batch loop's edges for tests without services: a source of batches that
records acknowledgements, a publisher that fails on demand, and a recorder of stops."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from projections.outbox import OutboxMessage
from streams.isolation import CircuitBreaker, Isolation
from streams.kafka import PublishFailed
from streams.loop import Batch, BatchHandler, BatchLimits, BatchLoop
from streams.metrics import Metrics
from support.deadletters import memory_dead_letters
from topics.messages import InputMessage


@dataclass
class Source:
    """Hands out ``batches`` in order; ``acked`` holds the offsets acknowledged, in order."""

    batches_to_take: list[list[InputMessage]]
    acked: list[int] = field(default_factory=list)
    log: list[str] | None = None

    async def batches(self) -> AsyncIterator[Batch]:
        for messages in self.batches_to_take:
            yield Batch(messages)

    async def ack(self, batch: Batch) -> None:
        if self.log is not None:
            self.log.append(f"ack {[m.offset for m in batch.messages]}")
        self.acked.extend(m.offset for m in batch.messages)


@dataclass
class Publisher:
    """Fails the publishes whose (0-based) numbers are in ``failing``."""

    failing: set[int] = field(default_factory=set)
    calls: int = 0
    published: list[OutboxMessage] = field(default_factory=list)
    log: list[str] | None = None

    async def publish(self, messages: Sequence[OutboxMessage]) -> None:
        number, self.calls = self.calls, self.calls + 1
        if number in self.failing:
            raise PublishFailed("broker unavailable")
        if self.log is not None and messages:
            self.log.append(f"publish {len(messages)}")
        self.published.extend(messages)

    def on(self, suffix: str) -> list[OutboxMessage]:
        return [m for m in self.published if m.topic.endswith(suffix)]


@dataclass
class Stops:
    stopped: list[BaseException] = field(default_factory=list)

    async def __call__(self, exc: BaseException) -> None:
        self.stopped.append(exc)


def message(offset: int, value: bytes | None = b"{}", topic: str = "t.in") -> InputMessage:
    return InputMessage(topic, 0, offset, f"acme:m{offset}".encode(), value, ())


def loop_for(
    handler: BatchHandler,
    stops: Stops,
    max_bytes: int = 1 << 30,
    breaker: CircuitBreaker | None = None,
) -> BatchLoop:
    metrics = Metrics(CollectorRegistry())
    isolation = Isolation(breaker or CircuitBreaker(handler.name), metrics, memory_dead_letters())
    limits = BatchLimits(max_events=100, max_wait_seconds=0.01, max_bytes=max_bytes)
    return BatchLoop(handler, isolation, limits, metrics, stops, max_backoff_seconds=0.01)
