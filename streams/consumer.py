"""Batches straight from a confluent-kafka consumer: every worker agent's ``BatchSource``.

Faust handed an agent one message at a time (about 30 µs of framework per message per
stage); librdkafka hands out a batch in one call. ``KafkaBatchSource`` gives the batch loop
(``streams.loop``) what ``consume(num_messages=max_events, timeout=max_wait)`` returns, run
on a thread of its own so that the event loop never blocks on Kafka, and commits offsets
itself, only for what the loop acknowledged (at-least-once; the runners' tracking offsets in
PostgreSQL skip a redelivery).

Bounds: a batch holds at most ``max_events`` messages and ``max_bytes`` of keys and values
(what a consume returns beyond that waits for the next batch), and librdkafka's prefetch
queue holds at most ``max_events`` messages or ``max_bytes``. With the batch being applied,
the one being published and the one queued behind them (``BatchLoop``), a worker holds about
five batches' worth.

Rebalances (``cooperative-sticky``: a joining member takes partitions without the others
stopping) run in the consumer's thread, inside ``consume``. Before a revoked partition is
given up, every batch already handed out that holds it is applied and acknowledged (waited
for up to ``rebalance_drain_seconds``), and its offsets are committed synchronously, so the
next owner starts exactly after them. A batch still unacknowledged at the deadline is
abandoned: its offsets are never committed by this member (acknowledgements of partitions it
no longer owns are dropped), the next owner redelivers it, and the tracking rows, locked per
partition in each batch's transaction, make the one that commits second skip it. Lost
partitions (the session expired) are given up without a commit. Messages fetched for a
partition that was revoked in the same ``consume`` are dropped, not handed out.

``close`` commits what was acknowledged and leaves the group at once (``Consumer.close``), so
its partitions move without waiting for the session timeout.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from streams.kafka import KafkaTarget, consumer_config, input_message
from streams.loop import Batch, BatchLimits, message_bytes
from topics.messages import InputMessage

log = logging.getLogger(__name__)

Position = tuple[str, int]  # (topic, partition)


# -- pure parts ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupConsumerSettings:
    """What a worker's group consumer is built from (``Settings.group_consumer``)."""

    group_id: str
    limits: BatchLimits
    session_timeout_seconds: float = 10.0
    rebalance_drain_seconds: float = 10.0


