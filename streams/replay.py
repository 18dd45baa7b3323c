"""Rebuilding a projection by replaying its topics into a shadow copy.

The replay reads the projection's input (the sealed log) with a plain confluent-kafka
consumer, from the start position up to the end offsets as of the start, and applies it with
the same codec, reducers and erasure guard as the live worker, into a shadow schema; nothing
is published. The conversation projection is applied through the live worker's runner; the
memory projection on a path of its own (``streams.rebuild``: large chunks, its state held in
memory, no outbox), by ``readers`` processes over disjoint partitions (the others started by
this one, each a fresh interpreter; a reader that fails stops the replay, and one whose replay
is killed stops at its next chunk). Live workers keep serving meanwhile. The shadow is then
compared with the live projection per tenant, and swapped in atomically when asked to (or
when they agree):

1. lock the live worker's tracking rows (its next batch waits);
2. catch the shadow up, from the end offsets its read stopped at, to what the live worker
   has applied;
3. sweep anything an erasure covers out of the shadow (deletions that happened meanwhile);
4. move the live tables to a retired schema and the shadow's in, and take over the
   projection's bookkeeping rows; commit. The live worker carries on, on the new tables.

Tracking offsets, one rule. A ``projection_offsets`` row (projection, topic, partition,
next_offset) says: the projection's tables in this schema hold every message of that
partition below ``next_offset``. Only a transaction that applies those messages to those
tables advances it: the live worker's, for the topic it reads (``streams.worker.LiveInput``:
the raw topic, which it seals and projects in one stage, or with
``MEMPROJ_PROJECTION_SOURCE=sealed`` the sealed log), and a rebuild's, in its shadow, for the
sealed log. So the catch-up's target is what the live worker applied, read from the live
worker's own rows: when it seals, the sealed log's end once its committed batches are
published (with its rows locked it commits no more); otherwise the rows themselves. The
swap keeps the rule true of the tables it swaps in: the live worker's rows stay (raised to
the shadow's where the shadow read further), and rows of any other topic are dropped (the
shadow's sealed-log rows, when the live worker seals: nothing would advance them, and a
later swap would take them for the live worker's progress).
"""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing
import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from multiprocessing.process import BaseProcess
from typing import Any, Final, Literal

import orjson
import psycopg
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry
from psycopg.conninfo import make_conninfo

from projections import rebuilds
from projections import shadow as shadows
from projections.bookkeeping import Conn, OutboxMessage, lock_offsets, pending_outbox
from projections.deadletters.keys import UnpublishedLetterKeys
from projections.deadletters.sealing import LetterSealer
from projections.deletion import audit as ghost_audit
from projections.deletion import guard as erasure_guard
from projections.embeddings.vectors import (
    SCHEMA_VERSION,
    VectorEntry,
    VectorStore,
    replay_table_name,
)
from projections.memory.projection import MemoryProjection
from projections.sealing.keys import KeyStore
from projections.stores.embeddings import covered_entries
from streams.failures import Explained, loggable
from streams.isolation import CircuitBreaker, DeadLetters, Isolation
from streams.kafka import admin_config, consumer_config, failed, gather, input_message
from streams.metrics import Metrics
from streams.rebuild import MemoryRebuild, cannot_apply
from streams.rebuild import ReplayStopped as ReplayStopped  # part of this module's interface
from streams.runner import Projection, ProjectionRunner
from streams.services import build_embedder, make_pool, open_vector_store, open_vector_tables
from streams.settings import Settings
from streams.worker import LiveInput, live_input
from topics.messages import InputMessage
from topics.registry import CONVERSATION_MESSAGES, DLQ_SUFFIX, MEMORY_CURRENT, TopicNames

Start = Literal["earliest"] | datetime | dict[int, int]
SwapMode = Literal["always", "if-equal", "never"]
Position = tuple[str, int]


def _unpublished_letters(settings: Settings) -> DeadLetters:
    """A rebuild's dead letters: built as live, never published (``DiscardingPublisher``)."""
    return DeadLetters(LetterSealer(settings.worker_master_keys()), UnpublishedLetterKeys())


