"""Freshness: how long after it is produced an event is visible to ``recall``.

``recall`` (streams/reads.py) answers from the memories table, the projection's current
records (the cache holds only what recall itself read before, and is invalidated through
memory.current), so an event is visible once its memory's row holds the event's version or a
later one. The benchmark produces at a fixed rate (half the live apply rate it measured
earlier in the run) and polls the table for a sample of the events; each sample's latency is
from the moment it was handed to the producer to the first poll that saw its version.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from environment import Message, PacedProducer, percentile, rounded_ms  # ops/bench/environment.py

from projections.memory.reducer import reduce_batch
from streams.sample import SampleMessage
from streams.settings import Settings
from topics.codec import EventCodec, InvalidMessage
from topics.schemas import default_schemas

TARGET_P99_MS = 300.0  # the hot path's freshness target
POLL_SECONDS = 0.02  # the latencies are this much coarse, at most
SAMPLES_PER_SECOND = 50

MemoryVersionKey = tuple[str, str, int]  # tenant, memory, version


def versions_made(stream: Sequence[SampleMessage]) -> dict[int, MemoryVersionKey]:
    """Message index -> the memory version it makes, for every message that makes one
    (not the refused, the dead-lettered or the redelivered), computed offline. The stream's
    own expectations say what the memory workers dead-letter when they seal it: some of it (a
    value over the size limit) decodes here."""
    schemas = default_schemas()
    codec = EventCodec(schemas, frozenset(t for t in schemas.event_types() if "memory." in t))
    indexes: dict[str, int] = {}
    events = []
    for index, message in enumerate(stream):
        if message.expectation.startswith("dlq:"):
            continue
        try:
            event = codec.decode(message.key, message.value)
        except InvalidMessage:
            continue
        indexes.setdefault(event.event_id, index)  # a redelivery makes nothing new
        events.append(event)
    result = reduce_batch(events, {}, {})  # type: ignore[arg-type]
    return {
        indexes[version.event_id]: (
            version.record.tenant_id,
            version.record.memory_id,
            version.record.version,
        )
        for version in result.versions
    }


@dataclass(frozen=True)
class Freshness:
    rate: float
    seconds: float
    sampled: int
    latencies_ms: list[float]
    not_visible: int  # sampled events never seen within the deadline

    @property
    def p50_ms(self) -> float:
        return percentile(self.latencies_ms, 0.50)

    @property
    def p99_ms(self) -> float:
        return percentile(self.latencies_ms, 0.99)

    def as_json(self) -> dict[str, object]:
        return {
            "rate_events_per_s": round(self.rate),
            "seconds": round(self.seconds, 1),
            "sampled": self.sampled,
            "visible": len(self.latencies_ms),
            "not_visible": self.not_visible,
            "p50_ms": rounded_ms(self.p50_ms),
            "p99_ms": rounded_ms(self.p99_ms),
            "max_ms": rounded_ms(max(self.latencies_ms, default=math.nan)),
            "target_p99_ms": TARGET_P99_MS,
        }


def measure_freshness(
    settings: Settings,
    messages: Sequence[Message],
    made: dict[int, MemoryVersionKey],
    rate: float,
    seconds: float,
    deadline_seconds: float = 60.0,
) -> tuple[Freshness, int]:
    """Produce ``messages`` at ``rate`` for ``seconds`` into a running pipeline and measure
    the sampled events' latency; also returns how many messages were produced."""
    every = max(1, round(rate / SAMPLES_PER_SECOND))
    # The producer's warm-up messages are delivered before the clock starts: not sampled.
    candidates = sorted(index for index in made if index >= PacedProducer.WARM_UP)
    sampled = set(candidates[::every])
    producer = PacedProducer(settings, messages, rate).start()
    seen_at: dict[int, float] = {}
    started = time.monotonic()
    with psycopg.connect(settings.postgres_conninfo, autocommit=True) as conn:
        stopped_at: float | None = None
        while True:
            now = time.monotonic()
            if stopped_at is None and now - started >= seconds:
                producer.stop()
                stopped_at = now
            produced = producer.sent
            pending = [i for i in sampled if i < produced and i not in seen_at]
            if stopped_at is not None and not pending:
                break
            if stopped_at is not None and now - stopped_at > deadline_seconds:
                break
            if pending:
                _poll(conn, made, pending, seen_at)
            time.sleep(POLL_SECONDS)
    produced = producer.sent
    counted = [i for i in sampled if i < produced]
    latencies = [1000 * (seen_at[i] - producer.produced_at[i]) for i in counted if i in seen_at]
    elapsed = (stopped_at or time.monotonic()) - started
    result = Freshness(
        produced / elapsed, elapsed, len(counted), latencies, len(counted) - len(latencies)
    )
    return result, produced


def _poll(
    conn: psycopg.Connection[tuple[object, ...]],
    made: dict[int, MemoryVersionKey],
    pending: list[int],
    seen_at: dict[int, float],
) -> None:
    tenants = [made[i][0] for i in pending]
    memories = [made[i][1] for i in pending]
    rows = conn.execute(
        "SELECT m.tenant_id, m.memory_id, m.version FROM memories m"
        " JOIN unnest(%s::text[], %s::text[]) AS k(tenant_id, memory_id)"
        " USING (tenant_id, memory_id)",
        (tenants, memories),
    ).fetchall()
    now = time.monotonic()
    current = {(str(t), str(m)): int(str(v)) for t, m, v in rows}
    for index in pending:
        tenant, memory, version = made[index]
        if current.get((tenant, memory), 0) >= version:
            seen_at[index] = now
