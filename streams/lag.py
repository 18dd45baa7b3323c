"""Consumer lag of every memproj consumer group, in messages and in seconds.

Seconds are the age of the oldest unconsumed message itself: the broker timestamp of the
message at the group's committed offset. That stays true while a group replays from the start
(old messages are old) or a topic is idle (nothing unconsumed: 0), where interpolating offsets
over wall-clock time would not.

Lag is measured against what a committed reader sees (contract 1.1: memproj reads committed
data only). The end of a partition is its last stable offset (``list_offsets`` with
``READ_COMMITTED``): an open transaction's messages are not lag. Transactions also leave
offsets no committed reader ever receives: their markers, and an aborted transaction's
messages. A group that consumed everything committed has its offset at the first of those
offsets, short of the end, and offset arithmetic alone would call that lag. So a partition
that looks behind is probed (``first_visible``): the lag counts from the first message a
committed reader would actually get, and is 0 when there is none before the end.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from streams.kafka import KafkaTarget, admin_config, consumer_config, failed

Position = tuple[str, int]  # (topic, partition)
Probe = tuple[str, int, int]  # (topic, partition, offset)


@dataclass(frozen=True, slots=True)
class PartitionLag:
    group: str
    topic: str
    partition: int
    committed: int | None  # None: the group has not committed on this partition
    end: int  # the last stable offset: where a committed reader's partition ends
    # Offsets from the first message the group has yet to receive to the end (markers and
    # aborted messages in between count too); 0 exactly when nothing committed is left.
    messages: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Head:
    """The first message a committed reader gets from some offset on."""

    offset: int
    timestamp: datetime | None  # None: the message has no timestamp


RETRY_PAUSE_SECONDS = 0.1
_SPECS = {"low": OffsetSpec.earliest(), "end": OffsetSpec.latest()}  # type: ignore[no-untyped-call]


def watermarks(
    admin: AdminClient, partitions: Iterable[Position], timeout: float = 10.0
) -> dict[Position, tuple[int, int]]:
    """(low, end) per partition, the end being the last stable offset: the high watermark
    when no transaction is open, else the first offset of the oldest open transaction.

    A retriable refusal (a partition whose leader is moving, or not yet elected on a topic
    just created: ``NOT_LEADER_FOR_PARTITION``) is asked again until ``timeout``; anything
    else, or a refusal past the deadline, raises."""
    wanted = sorted(set(partitions))
    found: dict[str, dict[Position, int]] = defaultdict(dict)
    deadline = time.monotonic() + timeout
    pending = {name: list(wanted) for name in ("low", "end")}
    while True:
        pending = _list_offsets(admin, pending, found, max(deadline - time.monotonic(), 0.1))
        if not any(pending.values()):
            break
        if time.monotonic() >= deadline:
            raise KafkaException(f"offsets of {pending} still refused after {timeout} s")
        time.sleep(RETRY_PAUSE_SECONDS)
    return {position: (found["low"][position], found["end"][position]) for position in wanted}


# Refusals that mean "ask again shortly": the admin client does not always flag them
# retriable in what it hands back for one partition.
_TRANSIENT = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
    }
)


def _transient(error: KafkaError) -> bool:
    return bool(error.retriable()) or error.code() in _TRANSIENT


def _list_offsets(
    admin: AdminClient,
    pending: Mapping[str, list[Position]],
    found: dict[str, dict[Position, int]],
    timeout: float,
) -> dict[str, list[Position]]:
    """One round of ``list_offsets`` for what is ``pending`` (both specs in flight together),
    answers into ``found``; returns what was refused retriably, to ask again."""
    requests = {
        name: admin.list_offsets(
            {TopicPartition(topic, partition): _SPECS[name] for topic, partition in positions},
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=timeout,
        )
        for name, positions in pending.items()
        if positions
    }
    refused: dict[str, list[Position]] = defaultdict(list)
    for name, futures in requests.items():
        for tp, future in futures.items():
            try:
                found[name][(tp.topic, tp.partition)] = future.result(timeout=timeout).offset
            except KafkaException as error:
                if not error.args or not _transient(error.args[0]):
                    raise
                refused[name].append((tp.topic, tp.partition))
    return refused


def probe_consumer(bootstrap: KafkaTarget) -> Consumer:
    """A committed reader that never commits and reports reaching the end of a partition."""
    return Consumer(
        consumer_config(
            bootstrap,
            **{
                "group.id": f"memproj-probe-{uuid.uuid4().hex}",  # assigns only: no group
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                # An empty fetch answers at once, not after librdkafka's 500 ms.
                "fetch.wait.max.ms": 10,
                # Start offsets below the log start (retention) read from the oldest message.
                "auto.offset.reset": "earliest",
            },
        )
    )


def first_visible(
    bootstrap: KafkaTarget,
    probes: Iterable[Probe],
    ends: Mapping[Position, int],
    timeout: float = 10.0,
) -> dict[Probe, Head | None]:
    """For each (topic, partition, offset): the first message a committed reader gets at or
    after ``offset`` and before the partition's end, or None when there is none (what lies
    between is only transaction markers and aborted messages). A probe left out of the result
    could not be answered within ``timeout``."""
    rounds: dict[int, list[Probe]] = defaultdict(list)
    per_partition: dict[Position, int] = defaultdict(int)
    for topic, partition, offset in sorted(set(probes)):
        # A consumer holds a partition at one offset at a time: one probe per round each.
        rounds[per_partition[(topic, partition)]].append((topic, partition, offset))
        per_partition[(topic, partition)] += 1
    found: dict[Probe, Head | None] = {}
    if not rounds:
        return found
    consumer = probe_consumer(bootstrap)
    try:
        for _, wanted in sorted(rounds.items()):
            found.update(_probe_round(consumer, wanted, ends, timeout))
    finally:
        consumer.close()
    return found


def _probe_round(
    consumer: Consumer, wanted: list[Probe], ends: Mapping[Position, int], timeout: float
) -> dict[Probe, Head | None]:
    pending = {(topic, partition): offset for topic, partition, offset in wanted}
    found: dict[Probe, Head | None] = {}
    consumer.assign(
        [TopicPartition(topic, partition, offset) for topic, partition, offset in wanted]
    )
    deadline = time.monotonic() + timeout
    try:
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            message = consumer.poll(min(left, 1.0))
            if message is None:
                continue
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            if topic is None or partition is None or (topic, partition) not in pending:
                continue
            start = pending[(topic, partition)]
            error = message.error()
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                raise failed(error, f"probe of {topic}[{partition}]")
            if offset is not None and 0 <= offset < start:
                continue  # fetched for an earlier assignment of this partition
            key = (topic, partition, start)
            if error is not None or offset is None or offset >= ends[(topic, partition)]:
                # The end of what a committed reader sees, or a message written since the
                # end was read: nothing committed between the start and the end.
                found[key] = None
            else:
                _kind, millis = message.timestamp()
                stamp = datetime.fromtimestamp(millis / 1000, UTC) if millis >= 0 else None
                found[key] = Head(offset, stamp)
            del pending[(topic, partition)]
    finally:
        consumer.unassign()
    return found


class LagCollector:
    def __init__(
        self,
        bootstrap: KafkaTarget,
        group_prefix: str,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        timeout: float = 10.0,
    ) -> None:
        self._bootstrap = bootstrap
        self._prefix = group_prefix + "-"
        self._clock = clock
        self._timeout = timeout
        self._admin = AdminClient(admin_config(bootstrap))

    def groups(self) -> list[str]:
        listed = self._admin.list_consumer_groups(request_timeout=self._timeout).result()
        return sorted(g.group_id for g in listed.valid if g.group_id.startswith(self._prefix))

    def collect(self, groups: Iterable[str] | None = None) -> list[PartitionLag]:
        wanted = list(self.groups() if groups is None else groups)
        committed: dict[tuple[str, str, int], int | None] = {}
        # One request per group (the admin API takes one at a time), all in flight together.
        requests = {
            group: self._admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group)], request_timeout=self._timeout
            )[group]
            for group in wanted
        }
        for group, request in requests.items():
            for tp in request.result().topic_partitions:
                offset = None if tp.offset == OFFSET_INVALID or tp.offset < 0 else tp.offset
                committed[(group, tp.topic, tp.partition)] = offset
        if not committed:
            return []
        marks = watermarks(self._admin, (key[1:] for key in committed), self._timeout)
        ends = {position: end for position, (_, end) in marks.items()}
        # Where each group stands: the first offset it has not consumed.
        starts = {
            key: max(offset if offset is not None else 0, marks[key[1:]][0])
            for key, offset in committed.items()
        }
        behind = {key: start for key, start in starts.items() if start < ends[key[1:]]}
        heads = first_visible(
            self._bootstrap, ((*key[1:], start) for key, start in behind.items()), ends,
            self._timeout,
        )  # fmt: skip
        now = self._clock()
        lags = []
        for (group, topic, partition), offset in sorted(committed.items()):
            end = ends[(topic, partition)]
            start = starts[(group, topic, partition)]
            messages, seconds = 0, 0.0
            if start < end:
                probe = (topic, partition, start)
                if probe not in heads:  # unanswered: count every offset, age unknown
                    messages = end - start
                elif (head := heads[probe]) is not None:
                    messages = end - head.offset
                    if head.timestamp is not None:
                        seconds = max(0.0, (now - head.timestamp).total_seconds())
            lags.append(
                PartitionLag(
                    group=group,
                    topic=topic,
                    partition=partition,
                    committed=offset,
                    end=end,
                    messages=messages,
                    seconds=seconds,
                )
            )
        return lags