class DiscardingPublisher:
    """A rebuild publishes nothing: its outputs were published when the events first came.

    A dead letter is the exception: live, it goes to the DLQ and the worker carries on; in a
    rebuild it stops the replay, naming the message, rather than leave a hole in the copy.
    """

    async def publish(self, messages: Sequence[OutboxMessage]) -> None:
        for message in messages:
            if message.topic.endswith(DLQ_SUFFIX) and message.value:
                letter = orjson.loads(message.value)
                raise cannot_apply(
                    letter["topic"],
                    letter["partition"],
                    letter["offset"],
                    letter["error_code"],
                    letter["error"],
                )

    def close(self) -> None:
        return None


@dataclass(slots=True)
class Progress:
    total: int
    done: int = 0
    partitions: int = 0
    partitions_done: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.done / elapsed if elapsed > 0 else 0.0


@dataclass(slots=True)
class ReplayReport:
    projection: str
    shadow: str
    events: int
    seconds: float
    differences: dict[str, Any]
    swapped: bool = False
    retired: str | None = None
    swept: int = 0
    caught_up: int = 0
    # The live vectors' model and the rebuild's, when they differ (embeddings only).
    model_change: tuple[str, str] | None = None
    # The live table's schema version and the rebuild's, when they differ (embeddings only).
    schema_change: tuple[int, int] | None = None

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "projection": self.projection,
            "shadow": self.shadow,
            "events": self.events,
            "seconds": round(self.seconds, 3),
            "events_per_second": round(self.rate),
            "identical": not self.differences,
            "differences": self.differences,
            "swapped": self.swapped,
            "retired": self.retired,
            "swept_after_rebuild": self.swept,
            "caught_up_before_swap": self.caught_up,
            "model_change": list(self.model_change) if self.model_change else None,
            "schema_change": list(self.schema_change) if self.schema_change else None,
        }


def reader(settings: Settings) -> Consumer:
    """A committed reader (contract 1.1): its watermark queries end at the last stable
    offset, and it reports reaching the end of a partition, so that a read whose end lies
    behind transaction markers or aborted messages (offsets it never receives) still ends."""
    return Consumer(
        consumer_config(
            settings.kafka,
            **{
                "group.id": f"memproj-replay-{uuid.uuid4().hex}",  # never commits: no group
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            },
        )
    )


def partitions_of(consumer: Consumer, topics: Sequence[str]) -> list[Position]:
    positions: list[Position] = []
    for topic in topics:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        positions += [(topic, partition) for partition in sorted(metadata.partitions)]
    return positions


def positions(
    consumer: Consumer, topics: Sequence[str], start: Start
) -> tuple[dict[Position, int], dict[Position, int]]:
    """Start and end offsets per partition; the end is fixed when the replay begins."""
    starts: dict[Position, int] = {}
    ends: dict[Position, int] = {}
    for topic, partition in partitions_of(consumer, topics):
        # ``reader`` is a committed reader: ``high`` is the last stable offset.
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        ends[(topic, partition)] = high
        if start == "earliest":
            starts[(topic, partition)] = low
        elif isinstance(start, dict):
            starts[(topic, partition)] = max(low, start.get(partition, low))
        else:
            millis = int(start.timestamp() * 1000)
            (found,) = consumer.offsets_for_times(
                [TopicPartition(topic, partition, millis)], timeout=10
            )
            starts[(topic, partition)] = high if found.offset < 0 else found.offset
    return starts, ends


def read(
    consumer: Consumer,
    starts: dict[Position, int],
    ends: dict[Position, int],
    batch_size: int,
    progress: Progress | None = None,
) -> Iterator[list[InputMessage]]:
    """The messages between ``starts`` and ``ends``, in batches, in partition order."""
    wanted = {pos: end for pos, end in ends.items() if starts.get(pos, end) < end}
    if progress is not None:
        progress.partitions = len(ends)
        progress.partitions_done = len(ends) - len(wanted)
    if not wanted:
        return
    consumer.assign([TopicPartition(t, p, starts[(t, p)]) for t, p in wanted])
    while wanted:
        batch: list[InputMessage] = []
        for message in gather(consumer, batch_size, 1.0, done=lambda: not wanted):
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            error = message.error()
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                raise failed(error, "replay read")
            assert topic is not None and partition is not None and offset is not None
            position = (topic, partition)
            end = wanted.get(position)
            if end is not None and error is not None and offset >= end:
                # Nothing more for a committed reader up to the end: what is left are
                # offsets it never receives (transaction markers, aborted messages).
                del wanted[position]
                if progress is not None:
                    progress.partitions_done += 1
                continue
            if end is None or error is not None or offset >= end:
                continue
            batch.append(input_message(message))
            if offset + 1 >= end:
                del wanted[position]
                if progress is not None:
                    progress.partitions_done += 1
        if batch:
            yield batch
    consumer.unassign()


