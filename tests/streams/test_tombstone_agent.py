"""The tombstone handler's batches and failure handling: a batch is erased in one
``erase_many`` and acknowledged in one publish, acknowledgements and dead letters survive a
failed publish, a tombstone that hits a bug is dead-lettered with a failed ack while the rest
are honoured, and an environment fault stops the worker. Pure: fake store, publisher, source
(the stores' own batches: tests/projections/test_vector_store.py, test_cache_store.py,
test_table_stores.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from prometheus_client import CollectorRegistry

from projections.embeddings.lance import LanceVectorStore
from projections.sealing.crypto import new_data_key
from projections.sealing.probes import ProbeSealer
from projections.stores.base import DerivedStore, Erased
from projections.stores.embeddings import EmbeddingsStore
from projections.stores.tables import SummariesStore
from streams.agents.tombstones import TombstoneHandler
from streams.metrics import Metrics
from streams.services import make_pool
from support.fakes import Publisher, Source, Stops, loop_for
from support.vector_entries import EMBEDDER, memory
from topics.deletion import DeletionTarget, Tombstone, TombstoneItem
from topics.messages import InputMessage
from topics.registry import DELETION_TOMBSTONES, TopicNames, output_key

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
    return message_of(tombstone, offset)


def message_of(tombstone: Tombstone, offset: int) -> InputMessage:
    key = output_key(tombstone.tenant_id, tombstone.deletion_id).encode()
    return InputMessage(TOMBSTONES, 0, offset, key, tombstone.model_dump_json().encode(), ())


@dataclass
class Store:
    failures: int = 0
    failure: type[Exception] = psycopg.OperationalError
    broken: set[str] = field(default_factory=set)
    # How many more erasures of a tombstone still find its items.
    unverified: dict[str, int] = field(default_factory=dict)
    erased: list[str] = field(default_factory=list)
    batches: list[list[str]] = field(default_factory=list)
    name: str = "cache"

    async def erase(self, tombstone: Tombstone) -> Erased:
        self.erased.append(tombstone.deletion_id)
        if tombstone.deletion_id in self.broken:
            raise KeyError("a bug this tombstone hits")
        if self.failures:
            self.failures -= 1
            raise self.failure("store down")
        if self.unverified.get(tombstone.deletion_id):
            self.unverified[tombstone.deletion_id] -= 1
            return Erased(removed=1, reachable=[f"item of {tombstone.deletion_id}"])
        return Erased(removed=1, reachable=[])

    async def erase_many(self, tombstones: Sequence[Tombstone]) -> list[Erased]:
        self.batches.append([tombstone.deletion_id for tombstone in tombstones])
        return [await self.erase(tombstone) for tombstone in tombstones]


def acks(publisher: Publisher) -> list[tuple[str, str]]:
    return [
        (body["deletion_id"], body["status"])
        for m in publisher.on("deletion.acks")
        for body in [orjson.loads(m.value or b"")]
    ]


def handler(store: Store | DerivedStore, publisher: Publisher) -> TombstoneHandler:
    return TombstoneHandler(
        store,  # type: ignore[arg-type]
        publisher,
        TOPICS,
        Metrics(CollectorRegistry()),
        clock=lambda: NOW,
        max_backoff_seconds=0.01,
    )


def run(
    store: Store | DerivedStore, publisher: Publisher, batches: list[list[InputMessage]]
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


def test_a_batch_is_erased_at_once_and_acknowledged_in_one_publish() -> None:
    store, log = Store(), list[str]()
    publisher = Publisher(log=log)
    source, stops = run(store, publisher, [[tombstone_message(f"d{i}", i) for i in range(3)]])
    assert store.batches == [["d0", "d1", "d2"]]
    assert log == ["publish 3"]
    assert acks(publisher) == [("d0", "done"), ("d1", "done"), ("d2", "done")]
    assert source.acked == [0, 1, 2] and stops.stopped == []


def test_a_transient_failure_of_a_batch_retries_the_batch_and_acks_each_done_once() -> None:
    store, publisher = Store(failures=1), Publisher()
    source, _ = run(store, publisher, [[tombstone_message(f"d{i}", i) for i in range(3)]])
    assert store.batches == [["d0", "d1", "d2"], ["d0", "d1", "d2"]]
    failed, done = acks(publisher)[:3], acks(publisher)[3:]
    assert failed == [("d0", "failed"), ("d1", "failed"), ("d2", "failed")]
    assert done == [("d0", "done"), ("d1", "done"), ("d2", "done")]
    assert source.acked == [0, 1, 2]


def test_only_the_tombstones_still_reachable_are_erased_again() -> None:
    store, publisher = Store(unverified={"d1": 2}), Publisher()
    source, _ = run(store, publisher, [[tombstone_message(f"d{i}", i) for i in range(3)]])
    assert store.batches == [["d0", "d1", "d2"], ["d1"], ["d1"]]
    assert acks(publisher) == [
        ("d1", "failed"),
        ("d1", "failed"),
        ("d0", "done"),
        ("d2", "done"),
        ("d1", "done"),
    ]
    (retried,) = [
        body
        for m in publisher.on("deletion.acks")
        for body in [orjson.loads(m.value or b"")]
        if body["deletion_id"] == "d1" and body["status"] == "done"
    ]
    assert retried["attempt"] == 3
    assert source.acked == [0, 1, 2]


def test_a_poison_tombstone_in_a_batch_is_dead_lettered_alone_and_the_others_done_once() -> None:
    store, publisher = Store(broken={"d2"}), Publisher()
    invalid = InputMessage(TOMBSTONES, 0, 4, b"acme:d4", b"not a tombstone", ())
    batch = [tombstone_message(f"d{i}", i) for i in range(4)] + [invalid]
    source, stops = run(store, publisher, [batch])
    # The batch failed on d2; then one at a time: only d2 fails (twice: alone, it is its own).
    assert store.batches[0] == ["d0", "d1", "d2", "d3"]
    assert store.batches[1:] == [["d0"], ["d1"], ["d2"], ["d3"]]
    assert acks(publisher) == [("d0", "done"), ("d1", "done"), ("d2", "failed"), ("d3", "done")]
    letters = [orjson.loads(m.value or b"") for m in publisher.on(".dlq")]
    assert sorted(letter["offset"] for letter in letters) == [2, 4]
    assert source.acked == [0, 1, 2, 3, 4] and stops.stopped == []


def test_an_invalid_message_beside_a_batch_is_dead_lettered_and_the_batch_erased_at_once() -> None:
    store, publisher = Store(), Publisher()
    invalid = InputMessage(TOMBSTONES, 0, 1, b"acme:d1", b"not a tombstone", ())
    batch = [tombstone_message("d0", 0), invalid, tombstone_message("d2", 2)]
    source, stops = run(store, publisher, [batch])
    assert store.batches == [["d0", "d2"]]
    assert acks(publisher) == [("d0", "done"), ("d2", "done")]
    (letter,) = [orjson.loads(m.value or b"") for m in publisher.on(".dlq")]
    assert letter["offset"] == 1 and letter["error_code"] == "invalid_event"
    assert source.acked == [0, 1, 2] and stops.stopped == []


# -- against the real stores ------------------------------------------------------------------


class CountingPurges(LanceVectorStore):
    purges = 0

    def purge_history(self) -> None:
        self.purges += 1
        super().purge_history()


def subject_erasure(deletion_id: str, subject_id: str, store: str) -> Tombstone:
    return Tombstone(
        deletion_id=deletion_id,
        tenant_id="acme",
        kind="erasure",
        target=DeletionTarget(type="subject", subject_type="user", id=subject_id),
        items=(TombstoneItem(type="memory", id=f"{subject_id}-0"),),
        issued_at=NOW,
        cut_off=NOW,
        deadline_at=NOW + timedelta(hours=1),
        required_stores=(store,),
    )


def test_a_batch_of_erasures_of_several_subjects_takes_one_purge_of_the_vectors(
    tmp_path: Path,
) -> None:
    vectors = CountingPurges(tmp_path / "vectors", dim=EMBEDDER.dim, model=EMBEDDER.name)
    subjects = ["alice", "bob", "carol"]
    for name in [*subjects, "dave"]:  # one upsert each: old versions to purge
        vectors.upsert(
            [memory(f"{name}-{n}", f"{name} fact {n}", "acme", ("user", name)) for n in range(2)]
        )
    store = EmbeddingsStore(vectors, asyncio.Lock(), ProbeSealer(new_data_key()))
    log: list[str] = []
    publisher = Publisher(log=log)
    batch = [
        message_of(subject_erasure(f"d-{name}", name, "embeddings"), n)
        for n, name in enumerate(subjects)
    ]

    source, stops = run(store, publisher, [batch])

    assert acks(publisher) == [(f"d-{name}", "done") for name in subjects]
    assert [orjson.loads(m.value or b"")["removed_count"] for m in publisher.published] == [2] * 3
    assert log == ["publish 3"] and vectors.purges == 1
    assert {entry.subject_id for entry in vectors.entries("acme")} == {"dave"}
    assert vectors.history_versions() == 0
    assert source.acked == [0, 1, 2] and stops.stopped == []


@pytest.mark.integration
def test_a_poison_tombstone_among_good_ones_is_dead_lettered_and_the_others_done(
    env: Any,
) -> None:
    with env.connect() as conn:
        for conversation in ("c0", "c2", "c3"):
            conn.execute(
                "INSERT INTO conversation_summaries VALUES"
                " ('acme', %s, 1, 'a summary', '{}', %s, 'e1', '[]', 'user', 'alice')",
                (conversation, NOW - timedelta(days=1)),
            )
    tombstones = [
        Tombstone(
            deletion_id=f"d{n}",
            tenant_id="acme",
            kind="erasure",
            target=DeletionTarget(type="conversation", id=conversation),
            items=(TombstoneItem(type="conversation", id=conversation),),
            issued_at=NOW,
            cut_off=NOW,
            deadline_at=NOW + timedelta(hours=1),
            required_stores=("summaries",),
        )
        # PostgreSQL text holds no NUL: d1 fails whatever is retried, a poison pill.
        for n, conversation in enumerate(["c0", "c\x00", "c2"])
    ]
    publisher, stops = Publisher(), Stops()
    source = Source([[message_of(tombstone, n) for n, tombstone in enumerate(tombstones)]])

    async def main() -> None:
        async with make_pool(env.settings.postgres_dsn, 1) as pool:
            await loop_for(handler(SummariesStore(pool), publisher), stops).run(source)

    asyncio.run(main())

    assert acks(publisher) == [("d0", "done"), ("d1", "failed"), ("d2", "done")]
    (letter,) = [orjson.loads(m.value or b"") for m in publisher.on(".dlq")]
    assert letter["offset"] == 1 and letter["error_code"] == "unstorable"
    with env.connect() as conn:
        rows = conn.execute("SELECT conversation_id FROM conversation_summaries").fetchall()
    assert rows == [("c3",)]
    assert source.acked == [0, 1, 2] and stops.stopped == []
