"""The projection runner without services: an in-memory database whose transactions and
savepoints roll back, a fake projection, tracking store and publisher. What it proves: the
order commit -> publish -> delete outbox -> acknowledge, isolation of failing messages inside
one transaction, the breaker, concurrent claims, redelivery and the bounded outbox drain."""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import orjson
import psycopg
import pytest
from prometheus_client import CollectorRegistry

from projections.bookkeeping import ConcurrentClaim
from projections.idempotency import EventKey, ProcessedEvent
from projections.outbox import OutboxMessage
from projections.rejections import RejectionRow
from streams.failures import SystemicFailure
from streams.isolation import CircuitBreaker, Isolation
from streams.metrics import Metrics
from streams.runner import ProjectionRunner
from support.deadletters import memory_dead_letters
from support.fakes import Publisher, Source, Stops, loop_for
from topics.codec import InvalidMessage
from topics.messages import InputMessage
from topics.outputs import DeadLetterReason, Rejection
from topics.registry import MEMORY_EVENTS, MEMORY_REJECTIONS, TopicNames

NOW = datetime(2026, 9, 1, 12, tzinfo=UTC)
TOPIC = "t.memory.events"


class Database:
    """State that transactions snapshot on entry and restore when they fail (a savepoint is
    a nested transaction, as in psycopg)."""

    def __init__(self, log: list[str]) -> None:
        self.state: dict[str, Any] = {"offsets": {}, "seen": {}, "outbox": {}, "rows": {}}
        self.log = log
        self.depth = 0
        self.next_id = 1

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        snapshot = copy.deepcopy(self.state)
        self.depth += 1
        try:
            yield
        except BaseException:
            self.state = snapshot
            raise
        finally:
            self.depth -= 1
        if self.depth == 0:
            self.log.append("commit")


class Pool:
    def __init__(self, db: Database) -> None:
        self.db = db

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Database]:
        yield self.db


class Tracking:
    def __init__(self, claim_conflicts: int = 0) -> None:
        self.claim_conflicts = claim_conflicts

    async def lock_offsets(
        self, conn: Database, projection: str, positions: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], int]:
        return {p: conn.state["offsets"].get(p, 0) for p in positions}

    async def save_offsets(
        self, conn: Database, projection: str, next_offsets: Mapping[tuple[str, int], int]
    ) -> None:
        for position, offset in next_offsets.items():
            conn.state["offsets"][position] = max(conn.state["offsets"].get(position, 0), offset)

    async def load_seen(
        self, conn: Database, projection: str, keys: Iterable[EventKey]
    ) -> dict[EventKey, bytes]:
        return {k: conn.state["seen"][k] for k in keys if k in conn.state["seen"]}

    async def claim_processed(
        self, conn: Database, projection: str, processed: Sequence[ProcessedEvent]
    ) -> None:
        if processed and self.claim_conflicts:
            self.claim_conflicts -= 1
            raise ConcurrentClaim("another worker claimed these events")
        for event in processed:
            conn.state["seen"][(event.tenant_id, event.event_id)] = event.body_hash

    async def record_rejections(
        self, conn: Database, projection: str, rows: Sequence[RejectionRow]
    ) -> None:
        return None

    async def add_to_outbox(
        self, conn: Database, producer: str, messages: Sequence[OutboxMessage]
    ) -> uuid.UUID | None:
        if not messages:
            return None
        batch = uuid.uuid4()
        for message in messages:
            conn.state["outbox"][conn.next_id] = (batch, message)
            conn.next_id += 1
        return batch

    async def pending_outbox(
        self, conn: Database, producer: str, limit: int = 10_000, max_bytes: int = 1 << 30
    ) -> list[tuple[int, OutboxMessage]]:
        pending: list[tuple[int, OutboxMessage]] = []
        size = 0
        for outbox_id, (_, message) in sorted(conn.state["outbox"].items())[:limit]:
            size += len(message.value or b"")
            if pending and size > max_bytes:
                break
            pending.append((outbox_id, message))
        return pending

    async def remove_outbox_batch(self, conn: Database, batch_id: uuid.UUID | None) -> None:
        conn.log.append("remove outbox")
        conn.state["outbox"] = {
            i: (b, m) for i, (b, m) in conn.state["outbox"].items() if b != batch_id
        }

    async def remove_from_outbox(self, conn: Database, ids: Sequence[int]) -> None:
        for outbox_id in ids:
            del conn.state["outbox"][outbox_id]

    async def publish_outbox_batch(
        self,
        conn: Database,
        batch_id: uuid.UUID | None,
        messages: Sequence[OutboxMessage],
        publish: Callable[[Sequence[OutboxMessage]], Awaitable[None]],
    ) -> None:
        # The row locks are PostgreSQL's (tests/streams/test_compaction.py): here, the order.
        await publish(messages)
        await self.remove_outbox_batch(conn, batch_id)

    async def publish_pending_outbox(
        self,
        conn: Database,
        producer: str,
        publish: Callable[[Sequence[OutboxMessage]], Awaitable[None]],
        max_bytes: int = 1 << 30,
    ) -> int:
        pending = await self.pending_outbox(conn, producer, max_bytes=max_bytes)
        if pending:
            await publish([message for _, message in pending])
            await self.remove_from_outbox(conn, [i for i, _ in pending])
        return len(pending)


