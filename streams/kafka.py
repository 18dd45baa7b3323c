"""confluent-kafka adapters: topic administration and a publisher that confirms delivery."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from projections.outbox import OutboxMessage
from streams.kafka_security import KafkaCluster, KafkaSecurityError
from topics.messages import InputMessage, header_pairs
from topics.registry import MESSAGE_MAX_BYTES, TopicNames, TopicReplication, TopicSpec

log = logging.getLogger(__name__)


class PublishFailed(RuntimeError):
    pass


# Where a client connects: the settings' ``KafkaCluster`` (``Settings.kafka``: bootstrap and
# security), or a bare bootstrap string, which means PLAINTEXT (tests and the local demo).
KafkaTarget = KafkaCluster | str


def failed(error: KafkaError, where: str) -> KafkaException:
    """``error`` (met reading a message or metadata) as a client raises it, saying where:
    its code kept, so that a refusal is told as one (``KafkaCluster.unavailable``)."""
    return KafkaException(KafkaError(error.code(), f"{where}: {error.str()}"))


def as_cluster(target: KafkaTarget) -> KafkaCluster:
    return KafkaCluster(target) if isinstance(target, str) else target


def client_config(target: KafkaTarget) -> dict[str, Any]:
    """Bootstrap servers, security settings and the fatal-error callback of every client."""
    return as_cluster(target).client_config()


# What every producer memproj builds asks of Kafka, whatever else it overrides: a write is
# acknowledged once every in-sync replica has it (at least the topic's min.insync.replicas),
# and a retry after a lost acknowledgement (a leader that failed over) is not written twice;
# idempotence also keeps per-partition order.
DURABLE_PRODUCER: dict[str, object] = {"acks": "all", "enable.idempotence": True}


class WeakerDurability(ValueError):
    """A producer configuration that would lower ``DURABLE_PRODUCER``."""


def producer_config(bootstrap: KafkaTarget, **overrides: object) -> dict[str, object]:
    """The configuration of every confluent-kafka Producer memproj creates (plain or
    transactional): ``overrides`` tune it, but never lower its durability."""
    weaker = sorted(
        name
        for name, value in overrides.items()
        if name in DURABLE_PRODUCER and value != DURABLE_PRODUCER[name]
    )
    if weaker:
        raise WeakerDurability(f"producer settings {weaker} are fixed: {DURABLE_PRODUCER}")
    config: dict[str, object] = {
        **client_config(bootstrap),
        "linger.ms": 5,
        "compression.type": "lz4",
        "message.max.bytes": MESSAGE_MAX_BYTES,
    }
    config.update(overrides)
    config.update(DURABLE_PRODUCER)
    return config


def consumer_config(bootstrap: KafkaTarget, **overrides: object) -> dict[str, object]:
    """The configuration of every confluent-kafka Consumer memproj creates."""
    config: dict[str, object] = {
        **client_config(bootstrap),
        # Contract 1.1: an aborted transaction's events are never applied. librdkafka's
        # default is read_committed too; it is said here because the contract depends on it.
        "isolation.level": "read_committed",
    }
    config.update(overrides)
    return config


def input_message(message: Message) -> InputMessage:
    """A consumed message (without error) as the loop and the runners take it."""
    topic, partition, offset = message.topic(), message.partition(), message.offset()
    assert topic is not None and partition is not None and offset is not None
    return InputMessage(
        topic, partition, offset, message.key(), message.value(), header_pairs(message.headers())
    )


# How often ``gather`` asks the consumer for what has arrived.
GATHER_POLL_SECONDS = 0.05


def gather(
    consumer: Consumer, count: int, timeout: float, done: Callable[[], bool]
) -> Iterator[Message]:
    """What ``consumer.consume(count, timeout)`` returns, but asked for every
    GATHER_POLL_SECONDS, and ended as soon as ``done()`` (checked between the asks) says that
    nothing more is wanted. consume() returns only once it has the whole batch or its timeout
    has passed: a read of fewer messages than a batch would otherwise end a timeout after its
    last message. A large read still gets batches of ``count``."""
    deadline = time.monotonic() + timeout
    taken = 0
    while taken < count and not done():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        for message in consumer.consume(count - taken, timeout=min(GATHER_POLL_SECONDS, left)):
            taken += 1
            yield message


def admin_config(bootstrap: KafkaTarget, **overrides: object) -> dict[str, Any]:
    """The configuration of every confluent-kafka AdminClient memproj creates (``Any``: its
    type stubs allow no callback, but librdkafka takes ``error_cb`` from every client)."""
    config = client_config(bootstrap)
    config.update(overrides)
    return config


class KafkaPublisher:
    """Publishes a batch and returns only once the broker has every message."""

    def __init__(self, bootstrap: KafkaTarget, **overrides: object) -> None:
        self._producer = Producer(producer_config(bootstrap, **overrides))

    def publish_sync(self, messages: Sequence[OutboxMessage], timeout: float = 30.0) -> None:
        errors: list[KafkaError] = []

        def on_delivery(error: KafkaError | None, _message: object) -> None:
            if error is not None:
                errors.append(error)

        for message in messages:
            while True:
                try:
                    self._producer.produce(
                        message.topic,
                        message.value,
                        message.key,
                        headers=[(name, value.encode()) for name, value in message.headers],
                        on_delivery=on_delivery,
                    )
                    break
                except BufferError:
                    # The local queue is full: let deliveries drain it, then go on.
                    self._producer.poll(0.1)
        remaining = self._flush(timeout)
        if remaining:
            # Wait until nothing is in flight before failing (librdkafka fails a message by
            # ``message.timeout.ms`` at the latest): a caller that gives up releases the
            # outbox rows' locks, and an erased value still in flight would then land after
            # the erasure's null (``projections.outbox.publish_outbox_batch``).
            self._producer.flush()
            raise PublishFailed(f"{remaining} messages not delivered within {timeout}s")
        if errors:
            raise PublishFailed(f"{len(errors)} messages failed: {errors[0]}")

    def _flush(self, timeout: float) -> int:
        """``flush`` in steps: the error callback's ``KafkaSecurityError`` (Kafka refusing
        the producer) surfaces at the end of the step that served it, not of ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = self._producer.flush(min(0.5, max(0.0, deadline - time.monotonic())))
            if not remaining or time.monotonic() >= deadline:
                return int(remaining)

    async def publish(self, messages: Sequence[OutboxMessage]) -> None:
        if messages:
            await asyncio.to_thread(self.publish_sync, messages)

    def close(self) -> None:
        self._producer.flush(10)