async def _published(conn: Conn, projection: str, seconds: float = 60.0) -> None:
    """Until ``projection`` has no outbox messages left to publish (read committed: each poll
    sees the live worker's latest deletions)."""
    deadline = time.monotonic() + seconds
    while await pending_outbox(conn, projection, limit=1):
        if time.monotonic() > deadline:
            raise ReplayStopped(
                f"{projection}: the live worker's outbox is not published after {seconds:.0f} s"
                " (is it running?): not swapped"
            )
        await asyncio.sleep(0.05)


async def replay_projection(
    settings: Settings,
    projection: Projection[Any, Any, Any],
    start: Start = "earliest",
    swap: SwapMode = "if-equal",
    on_progress: Callable[[Progress], None] | None = None,
    batch_size: int = 2000,
    readers: int = 1,
) -> ReplayReport:
    """``readers``: processes reading disjoint partitions of the memory projection's sealed
    log (``streams.rebuild``; the conversation projection is read by one, through the
    runner)."""
    spec = shadows.SPECS[projection.name]
    stamp = time.strftime("%Y%m%d%H%M%S")
    shadow = f"replay_{projection.name}_{stamp}_{uuid.uuid4().hex[:6]}"
    memory = projection if isinstance(projection, MemoryProjection) else None
    async with await psycopg.AsyncConnection.connect(settings.postgres_conninfo) as live_conn:
        live = await shadows.current_schema(live_conn)
        await shadows.create_shadow(live_conn, spec, live, shadow)
        await rebuilds.register(live_conn, shadow, spec.projection, "shadow")
        await live_conn.commit()
        shadow_dsn = make_conninfo(
            settings.postgres_conninfo, options=f"-csearch_path={shadow},{live}"
        )
        topics = [settings.topics.name(s) for s in projection.input_specs]
        began = time.monotonic()
        others: list[_Reader] = []
        if memory is not None:
            # The end offsets are fixed before any reader starts.
            first = reader(settings)
            try:
                starts, ends = positions(first, topics, start)
            finally:
                first.close()
            progress = Progress(total=sum(max(0, ends[p] - starts[p]) for p in ends))
            progress.partitions = len(ends)
            shares = _shares(starts, ends, readers)
            others = [_Reader.start(settings, memory, shadow_dsn, *share) for share in shares[1:]]
        pool = make_pool(shadow_dsn, 2)
        await pool.open(wait=True)
        metrics = Metrics(CollectorRegistry())
        runner = ProjectionRunner(projection, pool, DiscardingPublisher(), settings.topics, metrics)
        # A rebuild dead-letters nothing (DiscardingPublisher stops it instead), and a
        # systemic fault stops it like a live worker.
        isolation = Isolation(
            CircuitBreaker(f"replay {projection.name}"), metrics, _unpublished_letters(settings)
        )
        consumer = reader(settings)
        try:
            if memory is not None:
                own_starts, own_ends = shares[0]

                own = [0, 0]  # events and partitions this process has done

                def shown(done: int = -1, partitions_done: int = -1) -> None:
                    if done >= 0:
                        own[:] = [done, partitions_done]
                    progress.done = own[0] + sum(r.done.value for r in others)
                    progress.partitions_done = own[1] + sum(r.partitions_done.value for r in others)
                    if on_progress is not None:
                        on_progress(progress)

                try:
                    await rebuild_share(consumer, memory, shadow_dsn, own_starts, own_ends, shown)
                    for other in others:
                        while not await asyncio.to_thread(other.wait, 0.5):
                            shown()  # the others' progress, while this process waits
                finally:
                    for other in others:
                        other.stop()
                shown()
                progress.partitions_done = progress.partitions  # each share read to its end
                if on_progress is not None:
                    on_progress(progress)
            else:
                starts, ends = positions(consumer, topics, start)
                progress = Progress(total=sum(max(0, ends[p] - starts[p]) for p in ends))
                began = time.monotonic()
                for batch in read(consumer, starts, ends, batch_size, progress):
                    await runner.apply(batch, isolation)
                    progress.done += len(batch)
                    if on_progress is not None:
                        on_progress(progress)
            report = ReplayReport(
                projection.name, shadow, progress.done, time.monotonic() - began, {}
            )
            async with pool.connection() as shadow_conn:
                rebuilt = await shadows.checksums(shadow_conn, spec)
            report.differences = shadows.differences(
                await shadows.checksums(live_conn, spec), rebuilt
            )
            await live_conn.commit()
            if swap == "always" or (swap == "if-equal" and not report.differences):
                await _swap(
                    live_conn, pool, runner, isolation, consumer, spec,
                    live_input(settings, projection), ends, settings.topics, (live, shadow),
                    report,
                )  # fmt: skip
        finally:
            consumer.close()
            await pool.close()
    return report