@dataclass(frozen=True)
class Event:
    tenant_id: str
    event_id: str
    entity_id: str
    fail: str | None
    event_type: str = "test.event"
    occurred_at: datetime = NOW


@dataclass
class Outcome:
    events: list[Event]
    processed: list[ProcessedEvent] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    redelivered: int = 0
    shredded: int = 0

    def applied_event_types(self) -> list[str]:
        return [e.event_type for e in self.events]


class Codec:
    def decode(self, key: bytes | None, value: bytes | None, topic: str | None = None) -> Event:
        body = orjson.loads(value or b"null")
        if body is None:
            raise InvalidMessage(DeadLetterReason.EMPTY_VALUE, "no value")
        if body.get("fail") == "decode":
            raise RecursionError("a bug the decoder hits")
        return Event("acme", body["id"], body["id"], body.get("fail"))


class FakeProjection:
    """Writes one row per event; an event says at which stage it fails, and how."""

    name = "fake"
    input_specs = (MEMORY_EVENTS,)
    rejections_spec = MEMORY_REJECTIONS
    tracks_event_ids = True
    locks_late = False
    codec = Codec()

    def __init__(self, error: type[Exception] = ValueError) -> None:
        self.error = error
        self.committed_outcomes: list[Outcome] = []

    async def prepare_decode(self, conn: Database, messages: Sequence[InputMessage]) -> None:
        return None

    async def load(self, conn: Database, events: Sequence[Event]) -> None:
        return None

    async def lock(self, conn: Database, events: Sequence[Event], state: None) -> None:
        return state

    def reduce(self, events: Sequence[Event], state: None, seen: dict[EventKey, bytes]) -> Outcome:
        fresh = [e for e in events if (e.tenant_id, e.event_id) not in seen]
        if any(e.fail == "reduce" for e in fresh):
            raise self.error("a bug the reducer hits")
        return Outcome(
            fresh,
            [ProcessedEvent(e.tenant_id, e.event_id, b"h") for e in fresh],
            redelivered=len(events) - len(fresh),
        )

    async def save(self, conn: Database, outcome: Outcome) -> None:
        for event in outcome.events:
            if event.fail == "save":
                raise self.error("the store refuses this event")
            conn.state["rows"][event.event_id] = True

    def outputs(self, outcome: Outcome) -> list[OutboxMessage]:
        return [OutboxMessage("t.out", e.event_id.encode(), b"out") for e in outcome.events]

    def committed(self, outcome: Outcome) -> None:
        self.committed_outcomes.append(outcome)


def message(offset: int, fail: str | None = None) -> InputMessage:
    value = orjson.dumps({"id": f"e{offset}", "fail": fail})
    return InputMessage(TOPIC, 0, offset, f"acme:e{offset}".encode(), value, ())


@dataclass
class Rig:
    log: list[str] = field(default_factory=list)
    error: type[Exception] = ValueError
    claim_conflicts: int = 0

    def __post_init__(self) -> None:
        self.db = Database(self.log)
        self.publisher = Publisher(log=self.log)
        self.projection = FakeProjection(self.error)
        self.runner: ProjectionRunner[Any, Any, Any] = ProjectionRunner(
            self.projection,  # type: ignore[arg-type]
            cast(Any, Pool(self.db)),
            self.publisher,
            TopicNames("t."),
            Metrics(CollectorRegistry()),
            max_backoff_seconds=0.01,
            tracking=cast(Any, Tracking(self.claim_conflicts)),
        )

    def run(self, *batches: list[InputMessage]) -> tuple[Source, Stops]:
        source, stops = Source(list(batches), log=self.log), Stops()
        loop = loop_for(self.runner, stops)
        try:
            asyncio.run(loop.run(source))
        except Exception as exc:
            assert stops.stopped == [exc]
        return source, stops

    def dead_letters(self) -> list[dict[str, Any]]:
        return [orjson.loads(m.value or b"") for m in self.publisher.on(".dlq")]

    @property
    def rows(self) -> set[str]:
        return set(self.db.state["rows"])

    @property
    def offset(self) -> int:
        return int(self.db.state["offsets"].get((TOPIC, 0), 0))