def group_consumer_overrides(settings: GroupConsumerSettings) -> dict[str, object]:
    """The librdkafka settings of a worker's group consumer, on top of ``consumer_config``."""
    session_ms = int(settings.session_timeout_seconds * 1000)
    gather_ms = max(1, round(settings.limits.max_wait_seconds * 1000))
    return {
        "group.id": settings.group_id,
        # Offsets are committed after the loop acknowledges a batch, never on a timer.
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "cooperative-sticky",
        "session.timeout.ms": session_ms,
        "heartbeat.interval.ms": min(3000, session_ms // 3),
        # The prefetch queue, bounded in events and in bytes.
        "queued.min.messages": settings.limits.max_events,
        "queued.max.messages.kbytes": max(1, settings.limits.max_bytes // 1024),
        # Freshness (ops/decisions/freshness.md): a message waits for its batch at most the
        # batch's gathering time, and librdkafka's own waits are kept under it. A partition
        # whose prefetch queue reached the bounds above is fetched again only after
        # fetch.queue.backoff.ms (1 s by default: a full second of staleness after a burst),
        # and a partition that becomes fetchable waits for the fetch in flight, which the
        # broker holds up to fetch.wait.max.ms (500 ms) when it has nothing new.
        "fetch.queue.backoff.ms": gather_ms,
        "fetch.wait.max.ms": gather_ms,
    }


def cut_batch(
    messages: Sequence[InputMessage], max_events: int, max_bytes: int
) -> tuple[list[InputMessage], list[InputMessage]]:
    """The longest prefix of at most ``max_events`` messages and ``max_bytes`` (at least one
    message, however large), and the rest."""
    size = 0
    for index, message in enumerate(messages[:max_events]):
        size += message_bytes(message)
        if index > 0 and size > max_bytes:
            return list(messages[:index]), list(messages[index:])
    return list(messages[:max_events]), list(messages[max_events:])


def next_offsets(messages: Iterable[InputMessage]) -> dict[Position, int]:
    """Per partition, the offset to commit once ``messages`` are applied: the last one's + 1."""
    offsets: dict[Position, int] = {}
    for message in messages:
        position = (message.topic, message.partition)
        offsets[position] = max(offsets.get(position, 0), message.offset + 1)
    return offsets


def owned_only(messages: Iterable[InputMessage], owned: frozenset[Position]) -> list[InputMessage]:
    return [m for m in messages if (m.topic, m.partition) in owned]


@dataclass(slots=True)
class Handouts:
    """Batches handed to the loop and not yet acknowledged, and the offsets acknowledged per
    partition (and which of them were already sent in a commit). Not thread-safe:
    ``KafkaBatchSource`` holds its lock."""

    _unacked: dict[int, frozenset[Position]] = field(default_factory=dict)
    _acked: dict[Position, int] = field(default_factory=dict)
    _sent: dict[Position, int] = field(default_factory=dict)
    _numbers: int = 0

    def handed_out(self, positions: Iterable[Position]) -> int:
        self._numbers += 1
        self._unacked[self._numbers] = frozenset(positions)
        return self._numbers

    def acknowledged(self, number: int, offsets: Mapping[Position, int]) -> None:
        self._unacked.pop(number, None)
        for position, offset in offsets.items():
            self._acked[position] = max(self._acked.get(position, 0), offset)

    def holds_any(self, positions: Iterable[Position]) -> bool:
        wanted = set(positions)
        return any(wanted & held for held in self._unacked.values())

    def unsent(self) -> dict[Position, int]:
        """The acknowledged offsets no commit has carried yet, now counted as sent."""
        unsent = {p: o for p, o in self._acked.items() if self._sent.get(p) != o}
        self._sent.update(unsent)
        return dict(sorted(unsent.items()))

    def acked(self, positions: Iterable[Position] | None = None) -> dict[Position, int]:
        """The acknowledged offsets (of ``positions``, or all), sent or not."""
        wanted = set(self._acked) if positions is None else set(positions) & set(self._acked)
        return {position: self._acked[position] for position in sorted(wanted)}

    def forget(self, positions: Iterable[Position]) -> None:
        """Partitions given up: their offsets are no longer this member's to commit."""
        for position in positions:
            self._acked.pop(position, None)
            self._sent.pop(position, None)


@dataclass(frozen=True, slots=True)
class Handout:
    """A batch's token: its number among the handouts and the offsets it commits."""

    number: int
    offsets: Mapping[Position, int]


class MembershipObserver(Protocol):
    """Told of the group membership (``streams.services.WorkerState``: readiness)."""

    def rebalancing(self) -> None: ...

    def assigned(self, positions: Iterable[Position]) -> None: ...


def partitions(offsets: Mapping[Position, int]) -> list[TopicPartition]:
    return [
        TopicPartition(topic, partition, offset) for (topic, partition), offset in offsets.items()
    ]


def positions_of(topic_partitions: Iterable[TopicPartition]) -> list[Position]:
    return [(tp.topic, tp.partition) for tp in topic_partitions]


# -- the source ------------------------------------------------------------------------------


class KafkaBatchSource:
    """A ``BatchSource`` reading ``topics`` in a consumer group (see the module docstring)."""

    def __init__(
        self,
        cluster: KafkaTarget,
        topics: Sequence[str],
        settings: GroupConsumerSettings,
        membership: MembershipObserver | None = None,
    ) -> None:
        self._cluster = cluster
        self._topics = list(topics)
        self._settings = settings
        self._limits = settings.limits
        self._membership = membership
        self._consumer: Consumer | None = None
        # Every call on the consumer that can block (consume, a synchronous commit, close)
        # runs on this one thread, so they never overlap; the rebalance callbacks run there
        # too, inside consume.
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"consumer-{settings.group_id}")
        self._lock = threading.Condition()
        self._handouts = Handouts()
        self._owned: frozenset[Position] = frozenset()
        self._carried: list[InputMessage] = []
        self._closing = False
        self._closed = False

    @property
    def owned(self) -> frozenset[Position]:
        return self._owned

    async def start(self) -> None:
        """Join the group (the first ``consume`` completes the join)."""
        config = consumer_config(self._cluster, **group_consumer_overrides(self._settings))
        config["on_commit"] = self._on_commit
        consumer = Consumer(config)
        consumer.subscribe(
            self._topics,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        self._consumer = consumer

    async def batches(self) -> AsyncGenerator[Batch, None]:
        loop = asyncio.get_running_loop()
        while not self._closing:
            messages = await loop.run_in_executor(self._thread, self._next_batch)
            if messages:
                offsets = next_offsets(messages)
                with self._lock:
                    number = self._handouts.handed_out(offsets)
                yield Batch(messages, Handout(number, offsets))

    async def ack(self, batch: Batch) -> None:
        """Record the batch's offsets as applied, for the partitions this member still owns;
        the consumer's thread commits them (asynchronously before its next fetch, and
        synchronously at a revocation or the close). Never a call on the consumer here: one
        would block the event loop for as long as a rebalance callback runs."""
        handout = batch.token
        assert isinstance(handout, Handout)
        with self._lock:
            owned = {p: o for p, o in handout.offsets.items() if p in self._owned}
            self._handouts.acknowledged(handout.number, owned)
            self._lock.notify_all()

    async def commit(self) -> None:
        """Commit every acknowledged offset now (the graceful shutdown's step)."""
        if self._consumer is not None and not self._closed:
            await asyncio.get_running_loop().run_in_executor(self._thread, self._commit_acked)

    async def close(self) -> None:
        """Commit what was acknowledged and leave the group at once. Idempotent."""
        self._closing = True
        if self._consumer is None or self._closed:
            return
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self._close)
        self._thread.shutdown(wait=False)

    # -- the consumer's thread --------------------------------------------------------------

    def _next_batch(self) -> list[InputMessage]:
        consumer = self._consumer
        assert consumer is not None
        with self._lock:
            unsent = self._handouts.unsent()
        if unsent:
            try:
                consumer.commit(offsets=partitions(unsent), asynchronous=True)
            except KafkaException as exc:  # committed again at the revocation or the close
                log.debug("asynchronous commit not sent: %s", exc)
        wanted = self._limits.max_events - len(self._carried)
        fetched: list[InputMessage] = []
        if wanted > 0 and not self._carried_is_full():
            fetched = self._converted(
                consumer.consume(num_messages=wanted, timeout=self._limits.max_wait_seconds)
            )
        # A partition revoked during this consume is no longer this member's to hand out.
        pending = owned_only([*self._carried, *fetched], self._owned)
        batch, self._carried = cut_batch(pending, self._limits.max_events, self._limits.max_bytes)
        return batch

    def _carried_is_full(self) -> bool:
        return sum(message_bytes(m) for m in self._carried) >= self._limits.max_bytes

    @staticmethod
    def _converted(messages: Sequence[Message]) -> list[InputMessage]:
        converted = []
        for message in messages:
            error = message.error()
            if error is not None:
                if error.fatal():
                    raise KafkaException(error)
                log.warning("consumer: %s", error)
                continue
            converted.append(input_message(message))
        return converted

    def _commit_acked(self, positions: Iterable[Position] | None = None) -> None:
        consumer = self._consumer
        assert consumer is not None
        with self._lock:
            acked = self._handouts.acked(positions)
            acked = {p: o for p, o in acked.items() if p in self._owned}
        if not acked:
            return
        try:
            consumer.commit(offsets=partitions(acked), asynchronous=False)
        except KafkaException as exc:
            error = exc.args[0]
            if isinstance(error, KafkaError) and error.code() == KafkaError._NO_OFFSET:
                return
            log.warning("offset commit failed (redelivered, then skipped): %s", exc)

    def _close(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        self._commit_acked()
        consumer.close()  # leaves the group: its partitions move at once
        self._closed = True

    @staticmethod
    def _on_commit(error: KafkaError | None, _partitions: list[TopicPartition]) -> None:
        if error is not None and error.code() != KafkaError._NO_OFFSET:
            # Nothing is lost: the offsets are committed again with the next batch, at a
            # revocation or at close; at worst the batch is redelivered and skipped.
            log.warning("offset commit failed: %s", error)

    def _on_assign(self, _consumer: Consumer, assigned: list[TopicPartition]) -> None:
        self._owned = self._owned | frozenset(positions_of(assigned))
        if assigned:
            log.info("assigned %s", sorted(positions_of(assigned)))
        if self._membership is not None:
            self._membership.assigned(self._owned)

    def _on_revoke(self, _consumer: Consumer, revoked: list[TopicPartition]) -> None:
        given_up = positions_of(revoked)
        if self._membership is not None:
            self._membership.rebalancing()
        with self._lock:
            finished = self._lock.wait_for(
                lambda: not self._handouts.holds_any(given_up),
                timeout=0 if self._closing else self._settings.rebalance_drain_seconds,
            )
        if not finished and not self._closing:
            log.warning(
                "revoked %s: abandoning a batch still being applied (redelivered to the next "
                "owner, whose tracking offsets skip what this one commits)",
                sorted(given_up),
            )
        self._commit_acked(given_up)
        with self._lock:
            self._owned = self._owned - frozenset(given_up)
            self._handouts.forget(given_up)
        log.info("revoked %s", sorted(given_up))

    def _on_lost(self, _consumer: Consumer, lost: list[TopicPartition]) -> None:
        given_up = positions_of(lost)
        if self._membership is not None:
            self._membership.rebalancing()
        with self._lock:
            self._owned = self._owned - frozenset(given_up)
            self._handouts.forget(given_up)
        log.warning("lost %s (session expired): nothing committed for them", sorted(given_up))
