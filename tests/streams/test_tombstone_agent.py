"""The tombstone agent's failure handling: acknowledgements and dead letters survive a failed
publish, and anything else stops the worker. Pure: fake store, publisher, stream and app."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import orjson
import pytest
from prometheus_client import CollectorRegistry

from projections.bookkeeping import OutboxMessage
from projections.deletion.derived import Erased
from streams.agents.tombstones import TombstoneHandler, honour_tombstones
from streams.kafka import KafkaPublisher, PublishFailed
from streams.metrics import Metrics
from topics.deletion import DeletionTarget, Tombstone, TombstoneItem
from topics.registry import DELETION_TOMBSTONES, TopicNames, entity_key

NOW = datetime(2026, 9, 1, 12, tzinfo=UTC)
TOPICS = TopicNames("t.")
TOMBSTONES = TOPICS.name(DELETION_TOMBSTONES)


@dataclass
class Message:
    key: bytes | None
    value: bytes | None
    topic: str = TOMBSTONES
    partition: int = 0
    offset: int = 0


@dataclass
class Event:
    message: Message


def tombstone_message(deletion_id: str, offset: int = 0) -> Message:
    tombstone = Tombstone(
        deletion_id=deletion_id,
        tenant_id="acme",
        kind="erasure",
        target=DeletionTarget(type="memory", id="m1"),
        items=(TombstoneItem(type="memory", id="m1"),),
        issued_at=NOW,
        cut_off=NOW,
        deadline_at=NOW + timedelta(hours=1),
        required_stores=("cache",),
    )
    key = entity_key("acme", deletion_id).encode()
    return Message(key, tombstone.model_dump_json().encode(), offset=offset)


@dataclass
class Store:
    failures: int = 0
    erased: list[str] = field(default_factory=list)
    name: str = "cache"

    async def erase(self, tombstone: Tombstone) -> Erased:
        self.erased.append(tombstone.deletion_id)
        if self.failures:
            self.failures -= 1
            raise RuntimeError("store down")
        return Erased(removed=1, reachable=[])


@dataclass
class Publisher:
    """Fails the publishes whose (0-based) numbers are in ``failing``."""

    failing: set[int] = field(default_factory=set)
    calls: int = 0
    published: list[OutboxMessage] = field(default_factory=list)

    async def publish(self, messages: list[OutboxMessage]) -> None:
        number, self.calls = self.calls, self.calls + 1
        if number in self.failing:
            raise PublishFailed("broker unavailable")
        self.published.extend(messages)

    def acks(self) -> list[tuple[str, str]]:
        return [
            (body["deletion_id"], body["status"])
            for m in self.published
            if m.topic.endswith("deletion.acks")
            for body in [orjson.loads(m.value or b"")]
        ]


def handler(store: Store, publisher: Publisher) -> TombstoneHandler:
    return TombstoneHandler(
        store,  # type: ignore[arg-type]
        cast(KafkaPublisher, publisher),
        TOPICS,
        Metrics(CollectorRegistry()),
        clock=lambda: NOW,
        max_backoff_seconds=0.01,
    )


def test_a_failed_publish_of_the_done_ack_is_retried_without_erasing_again() -> None:
    store, publisher = Store(), Publisher(failing={0})
    asyncio.run(handler(store, publisher).handle(tombstone_message("d1")))  # type: ignore[arg-type]
    assert publisher.acks() == [("d1", "done")]
    assert store.erased == ["d1"]


def test_a_failed_publish_of_the_failed_ack_is_retried() -> None:
    store, publisher = Store(failures=1), Publisher(failing={0})
    asyncio.run(handler(store, publisher).handle(tombstone_message("d1")))  # type: ignore[arg-type]
    assert publisher.acks() == [("d1", "failed"), ("d1", "done")]


def test_a_failed_publish_of_a_dead_letter_is_retried() -> None:
    store, publisher = Store(), Publisher(failing={0})
    bad = Message(b"acme:d1", b"not a tombstone")
    asyncio.run(handler(store, publisher).handle(bad))  # type: ignore[arg-type]
    assert [m.topic for m in publisher.published] == [TOMBSTONES + ".dlq"]
    assert store.erased == []


class Stream:
    def __init__(self, batches: list[list[Event]]) -> None:
        self._batches = batches
        self.acked: list[int] = []

    async def noack_take(self, size: int, within: float) -> AsyncIterator[list[Event]]:
        for batch in self._batches:
            yield batch

    async def ack(self, event: Event) -> None:
        self.acked.append(event.message.offset)


class App:
    def __init__(self) -> None:
        self.crashed: list[BaseException] = []

    async def crash(self, exc: BaseException) -> None:
        self.crashed.append(exc)


def test_every_tombstone_of_a_batch_is_handled_and_acked_despite_a_failed_publish() -> None:
    store, publisher, app = Store(), Publisher(failing={0}), App()
    stream = Stream([[Event(tombstone_message(f"d{i}", offset=i)) for i in range(3)]])
    asyncio.run(honour_tombstones(app, stream, handler(store, publisher)))  # type: ignore[arg-type]
    assert publisher.acks() == [("d0", "done"), ("d1", "done"), ("d2", "done")]
    assert stream.acked == [0, 1, 2]
    assert app.crashed == []


def test_a_bug_stops_the_worker_and_leaves_the_tombstone_unacknowledged() -> None:
    class Broken(TombstoneHandler):
        async def handle(self, message: Any) -> None:
            raise KeyError("bug")

    app = App()
    stream = Stream([[Event(tombstone_message("d1"))]])
    broken = Broken(
        Store(),  # type: ignore[arg-type]
        cast(KafkaPublisher, Publisher()),
        TOPICS,
        Metrics(CollectorRegistry()),
    )
    with pytest.raises(KeyError):
        asyncio.run(honour_tombstones(app, stream, broken))  # type: ignore[arg-type]
    assert [type(exc) for exc in app.crashed] == [KeyError]
    assert stream.acked == []