def test_commit_then_publish_then_remove_the_outbox_then_acknowledge() -> None:
    rig = Rig()
    _, stops = rig.run([message(0), message(1)])
    assert rig.log == ["commit", "publish 2", "remove outbox", "ack [0, 1]"]
    assert rig.db.state["outbox"] == {} and rig.offset == 2 and stops.stopped == []


@pytest.mark.parametrize("stage", ["reduce", "save"])
def test_a_failing_message_is_isolated_and_the_rest_applied_in_one_commit(stage: str) -> None:
    rig = Rig()
    batch = [message(i, stage if i == 3 else None) for i in range(7)]
    source, stops = rig.run(batch)
    assert rig.rows == {f"e{i}" for i in range(7) if i != 3}
    (letter,) = rig.dead_letters()
    assert letter["offset"] == 3 and letter["error_code"] == "processing_failed"
    expected_stage = "reduce" if stage == "reduce" else "write"
    assert letter["error"].startswith(f"{expected_stage}: ValueError")
    assert rig.log.count("commit") == 1 and rig.offset == 7
    assert source.acked == list(range(7)) and stops.stopped == []


def test_a_decoder_bug_is_a_dead_letter_of_that_message_alone() -> None:
    rig = Rig()
    rig.run([message(0), message(1, "decode"), message(2)])
    assert rig.rows == {"e0", "e2"}
    (letter,) = rig.dead_letters()
    assert letter["error"].startswith("decode: RecursionError")


def test_what_postgresql_cannot_hold_is_unstorable() -> None:
    rig = Rig(error=psycopg.errors.CharacterNotInRepertoire)
    rig.run([message(0), message(1, "save")])
    assert [letter["error_code"] for letter in rig.dead_letters()] == ["unstorable"]
    assert rig.rows == {"e0"}


def test_the_breaker_stops_the_worker_when_most_of_a_batch_fails_the_same_way() -> None:
    rig = Rig()
    source, stops = rig.run([message(i, "save" if i % 4 else None) for i in range(12)])
    assert len(stops.stopped) == 1 and isinstance(stops.stopped[0], SystemicFailure)
    assert "write: ValueError" in str(stops.stopped[0])
    # Nothing of the batch is committed, published or acknowledged.
    assert rig.rows == set() and rig.offset == 0 and rig.publisher.published == []
    assert source.acked == []


def test_an_environment_fault_stops_the_worker_without_isolating() -> None:
    rig = Rig(error=psycopg.errors.UndefinedTable)
    source, stops = rig.run([message(0, "save")])
    assert [type(e) for e in stops.stopped] == [psycopg.errors.UndefinedTable]
    assert rig.dead_letters() == [] and source.acked == []


def test_a_concurrent_claim_retries_the_whole_batch() -> None:
    rig = Rig(claim_conflicts=2)
    source, stops = rig.run([message(0), message(1)])
    assert rig.rows == {"e0", "e1"} and rig.log.count("commit") == 1
    assert source.acked == [0, 1] and stops.stopped == []


def test_a_redelivered_batch_is_skipped_by_the_tracked_offsets() -> None:
    rig = Rig()
    rig.run([message(0), message(1)], [message(0), message(1), message(2)])
    assert [len(o.events) for o in rig.projection.committed_outcomes] == [2, 1]
    assert len(rig.publisher.on("t.out")) == 3


def test_invalid_messages_are_dead_letters_and_do_not_count_for_the_breaker() -> None:
    rig = Rig()
    empty = [InputMessage(TOPIC, 0, i, b"acme:x", b"null", ()) for i in range(10)]
    source, stops = rig.run(empty)
    assert [letter["error_code"] for letter in rig.dead_letters()] == ["empty_value"] * 10
    assert stops.stopped == [] and source.acked == list(range(10))


def test_the_outbox_drain_publishes_a_bounded_number_of_bytes_at_a_time() -> None:
    rig = Rig()
    for i in range(5):
        rig.db.state["outbox"][i + 1] = (uuid.uuid4(), OutboxMessage("t.out", None, b"x" * 100))
    rig.runner._drain_max_bytes = 250
    assert asyncio.run(rig.runner.drain_outbox()) == 5
    assert rig.log == ["publish 2", "publish 2", "publish 1"]
    assert rig.db.state["outbox"] == {}


def test_isolation_is_judged_before_anything_is_dead_lettered() -> None:
    breaker = CircuitBreaker("fake", ratio=0.5, min_failures=2, window=4)
    isolation = Isolation(breaker, Metrics(CollectorRegistry()), memory_dead_letters())
    with pytest.raises(SystemicFailure):
        isolation.judge(2, [(message(0), _failure()), (message(1), _failure())])


def _failure() -> Any:
    from streams.isolation import Failure

    return Failure(DeadLetterReason.PROCESSING_FAILED, "write", "ValueError", "x")
