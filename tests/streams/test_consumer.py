"""The batch consumer (``streams.consumer``): its pure rules, then the real broker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from streams.consumer import (
    GroupConsumerSettings,
    Handouts,
    KafkaBatchSource,
    cut_batch,
    group_consumer_overrides,
    next_offsets,
    owned_only,
)
from streams.isolation import Isolation
from streams.kafka import admin_config, consumer_config
from streams.loop import Batch, BatchLimits, BatchLoop
from streams.progress import committed_offsets, end_offsets
from streams.services import WorkerState
from streams.settings import Settings
from support.fakes import Stops, loop_for
from topics.messages import InputMessage
from topics.registry import DELETION_ACKS, DELETION_REQUESTS, MEMORY_EVENTS


def msg(offset: int, partition: int = 0, size: int = 10, topic: str = "t") -> InputMessage:
    return InputMessage(topic, partition, offset, None, b"x" * size)


# -- pure rules ------------------------------------------------------------------------------


def test_a_batch_is_cut_at_the_event_bound() -> None:
    messages = [msg(i) for i in range(5)]
    batch, rest = cut_batch(messages, max_events=3, max_bytes=1000)
    assert [m.offset for m in batch] == [0, 1, 2]
    assert [m.offset for m in rest] == [3, 4]


def test_a_batch_is_cut_at_the_byte_bound_and_the_rest_waits() -> None:
    messages = [msg(i, size=40) for i in range(5)]
    batch, rest = cut_batch(messages, max_events=100, max_bytes=100)
    assert [m.offset for m in batch] == [0, 1]  # 80 bytes; a third would make 120
    assert [m.offset for m in rest] == [2, 3, 4]


def test_a_message_larger_than_the_byte_bound_is_a_batch_alone() -> None:
    batch, rest = cut_batch([msg(0, size=500), msg(1)], max_events=100, max_bytes=100)
    assert [m.offset for m in batch] == [0] and [m.offset for m in rest] == [1]
    assert cut_batch([], 10, 10) == ([], [])


def test_the_offsets_to_commit_are_the_next_ones_per_partition() -> None:
    messages = [msg(5, 0), msg(9, 1), msg(6, 0), msg(3, 0, topic="u")]
    assert next_offsets(messages) == {("t", 0): 7, ("t", 1): 10, ("u", 0): 4}


def test_messages_of_partitions_no_longer_owned_are_dropped() -> None:
    messages = [msg(0, 0), msg(0, 1), msg(1, 0)]
    kept = owned_only(messages, frozenset({("t", 0)}))
    assert [(m.partition, m.offset) for m in kept] == [(0, 0), (0, 1)]


def test_handouts_know_which_partitions_are_still_being_applied() -> None:
    handouts = Handouts()
    first = handouts.handed_out([("t", 0), ("t", 1)])
    second = handouts.handed_out([("t", 1)])
    assert handouts.holds_any([("t", 0)]) and not handouts.holds_any([("t", 2)])
    handouts.acknowledged(first, {("t", 0): 10, ("t", 1): 4})
    assert not handouts.holds_any([("t", 0)]) and handouts.holds_any([("t", 1)])
    handouts.acknowledged(second, {("t", 1): 8})
    assert not handouts.holds_any([("t", 0), ("t", 1)])
    assert handouts.acked([("t", 1)]) == {("t", 1): 8}
    assert handouts.acked() == {("t", 0): 10, ("t", 1): 8}


def test_each_acknowledged_offset_is_sent_once_and_never_moves_back() -> None:
    handouts = Handouts()
    handouts.acknowledged(handouts.handed_out([("t", 0)]), {("t", 0): 10})
    assert handouts.unsent() == {("t", 0): 10}
    assert handouts.unsent() == {}
    handouts.acknowledged(handouts.handed_out([("t", 0)]), {("t", 0): 7})
    handouts.acknowledged(handouts.handed_out([("t", 1)]), {("t", 1): 3})
    assert handouts.unsent() == {("t", 1): 3}
    assert handouts.acked() == {("t", 0): 10, ("t", 1): 3}  # sent or not: a revocation's


def test_partitions_given_up_are_forgotten() -> None:
    handouts = Handouts()
    handouts.acknowledged(handouts.handed_out([("t", 0), ("t", 1)]), {("t", 0): 5, ("t", 1): 3})
    handouts.forget([("t", 1)])
    assert handouts.acked() == {("t", 0): 5} and handouts.unsent() == {("t", 0): 5}


def test_the_group_consumer_commits_itself_cooperatively_bounded_and_read_committed() -> None:
    limits = BatchLimits(max_events=500, max_wait_seconds=0.1, max_bytes=4 * 1024 * 1024)
    overrides = group_consumer_overrides(GroupConsumerSettings("g", limits, 9.0, 5.0))
    config = consumer_config("127.0.0.1:9092", **overrides)
    assert config["group.id"] == "g"
    assert config["enable.auto.commit"] is False
    assert config["partition.assignment.strategy"] == "cooperative-sticky"
    assert config["isolation.level"] == "read_committed"
    assert (config["queued.min.messages"], config["queued.max.messages.kbytes"]) == (500, 4096)
    assert (config["session.timeout.ms"], config["heartbeat.interval.ms"]) == (9000, 3000)


def test_librdkafka_never_holds_a_message_longer_than_a_batch_gathers() -> None:
    limits = BatchLimits(max_events=500, max_wait_seconds=0.05, max_bytes=4 * 1024 * 1024)
    overrides = group_consumer_overrides(GroupConsumerSettings("g", limits))
    # librdkafka's defaults: 1 s after the prefetch queue filled, 500 ms of an idle fetch.
    assert overrides["fetch.queue.backoff.ms"] == overrides["fetch.wait.max.ms"] == 50


def test_the_settings_give_each_kind_its_group_consumer() -> None:
    settings = Settings(group_prefix="p", batch_max_events=123, rebalance_drain_seconds=2.5)
    consumer = settings.group_consumer("memory")
    assert consumer.group_id == settings.group_id("memory") == "p-memory"
    assert consumer.limits.max_events == 123
    assert consumer.rebalance_drain_seconds == 2.5


def test_the_workers_recall_and_context_read_gather_their_batches_for_less_long() -> None:
    settings = Settings(batch_max_wait_seconds=0.25, projection_batch_max_wait_seconds=0.04)
    assert settings.group_consumer("memory").limits.max_wait_seconds == 0.04
    assert settings.group_consumer("conversation").limits.max_wait_seconds == 0.04
    assert settings.group_consumer("cache").limits.max_wait_seconds == 0.25
    assert settings.group_consumer("memory").limits.max_events == settings.batch_max_events


def test_the_ledgers_requests_gather_for_as_short_as_the_projections_and_its_acks_do_not() -> None:
    settings = Settings(batch_max_wait_seconds=0.25, projection_batch_max_wait_seconds=0.04)
    assert settings.group_consumer("deletion", [DELETION_REQUESTS]).limits.max_wait_seconds == 0.04
    assert settings.group_consumer("deletion", [DELETION_ACKS]).limits.max_wait_seconds == 0.25
    both = [DELETION_REQUESTS, DELETION_ACKS]  # one consumer for both: the acks' pace
    assert settings.group_consumer("deletion", both).limits.max_wait_seconds == 0.25
    assert settings.group_consumer("deletion").limits.max_wait_seconds == 0.25


# -- against the real broker -----------------------------------------------------------------


@dataclass
class Recorder:
    """A handler that records what it applied, slowly enough that rebalances land mid-batch."""

    name: str = "recorder"
    seconds_per_batch: float = 0.0
    applied: list[tuple[int, int]] = field(default_factory=list)

    async def apply(self, messages: Sequence[InputMessage], isolation: Isolation) -> object:
        await asyncio.sleep(self.seconds_per_batch)
        self.applied.extend((m.partition, m.offset) for m in messages)
        return None


def group_settings(env: Any, max_events: int = 50) -> GroupConsumerSettings:
    limits = BatchLimits(max_events=max_events, max_wait_seconds=0.05, max_bytes=1 << 20)
    return GroupConsumerSettings(env.settings.group_id("consumer-test"), limits, 6.0, 10.0)


def group_members(env: Any, group: str) -> int:
    admin = AdminClient(admin_config(env.settings.kafka_bootstrap))
    description = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
    return len(description.members)


def produce_numbered(env: Any, first: int, count: int) -> None:
    env.produce(
        env.topic(MEMORY_EVENTS), ((f"k{i}".encode(), b"v") for i in range(first, first + count))
    )


async def until(check: Callable[[], bool], what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@dataclass
class Member:
    """One source run by a batch loop, as a worker runs it."""

    source: KafkaBatchSource
    handler: Recorder
    loop: BatchLoop
    task: asyncio.Task[None] | None = None

    @classmethod
    async def join(cls, env: Any, handler: Recorder, state: WorkerState) -> Member:
        topic = env.topic(MEMORY_EVENTS)
        membership = state.member("agent")
        source = KafkaBatchSource(env.settings.kafka, [topic], group_settings(env), membership)
        member = cls(source, handler, loop_for(handler, Stops()))
        await source.start()
        member.task = asyncio.create_task(member.loop.run(source))
        return member

    async def leave(self) -> None:
        await self.loop.drain(10)
        await self.source.commit()
        assert self.task is not None
        self.task.cancel()
        await asyncio.wait((self.task,))
        await self.source.close()


@pytest.mark.integration
def test_batches_are_bounded_and_offsets_committed_only_once_acknowledged(env: Any) -> None:
    topic = env.topic(MEMORY_EVENTS)
    group = group_settings(env, max_events=40)
    produce_numbered(env, 0, 300)
    bootstrap = env.settings.kafka_bootstrap

    async def run() -> tuple[list[int], dict[int, int], dict[int, int], int]:
        state = WorkerState(None, in_group=True)
        source = KafkaBatchSource(env.settings.kafka, [topic], group, state.member("agent"))
        await source.start()
        taken: list[Batch] = []
        batches = source.batches()
        async for batch in batches:
            taken.append(batch)
            if sum(len(b.messages) for b in taken) == 300:
                break
        assert state.membership is not None and state.membership.assigned
        before = committed_offsets(bootstrap, group.group_id, topic)
        for batch in taken:
            await source.ack(batch)
        await source.commit()
        after = committed_offsets(bootstrap, group.group_id, topic)
        await batches.aclose()
        await source.close()
        return [len(b.messages) for b in taken], before, after, group_members(env, group.group_id)

    sizes, before, after, members = asyncio.run(run())
    assert max(sizes) <= 40
    assert set(before.values()) == {0}  # nothing acknowledged: nothing committed
    assert after == end_offsets(bootstrap, topic)
    assert members == 0  # closed: it left the group at once


@pytest.mark.integration
def test_a_member_joining_and_one_leaving_lose_nothing_and_apply_nothing_twice(env: Any) -> None:
    total = 3000

    async def run() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        first_state, second_state = WorkerState(None, True), WorkerState(None, True)
        first_handler = Recorder(seconds_per_batch=0.05)
        second_handler = Recorder(seconds_per_batch=0.05)
        produce_numbered(env, 0, 1000)
        first = await Member.join(env, first_handler, first_state)
        await until(lambda: len(first_handler.applied) >= 200, "the first member applying")
        second = await Member.join(env, second_handler, second_state)
        produce_numbered(env, 1000, 1000)

        def owned(member: Member) -> bool:
            return 0 < len(member.source.owned) < MEMORY_EVENTS.partitions

        await until(lambda: owned(first) and owned(second), "the partitions shared")
        await until(
            lambda: len(first_handler.applied) + len(second_handler.applied) >= 1500,
            "both applying",
        )
        await first.leave()  # mid-stream: its partitions move to the second
        produce_numbered(env, 2000, 1000)
        await until(
            lambda: len(set(first_handler.applied) | set(second_handler.applied)) >= total,
            "everything applied",
        )
        await until(lambda: len(second.source.owned) == MEMORY_EVENTS.partitions, "takeover")
        await until(
            lambda: second_state.membership is not None and not second_state.membership.rebalancing,
            "the rebalance done",
        )
        await second.leave()
        return first_handler.applied, second_handler.applied

    first, second = asyncio.run(run())
    both = first + second
    assert len(set(both)) == total  # nothing lost
    assert len(both) == total, "a message was applied by both members, or twice"
    assert first and second


@pytest.mark.integration
def test_a_member_with_no_partition_is_ready_and_takes_over_when_the_other_leaves(
    env: Any,
) -> None:
    """More members than partitions: the idle one is ready (an empty assignment completed)."""
    topic = env.topic(MEMORY_EVENTS) + ".dlq"  # one partition
    group = group_settings(env)

    async def run() -> tuple[bool, bool, int]:
        states = [WorkerState(None, True), WorkerState(None, True)]
        sources = [
            KafkaBatchSource(env.settings.kafka, [topic], group, s.member("agent")) for s in states
        ]
        handlers = [Recorder(), Recorder()]
        loops = [loop_for(handler, Stops()) for handler in handlers]
        tasks = []
        for source, loop in zip(sources, loops, strict=True):
            await source.start()
            tasks.append(asyncio.create_task(loop.run(source)))

        def ready(state: WorkerState) -> bool:
            membership = state.membership
            return membership is not None and membership.check().ok

        await until(lambda: all(ready(s) for s in states), "both members ready")
        owners = [len(source.owned) for source in sources]
        idle = owners.index(0)
        busy = 1 - idle
        both_ready = all(ready(s) for s in states)
        await loops[busy].drain(5)
        tasks[busy].cancel()
        await sources[busy].close()
        env.produce(topic, [(b"k", b"v")])
        await until(lambda: len(handlers[idle].applied) == 1, "the idle member taking over")
        took_over = ready(states[idle]) and len(sources[idle].owned) == 1
        tasks[idle].cancel()
        await sources[idle].close()
        return both_ready, took_over, sorted(owners)[1]

    both_ready, took_over, owned = asyncio.run(run())
    assert both_ready and owned == 1
    assert took_over