# A rebuild's chunk: large, since its state is held in memory and it publishes nothing.
BULK_CHUNK = 10_000


async def rebuild_share(
    consumer: Consumer,
    projection: MemoryProjection,
    shadow_dsn: str,
    starts: dict[Position, int],
    ends: dict[Position, int],
    shown: Callable[[int, int], None],
    chunk_size: int = BULK_CHUNK,
) -> None:
    """Apply these partitions of the sealed log to the shadow (``streams.rebuild``);
    ``shown(events, partitions)`` after each chunk, with what this reader has done."""
    rebuild = MemoryRebuild(projection)
    mine = Progress(total=0)
    async with await psycopg.AsyncConnection.connect(shadow_dsn) as conn:
        for batch in read(consumer, starts, ends, chunk_size, mine):
            await rebuild.apply(conn, batch)
            shown(rebuild.applied, mine.partitions_done)


class ReaderFailed(Explained, RuntimeError):
    """A reader process of a rebuild failed; the text says its error by class and code."""


# How a reader's process starts: a fresh interpreter. A fork would copy the replay's running
# event loop (and its Kafka and PostgreSQL clients' threads) into a process that must run a
# loop of its own (ops/decisions/rebuild.md, "Readers").
READER_START_METHOD: Final = "spawn"


class _Reader:
    """Another process applying a share of the partitions (``rebuild_share``), started by the
    replay: it is given the projection as the replay holds it (pickled), opens its own Kafka
    reader and connection, and reports how far it got through shared counters."""

    def __init__(self, process: BaseProcess, done: Any, partitions_done: Any, outcome: Any) -> None:
        self.process = process
        self.done = done
        self.partitions_done = partitions_done
        self._outcome = outcome

    @classmethod
    def start(
        cls,
        settings: Settings,
        projection: MemoryProjection,
        shadow_dsn: str,
        starts: dict[Position, int],
        ends: dict[Position, int],
    ) -> _Reader:
        context = multiprocessing.get_context(READER_START_METHOD)
        done, partitions_done = context.Value("q", 0), context.Value("q", 0)
        receiving, sending = context.Pipe(duplex=False)
        process = context.Process(
            target=_read_share,
            args=(settings, projection, shadow_dsn, starts, ends, done, partitions_done, sending),
            name="memproj-replay-reader",
            daemon=True,  # ends with the replay
        )
        process.start()
        sending.close()
        return cls(process, done, partitions_done, receiving)

    def wait(self, seconds: float | None = None) -> bool:
        """Whether the reader is done (waiting up to ``seconds``); raises what stopped it."""
        self.process.join(seconds)
        if self.process.is_alive():
            return False
        failure = self._outcome.recv() if self._outcome.poll() else None
        if failure is None and self.process.exitcode != 0:
            failure = ("failed", f"exit code {self.process.exitcode}")
        if failure is None:
            return True
        kind, text = failure
        if kind == "stopped":
            raise ReplayStopped(text)
        raise ReaderFailed(f"a replay reader failed: {text}")

    def stop(self) -> None:
        """This reader's process ends (a no-op once it has)."""
        if self.process.is_alive():
            self.process.terminate()
        self.process.join()