class DeliveringProducer:
    """Produces one message at a time from asyncio code and awaits its delivery: what the
    HTTP API's writes answer only once the broker has the message. A thread of its own serves
    librdkafka's delivery callbacks (``poll``), each resolving its message's future on the
    caller's event loop, so that no caller waits for other callers' messages (as a ``flush``
    would). librdkafka gives up on a message after ``delivery_timeout`` seconds, and
    ``deliver`` waits at most that long (a bit more): a failed or timed-out delivery raises
    ``PublishFailed``.

    Kafka refusing the producer (a wrong password, an untrusted certificate) does not end
    that thread: librdkafka keeps reconnecting, the refusal is kept for ``answer`` (the API's
    readiness) until Kafka answers or delivers again, and messages wait for it as for a
    broker that is away."""

    def __init__(
        self, bootstrap: KafkaTarget, delivery_timeout: float = 30.0, **overrides: object
    ) -> None:
        cluster = as_cluster(bootstrap)
        self._timeout = delivery_timeout
        # Written by the poller thread (the error callback), read by ``answer``.
        self._refused: KafkaSecurityError | None = None
        self._producer = Producer(
            producer_config(
                cluster,
                **{"linger.ms": 1, "delivery.timeout.ms": int(delivery_timeout * 1000)},
                error_cb=cluster.error_callback(self._on_refused),
                **overrides,
            )
        )
        self._closing = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="kafka-delivery", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._closing.is_set():
            try:
                self._producer.poll(0.1)
            except Exception as exc:  # a callback that failed: the thread serves on
                log.error("kafka-delivery: a callback failed (%s)", type(exc).__name__)

    def _on_refused(self, refused: KafkaSecurityError) -> None:
        if self._refused is None:
            log.error("%s: writes wait until Kafka accepts the producer (not ready)", refused)
        self._refused = refused

    def _accepted(self) -> None:
        if self._refused is not None:
            self._refused = None
            log.warning("Kafka accepts the producer again (ready)")

    def answer(self, timeout: float) -> str | None:
        """None if Kafka answers a metadata request over this producer's connections now;
        else why not, naming no host: the refusal librdkafka reported, or no answer."""
        try:
            self._producer.list_topics(timeout=timeout)
        except KafkaException as exc:
            refused = self._refused
            if refused is not None:
                return f"refused ({refused.reason})"
            error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            return f"unreachable ({error.name() if error is not None else type(exc).__name__})"
        self._accepted()
        return None

    async def deliver(
        self, topic: str, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]] = ()
    ) -> None:
        loop = asyncio.get_running_loop()
        delivered: asyncio.Future[KafkaError | None] = loop.create_future()

        def settle(error: KafkaError | None) -> None:
            if not delivered.done():
                delivered.set_result(error)

        def on_delivery(error: KafkaError | None, _message: object) -> None:
            if error is None:
                self._accepted()
            loop.call_soon_threadsafe(settle, error)

        while True:
            try:
                self._producer.produce(
                    topic, value, key, headers=list(headers), on_delivery=on_delivery
                )
                break
            except BufferError:  # the local queue is full: the poller drains it
                await asyncio.sleep(0.01)
            except KafkaException as exc:  # refused at once (too large, unknown topic, ...)
                raise PublishFailed(f"not produced to {topic}: {exc.args[0].str()}") from None
        try:
            error = await asyncio.wait_for(delivered, self._timeout + 5.0)
        except TimeoutError:
            raise PublishFailed(f"not delivered to {topic} within {self._timeout}s") from None
        if error is not None:
            raise PublishFailed(f"not delivered to {topic}: {error.str()}")

    def close(self, timeout: float = 10.0) -> None:
        self._closing.set()
        self._poller.join()
        self._producer.flush(timeout)


