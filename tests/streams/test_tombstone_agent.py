"""The tombstone handler's failure handling: acknowledgements and dead letters survive a
failed publish, a tombstone that hits a bug is dead-lettered with a failed ack while the rest
are honoured, and an environment fault stops the worker. Pure: fake store, publisher, source."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import orjson
import psycopg
import pytest
from prometheus_client import CollectorRegistry

from projections.stores.base import Erased
from streams.agents.tombstones import TombstoneHandler
from streams.metrics import Metrics
from support.fakes import Publisher, Source, Stops, loop_for
from topics.deletion import DeletionTarget, Tombstone, TombstoneItem
from topics.messages import InputMessage
from topics.registry import DELETION_TOMBSTONES, TopicNames, entity_key

NOW = datetime(2026, 9, 1, 12, tzinfo=UTC)
TOPICS = TopicNames("t.")
TOMBSTONES = TOPICS.name(DELETION_TOMBSTONES)


def tombstone_message(deletion_id: str, offset: int = 0) -> InputMessage:
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
    return InputMessage(TOMBSTONES, 0, offset, key, tombstone.model_dump_json().encode(), ())


@dataclass
class Store:
    failures: int = 0
    failure: type[Exception] = psycopg.OperationalError
    broken: set[str] = field(default_factory=set)
    erased: list[str] = field(default_factory=list)
    name: str = "cache"

    async def erase(self, tombstone: Tombstone) -> Erased:
        self.erased.append(tombstone.deletion_id)
        if tombstone.deletion_id in self.broken:
            raise KeyError("a bug this tombstone hits")
        if self.failures:
            self.failures -= 1
            raise self.failure("store down")
        return Erased(removed=1, reachable=[])


def acks(publisher: Publisher) -> list[tuple[str, str]]:
    return [
        (body["deletion_id"], body["status"])
        for m in publisher.on("deletion.acks")
        for body in [orjson.loads(m.value or b"")]
    ]


def handler(store: Store, publisher: Publisher) -> TombstoneHandler:
    return TombstoneHandler(
        store,  # type: ignore[arg-type]
        publisher,
        TOPICS,
        Metrics(CollectorRegistry()),
        clock=lambda: NOW,
        max_backoff_seconds=0.01,
    )


def run(
    store: Store, publisher: Publisher, batches: list[list[InputMessage]]
) -> tuple[Source, Stops]:
    source, stops = Source(batches), Stops()
    loop = loop_for(handler(store, publisher), stops)
    try:
        asyncio.run(loop.run(source))
    except Exception as exc:
        assert stops.stopped == [exc]
    return source, stops


def test_a_failed_publish_of_the_done_ack_is_retried_without_erasing_again() -> None:
    store, publisher = Store(), Publisher(failing={0})
    run(store, publisher, [[tombstone_message("d1")]])
    assert acks(publisher) == [("d1", "done")]
    assert store.erased == ["d1"]


def test_a_transient_store_failure_is_acked_as_failed_and_retried() -> None:
    store, publisher = Store(failures=1), Publisher(failing={0})
    source, _ = run(store, publisher, [[tombstone_message("d1")]])
    assert acks(publisher) == [("d1", "failed"), ("d1", "done")]
    assert source.acked == [0]


def test_a_failed_publish_of_a_dead_letter_is_retried() -> None:
    store, publisher = Store(), Publisher(failing={0})
    bad = InputMessage(TOMBSTONES, 0, 0, b"acme:d1", b"not a tombstone", ())
    source, stops = run(store, publisher, [[bad]])
    assert [m.topic for m in publisher.published] == [TOMBSTONES + ".dlq"]
    assert store.erased == []
    assert source.acked == [0] and stops.stopped == []


def test_every_tombstone_of_a_batch_is_handled_and_acked_despite_a_failed_publish() -> None:
    store, publisher = Store(), Publisher(failing={0})
    source, stops = run(store, publisher, [[tombstone_message(f"d{i}", i) for i in range(3)]])
    assert acks(publisher) == [("d0", "done"), ("d1", "done"), ("d2", "done")]
    assert source.acked == [0, 1, 2]
    assert stops.stopped == []


def test_a_tombstone_that_hits_a_bug_is_dead_lettered_and_the_rest_honoured() -> None:
    store, publisher = Store(broken={"d1"}), Publisher()
    source, stops = run(store, publisher, [[tombstone_message(f"d{i}", i) for i in range(3)]])
    # The ledger learns of the failure (and redelivers later); the others are done.
    assert acks(publisher) == [("d0", "done"), ("d1", "failed"), ("d2", "done")]
    (letter,) = publisher.on(".dlq")
    body = orjson.loads(letter.value or b"")
    assert body["error_code"] == "processing_failed"
    assert body["error"].startswith("erase: KeyError")
    assert source.acked == [0, 1, 2] and stops.stopped == []


def test_an_environment_fault_stops_the_worker_and_leaves_the_tombstone_unacknowledged() -> None:
    store = Store(failures=1, failure=psycopg.errors.UndefinedTable)
    publisher = Publisher()
    source, stops = run(store, publisher, [[tombstone_message("d1")]])
    assert [type(exc) for exc in stops.stopped] == [psycopg.errors.UndefinedTable]
    assert source.acked == []
    assert publisher.on(".dlq") == []


def test_the_breaker_stops_the_worker_when_every_tombstone_fails_the_same_way() -> None:
    store, publisher = Store(broken={f"d{i}" for i in range(10)}), Publisher()
    source, stops = run(store, publisher, [[tombstone_message(f"d{i}", i) for i in range(10)]])
    assert len(stops.stopped) == 1 and "circuit breaker" in str(stops.stopped[0])
    assert source.acked == [] and publisher.on(".dlq") == []


def test_tombstones_for_other_stores_are_acknowledged_untouched() -> None:
    store, publisher = Store(name="embeddings"), Publisher()
    source, _ = run(store, publisher, [[tombstone_message("d1")]])
    assert store.erased == [] and source.acked == [0]
    assert pytest.approx(0) == len(publisher.published)
