"""Hostile input on every topic memproj consumes, against the real workers.

The rule under test: a failure that one message causes is that message's dead letter; only a
failure that is not about a message stops the worker. ``support.hostile`` makes a realistic
valid stream with thousands of hostile messages shuffled in (and forgeries on memproj's own
topics); every worker that consumes those topics runs on it. Then:

1. every worker is still running, and its log holds no crash;
2. every valid event was applied: the projections of the valid tenants are, by checksum, those
   of a twin environment fed only the valid events;
3. every hostile message has exactly one dead letter per worker that consumes it (matched by
   topic, partition and offset, or by event id for what was sealed), with a reason;
   one that may be legal has one or none, and then its projection decided it; no valid event
   and nothing memproj wrote itself has one.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from confluent_kafka import KafkaError, Message, Producer

from projections import shadow
from projections.deletion import lifecycle as ledger
from projections.memory import store
from streams.kafka import producer_config
from streams.progress import end_offsets, wait_caught_up
from streams.settings import Settings
from streams.worker import CONSUMING_KINDS
from support.deadletters import open_views
from support.environment import Env, isolated_env, stop_all
from support.hostile.corpus import corpus
from support.hostile.plan import (
    CONSUMERS,
    EDGE_TENANT,
    SPECS,
    VALID_TENANTS,
    Corpus,
    Expect,
    Planned,
)
from support.hostile.small_corpora import bursts, oversized_letters
from topics.outputs import ORIGINAL_MAX_BYTES, DeadLetter
from topics.registry import (
    CONVERSATION_EVENTS,
    CONVERSATION_MESSAGES,
    CONVERSATION_SEALED,
    DELETION_ACKS,
    DELETION_REQUESTS,
    DELETION_TOMBSTONES,
    MEMORY_CURRENT,
    MEMORY_EVENTS,
    MEMORY_SEALED,
    TopicSpec,
)

pytestmark = pytest.mark.integration

# Every worker that consumes a topic the suite writes to (not the monitor).
# The twin runs them all too: the summaries and context stores erase their own rows of the
# conversation tables compared.
TWIN_KINDS = CONSUMING_KINDS
# The derived stores' consumer groups and the topics each consumes.
GROUP_TOPICS: dict[str, tuple[TopicSpec, ...]] = {
    "embeddings": (MEMORY_CURRENT, CONVERSATION_MESSAGES, DELETION_TOMBSTONES),
    "cache": (MEMORY_CURRENT, DELETION_TOMBSTONES),
    "summaries": (DELETION_TOMBSTONES,),
    "context": (DELETION_TOMBSTONES,),
}
CRASH_MARKERS = ("stopping the worker", "Traceback", "SystemicFailure", "circuit breaker tripped")
MAIN_SECONDS = 240.0
TWIN_SECONDS = 150.0


@dataclass(frozen=True, slots=True)
class Produced:
    planned: Planned
    topic: str
    partition: int
    offset: int


@dataclass
class Problems:
    """Everything found wrong, reported together at the end (one run shows every bug)."""

    found: list[str] = field(default_factory=list)

    def add(self, what: str) -> None:
        self.found.append(what)

    def group(self, title: str, lines: Sequence[str], limit: int = 12) -> None:
        if lines:
            shown = "\n    ".join(lines[:limit])
            more = f"\n    ... and {len(lines) - limit} more" if len(lines) > limit else ""
            self.add(f"{title} ({len(lines)}):\n    {shown}{more}")


# -- environments ----------------------------------------------------------------------------


@pytest.fixture
def twin(stack: Settings, tmp_path: Path) -> Iterator[Env]:
    """A second isolated slice of the stack (topics, groups, schema), for the valid stream
    alone."""
    (tmp_path / "twin").mkdir()
    with isolated_env(stack, tmp_path / "twin") as twin_env:
        yield twin_env


def logs(env: Any, lines: int = 30) -> str:
    return "\n".join(f"--- {w.log_path.name}\n{w.log_tail(lines)}" for w in env.workers)


def produce(env: Any, phase: dict[str, list[Planned]]) -> list[Produced]:
    """Produce a phase, topic by topic in order; where each message landed, from the
    delivery reports."""
    producer = Producer(producer_config(env.settings.kafka_bootstrap, **{"linger.ms": 20}))
    produced: list[Produced] = []
    failures: list[str] = []

    def reporter(planned: Planned) -> Callable[[KafkaError | None, Message], None]:
        def report(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                failures.append(f"{planned.kind}: {error}")
            else:
                topic, partition, offset = message.topic(), message.partition(), message.offset()
                assert topic is not None and partition is not None and offset is not None
                produced.append(Produced(planned, topic, partition, offset))

        return report

    for topic, messages in phase.items():
        name = env.settings.topics.name(SPECS[topic])
        for planned in messages:
            while True:
                try:
                    producer.produce(
                        name,
                        planned.value,
                        planned.key,
                        headers=list(planned.headers) or None,
                        on_delivery=reporter(planned),
                    )
                    break
                except BufferError:
                    producer.poll(0.1)
            producer.poll(0)
    assert producer.flush(120) == 0, "the producer did not deliver everything"
    assert not failures, f"the broker refused messages the suite meant to deliver: {failures}"
    return produced


class OutOfTime(Exception):
    pass


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise OutOfTime
        return left


# What each worker applies: a projection's progress is its tracked offsets, a derived store's
# its consumer group's commits.
PROJECTIONS = frozenset({"memory", "conversation", "deletion"})
PROGRESS: tuple[tuple[str, TopicSpec], ...] = (
    ("memory", MEMORY_EVENTS),
    ("conversation", CONVERSATION_EVENTS),
    ("memory", MEMORY_SEALED),
    ("conversation", CONVERSATION_SEALED),
    ("deletion", DELETION_REQUESTS),
    ("deletion", DELETION_ACKS),
    *((kind, spec) for kind, specs in GROUP_TOPICS.items() for spec in specs),
)


def caught_up(env: Any, kind: str, spec: TopicSpec, seconds: float) -> None:
    """Whether ``kind`` has applied ``spec``'s topic up to its end as of now; AssertionError
    when not within ``seconds``."""
    if kind not in PROJECTIONS:
        env.wait_group_committed(env.settings.group_id(kind), spec, seconds=seconds)
        return

    async def wait() -> None:
        async with await psycopg.AsyncConnection.connect(env.settings.postgres_dsn) as conn:
            await wait_caught_up(conn, env.settings.kafka_bootstrap, kind, env.topic(spec), seconds)

    try:
        asyncio.run(wait())
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None


def stopped(worker: Any) -> bool:
    """Exited, or said it stops (a worker whose stop hangs consumes nothing either)."""
    if not worker.alive():
        return True
    return "stopping the worker" in worker.log_path.read_text(errors="replace")


def settle(env: Any, deadline: Deadline, tolerate_exits: bool = False) -> None:
    """Wait until every running worker has applied everything of its topics and nothing new
    arrived meanwhile (the projections' outputs feed the derived stores and the ledger):
    readiness checks only, in short waits between which the workers are checked, all bounded
    by ``deadline``. A worker that exited fails the wait, unless ``tolerate_exits``."""
    bootstrap = env.settings.kafka_bootstrap
    watched = sorted({spec.base_name: spec for _, spec in PROGRESS}.values(), key=str)

    def ends() -> dict[str, dict[int, int]]:
        return {spec.base_name: end_offsets(bootstrap, env.topic(spec)) for spec in watched}

    last = "nothing yet"
    while True:
        exited = [w for w in env.workers if stopped(w)]
        if exited and not tolerate_exits:
            raise AssertionError(
                f"worker {exited[0].log_path.name} stopped:\n{_crash_excerpt(exited[0])}"
            )
        running = {w.kind for w in env.workers if not stopped(w)}
        try:
            before = ends()
            for kind, spec in PROGRESS:
                if kind in running:
                    caught_up(env, kind, spec, min(5.0, deadline.left()))
            if ends() == before:
                return
        except OutOfTime:
            raise AssertionError(f"the workers did not settle ({last})\n{logs(env)}") from None
        except AssertionError as exc:
            last = str(exc).splitlines()[0]


def start(env: Any, kinds: Sequence[str]) -> None:
    """``kinds``, and the readers of the sealed logs: the memory and conversation workers seal
    their raw topics, and the projection of the sealed log (what a rebuild reads)
    runs beside them in the same schema, in consumer groups of its own, so that the forgeries
    on the sealed topics meet a reader. What the sealing workers applied is a redelivery to it
    (same event ids, same bodies)."""
    env.start(*kinds)
    for kind in ("memory", "conversation"):
        if kind in kinds:
            env.worker(
                kind,
                projection_source="sealed",
                group_prefix=f"{env.settings.group_prefix}-sealed",
            )


def run(env: Any, plan: Corpus, kinds: Sequence[str], seconds: float) -> list[Produced]:
    """Start the workers, then produce each phase once the one before is applied."""
    deadline = Deadline(seconds)
    start(env, kinds)
    produced: list[Produced] = []
    for phase in plan.phases:
        produced += produce(env, phase)
        settle(env, deadline)
    for tenant, deletion_id in plan.deletions:

        def completed(tenant: str = tenant, deletion_id: str = deletion_id) -> bool:
            found = env.run(lambda conn: ledger.request_detail(conn, tenant, deletion_id))
            return found is not None and found["status"] == "completed"

        env.wait_until(completed, f"deletion {deletion_id} to complete", deadline.left())
    settle(env, deadline)
    return produced


# -- dead letters ----------------------------------------------------------------------------

_EVENT_ID = re.compile(rb'"event_id":("(?:[^"\\]|\\.)*")')


def _event_id_in(original: bytes) -> str | None:
    found = _EVENT_ID.search(original)
    if found is None:
        return None
    try:
        event_id = orjson.loads(found.group(1))
    except orjson.JSONDecodeError:
        return None
    return event_id if isinstance(event_id, str) else None


@dataclass
class Letters:
    """Every dead letter of the test, matched to what was produced."""

    per_message: Counter[int] = field(default_factory=Counter)  # id(Produced) -> letters
    unmatched: list[str] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)
    codes: Counter[str] = field(default_factory=Counter)
    # The errors of the messages that failed in processing (a bug they hit, not a reason
    # the codec gave), or that PostgreSQL or Kafka could not hold.
    failures: Counter[str] = field(default_factory=Counter)
    total: int = 0
    # Letters of the sealed log whose owner was erased: they no longer open, so they cannot
    # be matched to a message by the event id inside.
    erased_unmatched: int = 0


def read_letters(env: Any, produced: Sequence[Produced]) -> Letters:
    at = {(p.topic, p.partition, p.offset): p for p in produced}
    # What was sealed reaches the sealed log's readers with its event id: a dead letter of
    # the sealed log that no forgery accounts for is one of those.
    by_event_id: dict[tuple[str, str], list[Produced]] = {}
    for p in produced:
        sealed = {
            MEMORY_EVENTS.base_name: MEMORY_SEALED,
            CONVERSATION_EVENTS.base_name: CONVERSATION_SEALED,
        }.get(p.planned.spec.base_name)
        if sealed is not None and p.planned.event_id is not None:
            by_event_id.setdefault((sealed.base_name, p.planned.event_id), []).append(p)
    letters = Letters()
    for base_name in CONSUMERS:
        parsed: list[tuple[int, DeadLetter]] = []
        for message in env.read_messages(SPECS[base_name], ".dlq"):
            letters.total += 1
            try:
                parsed.append(
                    (message.offset, DeadLetter.model_validate_json(message.value or b""))
                )
            except ValueError as exc:
                letters.malformed.append(f"{base_name}.dlq@{message.offset}: {exc}"[:300])
        views = open_views(env, [letter for _, letter in parsed])
        for (dlq_offset, letter), view in zip(parsed, views, strict=True):
            where = f"{base_name}.dlq@{dlq_offset}"
            letters.codes[f"{base_name}: {letter.error_code.value}"] += 1
            source = at.get((letter.topic, letter.partition, letter.offset))
            if view.opened is None:
                # An erased letter (the suite erases some of what it produced) still says
                # where its message was; any other that does not open is wrong.
                if view.state != "erased":
                    letters.malformed.append(f"{where}: does not open ({view.state})")
                elif source is not None:
                    letters.per_message[id(source)] += 1
                else:
                    letters.erased_unmatched += 1
                continue
            if letter.error_code.value in ("processing_failed", "unstorable"):
                # The detail is under the seal: the published error names no content.
                error = re.sub(r"\d+", "N", view.opened.detail[:110])
                letters.failures[f"{base_name}: {letter.error_code.value}: {error}"] += 1
            original = view.opened.value
            if not letter.error:
                letters.malformed.append(f"{where}: no error")
            if source is not None:
                expected = (source.planned.value or b"")[:ORIGINAL_MAX_BYTES]
                if original != expected or letter.original_size != len(source.planned.value or b""):
                    letters.malformed.append(
                        f"{where}: the original is not the message"
                        f" at {letter.partition}/{letter.offset} ({source.planned.kind})"
                    )
                letters.per_message[id(source)] += 1
                continue
            event_id = _event_id_in(original)
            candidates = by_event_id.get((base_name, event_id or ""), [])
            if len(candidates) == 1:
                letters.per_message[id(candidates[0])] += 1
                continue
            letters.unmatched.append(
                f"{base_name}.dlq: {letter.topic}[{letter.partition}]@{letter.offset}"
                f" key={letter.key!r:.80} event_id={event_id!r:.60} {letter.error_code.value}:"
                f" {view.opened.detail[:300]}"
            )
    return letters


def _family(kind: str) -> str:
    """A kind without its drawn detail: ``number:memory.proposed:deep`` of
    ``number:memory.proposed:deep:b'NaN'``."""
    return ":".join(kind.split(":")[:3])


def judge_letters(
    env: Any, produced: Sequence[Produced], letters: Letters, problems: Problems
) -> dict[str, Counter[str]]:
    """Every message's dead letters against its expectation; returns what became of the
    ambiguous ones, for the report."""
    with env.connect() as conn:
        decided = {
            (row[0], row[1], row[2])
            for row in conn.execute("SELECT projection, tenant_id, event_id FROM processed_events")
        }

    def decided_by(planned: Planned) -> bool:
        return (planned.projection, planned.tenant_id, planned.event_id) in decided

    lost: dict[str, list[str]] = {}
    doubled, valid_dead, undecided = [], [], []
    fate: dict[str, Counter[str]] = {}
    for p in produced:
        count = letters.per_message[id(p)]
        planned = p.planned
        consumers = CONSUMERS[planned.spec.base_name]
        where = f"{planned.spec.base_name}[{p.partition}]@{p.offset} {planned.kind}"
        if planned.expect is Expect.VALID:
            if count:
                valid_dead.append(f"{where} key={planned.key!r:.60}")
            elif planned.projection and not decided_by(planned):
                undecided.append(f"{where} event_id={planned.event_id!r:.60} (valid)")
        elif planned.expect is Expect.DEAD:
            if count < consumers:
                what = "applied" if decided_by(planned) else "not decided"
                family = f"{planned.spec.base_name} {_family(planned.kind)} ({what})"
                lost.setdefault(family, []).append(
                    f"{where}: {count} of {consumers} dead letters; key={planned.key!r:.60}"
                    f" value={planned.value!r:.300}"
                )
            elif count > consumers:
                doubled.append(f"{where}: {count} dead letters for {consumers} consumers")
        else:
            family = planned.kind.split(":")[0]
            fate.setdefault(family, Counter())["dead letter" if count else "decided"] += 1
            if count > consumers:
                doubled.append(f"{where}: {count} dead letters for {consumers} consumers")
            elif (
                count == 0
                and planned.projection
                and planned.event_id
                and planned.tenant_id
                and not decided_by(planned)
            ):
                undecided.append(f"{where} event_id={planned.event_id!r:.60}")
    problems.group("valid events dead-lettered", valid_dead)
    problems.group(
        "hostile messages without their dead letter, by kind (applied: decided by a"
        " projection as if valid)",
        [f"{len(found)} x {family}, e.g. {found[0]}" for family, found in sorted(lost.items())],
        60,
    )
    problems.group("messages dead-lettered more than once per consumer", doubled)
    problems.group(
        "dead letters that match no message the suite produced (so of memproj's own output)",
        letters.unmatched,
        20,
    )
    problems.group("malformed dead letters", letters.malformed)
    problems.group("messages neither dead-lettered nor decided (lost)", undecided)
    return fate


# -- projections -----------------------------------------------------------------------------


def projection_checksums(env: Any) -> dict[str, Any]:
    async def compute() -> dict[str, Any]:
        async with await psycopg.AsyncConnection.connect(env.settings.postgres_dsn) as conn:
            return {
                "memory": await store.checksums(conn),
                "conversation": await shadow.checksums(conn, shadow.CONVERSATION),
            }

    return asyncio.run(compute())


def judge_projections(hostile: dict[str, Any], valid: dict[str, Any], problems: Problems) -> None:
    for name in ("memory", "conversation"):
        mine = {t: c for t, c in hostile[name].items() if t in VALID_TENANTS}
        theirs = {t: c for t, c in valid[name].items() if t in VALID_TENANTS}
        if mine != theirs:
            problems.add(
                f"the {name} projection of the valid tenants differs from the valid stream's"
                f" alone:\n    with hostile input: {mine}\n    valid stream only: {theirs}"
            )
        strangers = sorted(
            repr(t)
            for t in hostile[name]
            if t not in VALID_TENANTS and not t.startswith(EDGE_TENANT)
        )
        problems.group(f"tenants in the {name} projection that no event names", strangers)


def judge_workers(env: Any, problems: Problems) -> None:
    for worker in env.workers:
        text = worker.log_path.read_text(errors="replace")
        crashes = [marker for marker in CRASH_MARKERS if marker in text]
        if not worker.alive() or crashes:
            state = "exited" if not worker.alive() else "still running (consuming nothing?)"
            excerpt = _crash_excerpt(worker)
            problems.add(
                f"worker {worker.kind} ({worker.log_path.name}) {state}, log shows {crashes}:\n"
                f"{excerpt}"
            )


def _crash_excerpt(worker: Any, limit: int = 40) -> str:
    """The first crash in a worker's log: the line that says so and its traceback."""
    lines = worker.log_path.read_text(errors="replace").splitlines()
    marks = [i for i, line in enumerate(lines) if any(m in line for m in CRASH_MARKERS)]
    if not marks:
        return "\n".join(lines[-20:])
    excerpt = [lines[marks[0]]]
    start = next((i for i in marks if lines[i].startswith("Traceback")), None)
    if start is not None:
        for line in lines[start : start + 200]:
            excerpt.append(line)
            if line and not line.startswith((" ", "Traceback")):
                break  # the exception line ends the traceback
    if len(excerpt) > limit:
        excerpt = [*excerpt[:2], "  ...", *excerpt[-(limit - 3) :]]
    return "\n".join(excerpt)


# -- the test --------------------------------------------------------------------------------


def test_hostile_input_is_dead_lettered_and_the_valid_stream_applied(env: Any, twin: Any) -> None:
    started = time.monotonic()
    plan = corpus()
    problems = Problems()

    produced = run(env, plan, CONSUMING_KINDS, MAIN_SECONDS)
    hostile_seconds = time.monotonic() - started
    judge_workers(env, problems)
    letters = read_letters(env, produced)
    fate = judge_letters(env, produced, letters, problems)
    with_hostile = projection_checksums(env)
    stop_all(env.workers)  # the twin gets the cores

    run(twin, plan.valid_only(), TWIN_KINDS, TWIN_SECONDS)
    valid_only = projection_checksums(twin)
    judge_workers(twin, problems)
    judge_projections(with_hostile, valid_only, problems)
    applied = sum(c.versions for t, c in valid_only["memory"].items() if t in VALID_TENANTS)
    assert applied > 300, f"the valid stream applied too little to compare: {applied} versions"

    print(
        f"\nhostile input: {len(produced)} messages in {hostile_seconds:.0f}s, whole test"
        f" {time.monotonic() - started:.0f}s; {letters.total} dead letters"
        f" ({letters.erased_unmatched} erased before they could be matched)"
        f"\nper topic: {plan.counts()}\nper family: {plan.kinds()}"
        f"\ndead letters by reason: {dict(sorted(letters.codes.items()))}"
        f"\nambiguous messages: {{family: {{fate: n}}}} {fate}"
        "\nprocessing failures and unstorable messages:\n  "
        + "\n  ".join(f"{n} x {error}" for error, n in sorted(letters.failures.items()))
    )
    assert not problems.found, "\n\n".join(problems.found)


def isolated(env: Any, plan: Corpus, seconds: float = 120) -> None:
    """Run every worker on a one-phase plan, then judge: whatever exits is reported, not
    waited for."""
    problems = Problems()
    start(env, CONSUMING_KINDS)
    (phase,) = plan.phases
    produced = produce(env, phase)
    settle(env, Deadline(seconds), tolerate_exits=True)
    judge_workers(env, problems)
    judge_letters(env, produced, read_letters(env, produced), problems)
    assert not problems.found, "\n\n".join(problems.found)


def test_runs_of_one_poison_pill_are_dead_lettered_without_stopping_a_worker(env: Any) -> None:
    # Alone on its topic, a run of messages that fail the same way makes up the whole of a
    # batch: the circuit breaker must still tell them from a systemic fault.
    isolated(env, bursts())


def test_a_message_whose_dead_letter_is_larger_than_a_message_stops_no_worker(env: Any) -> None:
    # 824 KB in (a 300 KB key and a 512 KiB value): its dead letter keeps the key as the
    # message's key and the value in base64, about 1 MB, more than Kafka takes.
    isolated(env, oversized_letters())