def _read_share(
    settings: Settings,
    projection: MemoryProjection,
    shadow_dsn: str,
    starts: dict[Position, int],
    ends: dict[Position, int],
    done: Any,
    partitions_done: Any,
    outcome: Any,
) -> None:
    """A reader's process: apply its share, send None or what stopped it."""
    replay = os.getppid()

    def shown(events: int, partitions: int) -> None:
        if os.getppid() != replay:
            os._exit(1)  # the replay was killed: its shadow is abandoned, stop writing it
        done.value, partitions_done.value = events, partitions

    consumer = reader(settings)
    try:
        asyncio.run(rebuild_share(consumer, projection, shadow_dsn, starts, ends, shown))
        outcome.send(None)
    except ReplayStopped as stopped:
        outcome.send(("stopped", str(stopped)))
    except BaseException as exc:  # reported to the replay, which raises it
        outcome.send(("failed", loggable(exc)))
    finally:
        consumer.close()


def _shares(
    starts: dict[Position, int], ends: dict[Position, int], readers: int
) -> list[tuple[dict[Position, int], dict[Position, int]]]:
    """The partitions split into ``readers`` shares of about as many messages (the largest
    first, each to the lightest share); the first share is this process's."""
    count = max(1, min(readers, len(ends)))
    shares: list[tuple[dict[Position, int], dict[Position, int]]] = [({}, {}) for _ in range(count)]
    loads = [0] * count
    for position in sorted(ends, key=lambda p: (starts[p] - ends[p], p)):
        lightest = loads.index(min(loads))
        shares[lightest][0][position] = starts[position]
        shares[lightest][1][position] = ends[position]
        loads[lightest] += max(0, ends[position] - starts[position])
    return shares


async def _swap(
    live_conn: Conn,
    pool: Any,
    runner: ProjectionRunner[Any, Any, Any],
    isolation: Isolation,
    consumer: Consumer,
    spec: shadows.ShadowSpec,
    source: LiveInput,
    read_to: dict[Position, int],
    names: TopicNames,
    schemas: tuple[str, str],
    report: ReplayReport,
) -> None:
    """Catch the shadow up from ``read_to`` (the end offsets its read stopped at) to what the
    live worker has applied, sweep it, and swap it in (the rule of the module's docstring)."""
    live, shadow = schemas
    retired = f"retired_{shadow.removeprefix('replay_')}"
    live_topics = [names.name(s) for s in source.specs]
    async with live_conn.transaction():
        # The live worker's tracking rows, locked as it locks them (those of a partition it
        # has not tracked yet too): its next batch waits until the swap commits.
        applied = await lock_offsets(
            live_conn,
            spec.projection,
            partitions_of(consumer, live_topics),
            inherit_from=source.inherit_from,
        )
        # An erasure committing between the sweep and the swap would remove its rows from the
        # tables about to be retired and leave them in the shadow that replaces them.
        await erasure_guard.hold_erasures(live_conn)
        if source.seals:
            # The live worker's rows are of the raw topic. With them locked it commits
            # nothing more, and once its committed batches are published the sealed log
            # holds exactly what it applied.
            await _published(live_conn, spec.projection)
            applied = {
                position: consumer.get_watermark_offsets(TopicPartition(*position), timeout=10)[1]
                for position in read_to
            }
        for batch in read(consumer, read_to, applied, 2000):
            await runner.apply(batch, isolation)
            report.caught_up += len(batch)
        async with pool.connection() as shadow_conn, shadow_conn.transaction():
            report.swept = await shadows.sweep_erased(shadow_conn, spec)
        await shadows.swap(live_conn, spec, live, shadow, retired, live_topics)
        await rebuilds.register(live_conn, retired, spec.projection, "retired")
    await shadows.drop_schema(live_conn, shadow)  # only its copies of the bookkeeping remain
    await rebuilds.forget(live_conn, shadow)
    await live_conn.commit()
    report.swapped = True
    report.retired = retired


def _digests(entries: Sequence[VectorEntry]) -> dict[str, shadows.TenantDigest]:
    by_tenant: dict[str, list[VectorEntry]] = {}
    for entry in entries:
        by_tenant.setdefault(entry.tenant_id, []).append(entry)
    return {
        tenant: shadows.TenantDigest(
            {"entries": len(found)},
            hashlib.md5(orjson.dumps(sorted((e.id, e.version, e.text) for e in found))).hexdigest(),
        )
        for tenant, found in by_tenant.items()
    }


