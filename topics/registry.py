"""Every topic of the wire contract, in one place.

The registry is the single source for names, keys, partition counts and retention; topic
creation, the workers, the docker-compose consistency test and the README all read it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

MINUTE_MS = 60 * 1000
DAY_MS = 24 * 60 * MINUTE_MS
DLQ_SUFFIX = ".dlq"
# How long a dead letter can be opened, and kept: the DLQ topics' retention and the expiry of
# each letter's data key (projections.deadletters) are both this window. A week leaves time to
# diagnose and replay a failure after a weekend; a letter that names its owner is destroyed
# with the owner's erasure long before.
DEAD_LETTER_RETENTION_MS = 7 * DAY_MS
# The largest message memproj produces (key, value and headers): librdkafka's default
# ``message.max.bytes``, set explicitly by every producer. An output that would be larger is
# not produced: the input that led to it becomes a dead letter.
MESSAGE_MAX_BYTES = 1_000_000


@dataclass(frozen=True, slots=True)
class TopicReplication:
    """How many brokers hold each partition of memproj's topics (``factor``), and how many of
    them must have a write before the broker acknowledges it (``min_insync``: every producer
    asks for ``acks=all``). One and one on a single broker; three and two on a cluster, where
    one broker may fail without losing or refusing a write."""

    factor: int = 1
    min_insync: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.min_insync <= self.factor:
            raise ValueError(
                f"min.insync.replicas ({self.min_insync}) must be between 1 and the replication"
                f" factor ({self.factor}): a write could never be acknowledged"
            )

    def config(self) -> dict[str, str]:
        """The topic configs it sets (the factor itself is given at creation only)."""
        return {"min.insync.replicas": str(self.min_insync)}


class TopicRole(StrEnum):
    INPUT = "input"
    OUTPUT = "output"
    DEAD_LETTER = "dead_letter"


class CleanupPolicy(StrEnum):
    DELETE = "delete"
    COMPACT = "compact"


@dataclass(frozen=True, slots=True)
class TopicSpec:
    base_name: str
    key: str
    role: TopicRole
    partitions: int
    cleanup_policy: CleanupPolicy
    # None keeps data forever (compacted topics hold the latest value per key).
    retention_ms: int | None
    description: str
    # Further topic configs that bound how long a record stays readable (``memory.current``'s
    # compaction), as (name, value) pairs; ``memproj topics create`` brings them to existing
    # topics too.
    lifetime: tuple[tuple[str, str], ...] = ()

    def config(self) -> dict[str, str]:
        config = {"cleanup.policy": self.cleanup_policy.value}
        config["retention.ms"] = "-1" if self.retention_ms is None else str(self.retention_ms)
        if self.cleanup_policy is CleanupPolicy.COMPACT:
            # Let tombstones (null values) linger long enough for readers to see them.
            config["delete.retention.ms"] = str(DAY_MS)
        config.update(self.lifetime)
        return config


def _input(base_name: str, key: str, description: str, retention_ms: int) -> TopicSpec:
    # Six partitions spread evenly over one, two, three or six workers of a kind.
    return TopicSpec(
        base_name, key, TopicRole.INPUT, 6, CleanupPolicy.DELETE, retention_ms, description
    )


def _sealed(raw: TopicSpec) -> TopicSpec:
    """The long-retention log the projections consume and replay from: the raw events with
    their personal fields sealed by per-entity keys (crypto-shredding)."""
    return TopicSpec(
        raw.base_name + ".sealed",
        raw.key,
        TopicRole.OUTPUT,
        raw.partitions,
        CleanupPolicy.DELETE,
        None,
        f"{raw.base_name}, validated and sealed: what projections consume and replay",
    )


def _dead_letter(source: TopicSpec) -> TopicSpec:
    return TopicSpec(
        source.base_name + DLQ_SUFFIX,
        "the original key",
        TopicRole.DEAD_LETTER,
        1,
        CleanupPolicy.DELETE,
        DEAD_LETTER_RETENTION_MS,
        f"messages from {source.base_name} that are not valid under the contract",
    )


# Raw input holds personal data in plaintext until the sealer has read it: keep it short.
MEMORY_EVENTS = _input(
    "memory.events",
    "tenant_id:memory_id",
    "memory.proposed|verified|corrected|revoked|reviewed",
    DAY_MS,
)
CONVERSATION_EVENTS = _input(
    "conversation.events",
    "tenant_id:conversation_id",
    "conversation.started|message_added|summary_updated",
    DAY_MS,
)
# Requests carry ids and reasons, no personal content; the ledger in PostgreSQL is the record.
DELETION_REQUESTS = _input(
    "deletion.requests", "tenant_id:deletion_id", "deletion.requested", 30 * DAY_MS
)
MEMORY_SEALED = _sealed(MEMORY_EVENTS)
CONVERSATION_SEALED = _sealed(CONVERSATION_EVENTS)

DELETION_TOMBSTONES = TopicSpec(
    "deletion.tombstones",
    "tenant_id:deletion_id",
    TopicRole.OUTPUT,
    3,
    CleanupPolicy.DELETE,
    30 * DAY_MS,
    "deletion.tombstone: the items every derived store must remove",
)
DELETION_ACKS = TopicSpec(
    "deletion.acks",
    "tenant_id:deletion_id",
    TopicRole.OUTPUT,
    3,
    CleanupPolicy.DELETE,
    30 * DAY_MS,
    "deletion.acknowledged: one per store and tombstone",
)
DELETION_STATUS = TopicSpec(
    "deletion.status",
    "tenant_id:deletion_id",
    TopicRole.OUTPUT,
    3,
    CleanupPolicy.COMPACT,
    None,
    "deletion.completed, deletion.overdue or deletion.purged with per-store state",
)
# Compaction of memory.current, bounded so that an erased or superseded value is gone from the
# log well within the deletion SLO (MEMPROJ_DELETION_DEADLINE_SECONDS, 1 h by default). The
# cleaner never touches a partition's active segment, and Kafka rolls a segment only when a
# record is appended once ``segment.ms`` has passed since its first record: the deletion worker
# appends a marker to a quiet partition (``streams.compaction``). A value superseded at t is
# then in a rolled segment by t + 2 * segment.ms + the roll check interval, and
# ``max.compaction.lag.ms`` (<= segment.ms) makes that segment due for cleaning at once,
# whatever its dirty ratio (``min.cleanable.dirty.ratio`` stays at its default: the lag, not
# the ratio, is the bound). ``streams.compaction.compaction_bound_ms`` is the whole sum.
COMPACTION_SEGMENT_MS = 10 * MINUTE_MS
COMPACTION_MAX_LAG_MS = 10 * MINUTE_MS
MEMORY_CURRENT = TopicSpec(
    "memory.current",
    "tenant_id:memory_id",
    TopicRole.OUTPUT,
    3,
    CleanupPolicy.COMPACT,
    None,
    "the current projected memory record; null once it is gone",
    lifetime=(
        ("segment.ms", str(COMPACTION_SEGMENT_MS)),
        ("max.compaction.lag.ms", str(COMPACTION_MAX_LAG_MS)),
        # Every record is cleanable as soon as its segment rolls (the default, stated).
        ("min.compaction.lag.ms", "0"),
    ),
)
MEMORY_REJECTIONS = TopicSpec(
    "memory.rejections",
    "tenant_id:memory_id",
    TopicRole.OUTPUT,
    3,
    CleanupPolicy.DELETE,
    30 * DAY_MS,
    "well-formed events that were refused, with the reason",
)

CONVERSATION_REJECTIONS = TopicSpec(
    "conversation.rejections",
    "tenant_id:conversation_id",
    TopicRole.OUTPUT,
    3,
    CleanupPolicy.DELETE,
    30 * DAY_MS,
    "refused conversation events, with the reason (an addition to the contract)",
)

CONVERSATION_MESSAGES = TopicSpec(
    "conversation.messages",
    "tenant_id:conversation_id",
    TopicRole.OUTPUT,
    6,
    CleanupPolicy.DELETE,
    30 * DAY_MS,
    "projected (redacted) messages, for derived stores such as embeddings (an addition)",
)

DELETION_REJECTIONS = TopicSpec(
    "deletion.rejections",
    "tenant_id:deletion_id",
    TopicRole.OUTPUT,
    3,
    CleanupPolicy.DELETE,
    30 * DAY_MS,
    "refused deletion requests and acknowledgements, with the reason (an addition)",
)

INPUT_TOPICS: tuple[TopicSpec, ...] = (MEMORY_EVENTS, CONVERSATION_EVENTS, DELETION_REQUESTS)
SEALED_TOPICS: tuple[TopicSpec, ...] = (MEMORY_SEALED, CONVERSATION_SEALED)
ALL_TOPICS: tuple[TopicSpec, ...] = (
    *INPUT_TOPICS,
    *SEALED_TOPICS,
    DELETION_TOMBSTONES,
    DELETION_ACKS,
    DELETION_STATUS,
    MEMORY_CURRENT,
    MEMORY_REJECTIONS,
    CONVERSATION_REJECTIONS,
    CONVERSATION_MESSAGES,
    DELETION_REJECTIONS,
    # Every topic a worker consumes gets a dead-letter topic, memproj's own outputs too: a
    # worker never stops on a bad message, whoever wrote it.
    *(
        _dead_letter(spec)
        for spec in (
            *INPUT_TOPICS,
            *SEALED_TOPICS,
            DELETION_TOMBSTONES,
            DELETION_ACKS,
            MEMORY_CURRENT,
            CONVERSATION_MESSAGES,
        )
    ),
)


@dataclass(frozen=True, slots=True)
class TopicNames:
    """Resolves contract topic names under the configured prefix (e.g. ``staging.``)."""

    prefix: str = ""

    def name(self, spec: TopicSpec) -> str:
        return self.prefix + spec.base_name

    def dead_letter(self, spec: TopicSpec) -> str:
        return self.prefix + spec.base_name + DLQ_SUFFIX

    def base_name(self, topic: str) -> str:
        if not topic.startswith(self.prefix):
            raise ValueError(f"topic {topic!r} does not carry the prefix {self.prefix!r}")
        return topic[len(self.prefix) :]


def input_key(tenant_id: str, entity_id: str) -> str:
    """An input topic's message key, ``{tenant_id}:{entity_id}`` as the contract gives it: it
    decides the partition, so one entity stays in order. Input events are checked against it
    (``topics.codec``), and the sealed log keeps it (it is the input, sealed)."""
    return f"{tenant_id}:{entity_id}"


def output_key(tenant_id: str, entity_id: str) -> str:
    """The key memproj writes on its output topics (contract 1.2): the input convention with
    ``%`` and ``:`` escaped in the tenant id (``%25``, ``%3A``). The first colon then ends the
    tenant id, so no two tenants' keys are equal on a compacted topic (tenant ``a`` with
    memory ``b:m`` is ``a:b:m``, tenant ``a:b`` with memory ``m`` is ``a%3Ab:m``). Ids without
    those characters give the input key."""
    return f"{escape_id(tenant_id)}:{entity_id}"


def escape_id(text: str) -> str:
    """An id with ``%`` and ``:`` escaped (``%25``, ``%3A``), so that ids joined by colons
    split back one way only (output keys; the vector store's entry ids)."""
    return text.replace("%", "%25").replace(":", "%3A")


_ESCAPED = re.compile("%(25|3A)")


def unescape_id(text: str) -> str:
    """``escape_id`` undone, in one pass (``%253A`` is ``%3A``, not ``:``)."""
    return _ESCAPED.sub(lambda match: "%" if match.group(1) == "25" else ":", text)


def split_output_key(key: bytes) -> tuple[str, str]:
    """(tenant_id, entity_id) of an output key: split at its first colon, the tenant id
    unescaped. A key written before 1.2 (``input_key``) reads the same unless its tenant id
    holds ``:`` or ``%``. Raises ``UnicodeDecodeError`` for a key that is not UTF-8."""
    tenant_text, _, entity_text = key.decode().partition(":")
    return unescape_id(tenant_text), entity_text


def keys_of(tenant_id: str, entity_id: str) -> tuple[str, ...]:
    """Every key a message about this entity may carry: its output key and, when that
    differs, its input key (the key of input, and of the records memproj wrote on its outputs
    before 1.2, which keep it)."""
    return tuple(dict.fromkeys((output_key(tenant_id, entity_id), input_key(tenant_id, entity_id))))


def is_key_of(key: bytes | None, tenant_id: str, entity_id: str) -> bool:
    """Whether an output message's key is one this entity's messages may carry (``keys_of``):
    a reader checks a key against its message's body."""
    return key is not None and key.decode(errors="replace") in keys_of(tenant_id, entity_id)


Headers = tuple[tuple[str, str], ...]


def entity_headers(tenant_id: str, entity_id: str) -> Headers:
    """The ids of a keyed output message, as they are: a null-valued tombstone has nothing
    else to read them from, and a key written before 1.2 cannot be split back when the
    tenant id holds a colon."""
    return (("tenant_id", tenant_id), ("entity_id", entity_id))


def entity_of_message(
    key: bytes | None, headers: Sequence[tuple[str, bytes | str]] | None
) -> tuple[str, str]:
    """(tenant_id, entity_id) of an output message published with ``entity_headers``; one
    without them is read from its key (``split_output_key``)."""
    found = {name: value for name, value in headers or ()}
    tenant_id, entity_id = found.get("tenant_id"), found.get("entity_id")
    if tenant_id is not None and entity_id is not None:
        return _text(tenant_id), _text(entity_id)
    return split_output_key(key or b"")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
