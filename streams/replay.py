"""Rebuilding a projection by replaying its topics into a shadow copy.

The replay reads the projection's input (the sealed log) with a plain confluent-kafka
consumer, from the start position up to the end offsets as of the start, and applies it with
the same codec, reducers and erasure guard as the live worker, into a shadow schema; nothing
is published. The conversation projection is applied through the live worker's runner; the
memory projection on a path of its own (``streams.rebuild``: large chunks, its state held in
memory, no outbox), by ``readers`` processes over disjoint partitions (the others started by
this one, each a fresh interpreter; a reader that fails stops the replay, and one whose replay
is killed stops at its next chunk: ``streams.replay_processes``). The log is read as
``streams.replay_reading`` reads it; the vector store is rebuilt by
``streams.replay_embeddings``. Live workers keep serving meanwhile. The shadow is then
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
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson
import psycopg
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import CollectorRegistry
from psycopg.conninfo import make_conninfo

from projections import rebuilds
from projections import shadow as shadows
from projections.bookkeeping import PostgresTracking, lock_offsets
from projections.deadletters.keys import UnpublishedLetterKeys
from projections.deadletters.sealing import LetterSealer
from projections.deletion import guard as erasure_guard
from projections.memory.projection import MemoryProjection
from projections.outbox import OutboxMessage, pending_outbox
from projections.sql import Conn
from streams.isolation import CircuitBreaker, DeadLetters, Isolation
from streams.metrics import Metrics
from streams.rebuild import ReplayStopped as ReplayStopped  # part of this module's interface
from streams.rebuild import cannot_apply
from streams.replay_processes import Reader, rebuild_share, shares_of
from streams.replay_reading import (
    Position,
    Progress,
    Start,
    apply_range,
    partitions_of,
    positions,
    read,
    reader,
)
from streams.runner import Projection, ProjectionRunner
from streams.services import make_pool
from streams.settings import Settings
from streams.worker import LiveInput, live_input
from topics.registry import DLQ_SUFFIX, TopicNames

SwapMode = Literal["always", "if-equal", "never"]


def unpublished_letters(settings: Settings) -> DeadLetters:
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
        others: list[Reader] = []
        if memory is not None:
            # The end offsets are fixed before any reader starts.
            first = reader(settings)
            try:
                starts, ends = positions(first, topics, start)
            finally:
                first.close()
            progress = Progress.of(starts, ends)
            progress.partitions = len(ends)
            shares = shares_of(starts, ends, readers)
            others = [Reader.start(settings, memory, shadow_dsn, *share) for share in shares[1:]]
        pool = make_pool(shadow_dsn, 2)
        await pool.open(wait=True)
        metrics = Metrics(CollectorRegistry())
        runner = ProjectionRunner(
            projection,
            pool,
            DiscardingPublisher(),
            settings.topics,
            metrics,
            tracking=PostgresTracking(settings.key_lookups),
        )
        # A rebuild dead-letters nothing (DiscardingPublisher stops it instead), and a
        # systemic fault stops it like a live worker.
        isolation = Isolation(
            CircuitBreaker(f"replay {projection.name}"), metrics, unpublished_letters(settings)
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
                began = time.monotonic()
                progress = await apply_range(
                    consumer,
                    starts,
                    ends,
                    batch_size,
                    lambda batch: runner.apply(batch, isolation),
                    on_progress,
                )
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