async def replay_embeddings(
    settings: Settings,
    swap: SwapMode = "if-equal",
    on_progress: Callable[[Progress], None] | None = None,
    batch_size: int = 2000,
) -> ReplayReport:
    """Rebuild the vector store from ``memory.current`` and ``conversation.messages`` into a
    shadow table, through the same indexer and guard as the live worker; compare per tenant;
    swap by replacing the live table's content in one commit (old versions purged).

    The rebuild embeds with the configured embedder (``MEMPROJ_EMBEDDER``): it is how the
    vectors move to another model. The live table is read whatever model it holds; when that
    is another one, ``if-equal`` swaps the rebuild in even where the entries differ (the
    comparison is of entries, not vectors): the live vectors are unusable to this embedder,
    and ``never`` still keeps them. The same goes for a live table of an older schema
    (without the columns search filters by, which the vector store refuses to read)."""
    from streams.agents.index import EmbeddingsIndexer

    name = replay_table_name(datetime.now(UTC))
    tables = open_vector_tables(settings)
    shadow = open_vector_store(settings, table=name)
    live = open_vector_store(settings, adopt=True)
    previous_model, previous_schema = tables.recorded()
    pool = make_pool(settings.postgres_conninfo, 2)
    await pool.open(wait=True)
    metrics = Metrics(CollectorRegistry())
    indexer = EmbeddingsIndexer(
        pool, shadow, build_embedder(settings), DiscardingPublisher(),
        settings.topics, metrics, asyncio.Lock(),
        # The records of conversation.messages are sealed: the erased ones stay shut.
        KeyStore(settings.worker_master_keys()),
    )  # fmt: skip
    isolation = Isolation(
        CircuitBreaker("replay embeddings"), metrics, _unpublished_letters(settings)
    )
    consumer = reader(settings)
    try:
        feeds = [settings.topics.name(MEMORY_CURRENT), settings.topics.name(CONVERSATION_MESSAGES)]
        starts, ends = positions(consumer, feeds, "earliest")
        progress = Progress(total=sum(max(0, ends[p] - starts[p]) for p in ends))
        began = time.monotonic()
        for batch in read(consumer, starts, ends, batch_size, progress):
            await indexer.apply(batch, isolation)
            progress.done += len(batch)
            if on_progress is not None:
                on_progress(progress)
        report = ReplayReport("embeddings", name, progress.done, time.monotonic() - began, {})
        rebuilt = await asyncio.to_thread(every_entry, shadow)
        current = await asyncio.to_thread(every_entry, live)
        report.differences = shadows.differences(_digests(current), _digests(rebuilt))
        report.model_change = (
            (previous_model, shadow.model) if previous_model != shadow.model else None
        )
        if previous_schema != SCHEMA_VERSION:
            report.schema_change = (previous_schema, SCHEMA_VERSION)
        # The live entries are unusable as they are: the rebuild replaces them even where the
        # entries differ (``never`` still keeps them).
        unusable = report.model_change is not None or report.schema_change is not None
        equal = not report.differences or unusable
        if swap == "always" or (swap == "if-equal" and equal):
            members = group_members(settings, settings.group_id("embeddings"))
            if members:
                raise ReplayStopped(
                    f"the embeddings worker is running ({', '.join(members)}): stop it to swap"
                    " the rebuilt vectors in, and replay again; nothing was swapped"
                )
            # A deletion during the rebuild may have reached the live table (and been acked)
            # after the shadow indexed the item: the shadow is swept before it replaces it.
            async with pool.connection() as conn:
                erased = covered_entries(rebuilt, await ghost_audit.load_covered(conn))
            report.swept = len(erased)
            doomed = {entry.id for entry in erased}
            rebuilt = [entry for entry in rebuilt if entry.id not in doomed]
            await asyncio.to_thread(live.replace_all, rebuilt)
            report.swapped = True
    finally:
        consumer.close()
        await pool.close()
        # Swapped or not, the shadow table goes: a full copy that no erasure reaches must not
        # stay behind (the report keeps the differences).
        await asyncio.to_thread(tables.drop, name)
    return report


def every_entry(store: VectorStore) -> list[VectorEntry]:
    """The whole store, read tenant by tenant (its reads are tenant-filtered)."""
    return [entry for tenant in store.tenants() for entry in store.entries(tenant)]


def group_members(settings: Settings, group: str) -> list[str]:
    admin = AdminClient(admin_config(settings.kafka))
    description = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
    return sorted(f"{m.client_id}@{m.host}" for m in description.members)