@dataclass(frozen=True, slots=True)
class TopicCreation:
    name: str
    created: bool
    detail: str  # created, exists or updated
    # For an existing topic brought up to the registry: "name: old -> new", one per config.
    changes: tuple[str, ...] = ()


def config_changes(wanted: Mapping[str, str], current: Mapping[str, str | None]) -> dict[str, str]:
    """The configs of ``wanted`` whose value on the broker differs (or is unset)."""
    return {name: value for name, value in wanted.items() if current.get(name) != value}


def create_topics(
    bootstrap: KafkaTarget,
    names: TopicNames,
    specs: Iterable[TopicSpec],
    replication: TopicReplication,
    timeout: float = 30.0,
) -> list[TopicCreation]:
    """Create every topic that does not exist yet, with ``replication``, and bring the configs
    of those that do up to the registry and ``min.insync.replicas`` (an incremental alter of
    only what differs, so that an upgrade gets new lifetimes; configs the registry does not
    name are left as the operator set them). An existing topic keeps its replication factor:
    changing it is a partition reassignment, an operator's step (docs/operations.md)."""
    specs = list(specs)
    admin = AdminClient(admin_config(bootstrap))
    existing = set(admin.list_topics(timeout=timeout).topics)
    wanted = [spec for spec in specs if names.name(spec) not in existing]
    results = align_topic_configs(
        admin,
        names,
        [spec for spec in specs if names.name(spec) in existing],
        replication,
        timeout,
    )
    if not wanted:
        return sorted(results, key=lambda result: result.name)
    futures = admin.create_topics(
        [
            NewTopic(
                names.name(spec),
                num_partitions=spec.partitions,
                replication_factor=replication.factor,
                config=topic_config(spec, replication),
            )
            for spec in wanted
        ],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    for name, future in futures.items():
        try:
            future.result()
            results.append(TopicCreation(name, True, "created"))
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
            results.append(TopicCreation(name, False, "exists"))
    return sorted(results, key=lambda result: result.name)


def topic_config(spec: TopicSpec, replication: TopicReplication) -> dict[str, str]:
    """The configs memproj gives a topic: the registry's and the replication's."""
    return {**spec.config(), **replication.config()}


def align_topic_configs(
    admin: AdminClient,
    names: TopicNames,
    specs: Sequence[TopicSpec],
    replication: TopicReplication,
    timeout: float = 30.0,
) -> list[TopicCreation]:
    """Set, on existing topics, every config of ``topic_config`` whose value differs on the
    broker."""
    if not specs:
        return []
    resources = [ConfigResource(ResourceType.TOPIC, names.name(spec)) for spec in specs]
    described = admin.describe_configs(resources, request_timeout=timeout)
    current = {
        resource.name: {name: entry.value for name, entry in future.result().items()}
        for resource, future in described.items()
    }
    changes = {
        names.name(spec): config_changes(topic_config(spec, replication), current[names.name(spec)])
        for spec in specs
    }
    alters = [
        ConfigResource(
            ResourceType.TOPIC,
            name,
            incremental_configs=[
                ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
                for key, value in sorted(changed.items())
            ],
        )
        for name, changed in changes.items()
        if changed
    ]
    if alters:
        for future in admin.incremental_alter_configs(alters, request_timeout=timeout).values():
            future.result()
    return [
        TopicCreation(
            name,
            False,
            "updated" if changed else "exists",
            tuple(
                f"{key}: {current[name].get(key)} -> {value}"
                for key, value in sorted(changed.items())
            ),
        )
        for name, changed in changes.items()
    ]


def delete_topics(bootstrap: KafkaTarget, names: Sequence[str], timeout: float = 60.0) -> None:
    """Delete ``names`` and wait until the broker confirms: the requests of an AdminClient
    destroyed before they are sent are dropped, and the topics would stay."""
    if not names:
        return
    admin = AdminClient(admin_config(bootstrap))
    for deletion in admin.delete_topics(list(names), operation_timeout=timeout).values():
        deletion.result(timeout=timeout)
