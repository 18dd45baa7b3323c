"""The memory projection rebuilt from earliest into an empty shadow, on its own path
(ops/decisions/rebuild.md).

A rebuild from the start of the sealed log writes a shadow nobody else writes but erasures,
and publishes nothing. ``MemoryRebuild`` applies it in large chunks, one transaction each,
with the live path's codec, erasure guard and pure reducer, and drops the work whose output
a rebuild throws away or already has:

- no outbox: neither ``memory.current`` nor the rejections are encoded or staged (a rebuild
  published them when the events first came); a message that would be a dead letter stops
  the rebuild (``ReplayStopped``), as the runner's ``DiscardingPublisher`` does;
- the current records and the processed event ids are held in memory across chunks instead
  of being read back from the shadow each batch (the rebuild wrote every one of them), and a
  record the shadow does not hold yet is copied in, not upserted;
- no tracking-row locks or redelivery filter: the shadow's partitions are read once, by one
  reader each.

What stays as live, in each chunk's transaction, in the live order: the data keys of the
chunk (``prepare_decode``), the shared tenant locks, the erasures that may cover its events,
the reducer, the processed ids and rejections (which a swap takes over), the shadow's offsets
in the sealed log (taken over only where the live worker reads the sealed log: the rule in
``streams.replay``), and the projection's effects beyond its tables (revocations in the
ledger, refused data keys destroyed).

Erasures: an erasure removes what it covers from the shadow in its own transaction, holding
its tenants' locks exclusively (``projections.rebuilds``). After taking the shared locks a
chunk reads a digest of the erasure ledger; when it changed since the previous chunk, the
records held in memory may be gone from the shadow, so they are forgotten and read back from
the shadow as the live path reads them (then held again). An erasure therefore reaches the
chunks after it exactly as it reaches the live worker's next batch.

Memory: beyond ``held_limit`` records or claims, what is held is dropped and read per chunk
from the shadow and ``processed_events``, as the live path reads it.

Parallel readers: ``MemoryRebuild`` applies whatever partitions it is given; the replay runs
one per process over disjoint partitions (``streams.replay_processes``). A memory lives in
one partition; an event id two partitions share is claimed by whichever commits first, and the
other chunk is retried after reading the claim (``ConcurrentClaim``), as between two live
workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from projections import bookkeeping, rejections
from projections.deletion import guard as erasure_guard
from projections.idempotency import EventKey
from projections.memory import store
from projections.memory.evolve import MemoryKey
from projections.memory.projection import MemoryProjection
from projections.memory.reducer import BatchResult
from projections.rejections import RejectionRow
from projections.sql import Conn
from streams.failures import Explained, retry_transient
from topics.codec import InvalidMessage
from topics.memory import MemoryEvent
from topics.messages import InputMessage
from topics.outputs import MemoryRecord


class ReplayStopped(Explained, RuntimeError):
    """The rebuild cannot go on or cannot swap: the log holds a message it cannot apply (e.g.
    an unknown schema version), or a worker still writes the store it would replace. Its text
    names the message by position and code, never by what it holds."""


def cannot_apply(topic: str, partition: int, offset: int, code: str, error: str) -> ReplayStopped:
    """What stops a rebuild at a message it cannot apply: live, a dead letter. ``error`` is
    content-free (a dead letter's ``error``, an exception's class)."""
    return ReplayStopped(
        f"{topic}[{partition}]@{offset} cannot be applied ({code}: {error}). If it is a newer"
        " schema_version, upgrade memproj (or register an upcaster in topics/schemas.py) and"
        " replay again; nothing was swapped."
    )


@dataclass(frozen=True, slots=True)
class _Chunk:
    """A chunk's result, kept in memory once its transaction commits."""

    outcome: BatchResult
    loaded: dict[MemoryKey, MemoryRecord]  # rows read back from the shadow
    loaded_heads: dict[MemoryKey, MemoryRecord]  # their held heads
    keys: set[MemoryKey]  # every memory the chunk touched: known from now on
    claimed: dict[EventKey, bytes]  # other readers' claims it read
    erasures: tuple[int, int]
    erased_since: bool


@dataclass(slots=True)
class MemoryRebuild:
    """The state a rebuild carries from chunk to chunk, and how it applies one."""

    projection: MemoryProjection
    # The shadow's current records, as the last committed chunk left them.
    records: dict[MemoryKey, MemoryRecord] = field(default_factory=dict)
    # The held or rejected heads above them, where there are.
    heads: dict[MemoryKey, MemoryRecord] = field(default_factory=dict)
    # Keys whose row in the shadow is known (in ``records``, or known absent). Until an
    # erasure comes, every key is: the shadow started empty and only this rebuild wrote it.
    known: set[MemoryKey] = field(default_factory=set)
    every_key_known: bool = True
    # The event ids this rebuild claimed; until it holds too many, all of them.
    seen: dict[EventKey, bytes] = field(default_factory=dict)
    every_claim_held: bool = True
    erasures: tuple[int, int] | None = None
    applied: int = 0
    # Beyond this many records or claims held, they are dropped and read from the shadow
    # per chunk, as the live path reads them: a rebuild's memory stays bounded.
    held_limit: int = 250_000

    async def apply(self, conn: Conn, messages: Sequence[InputMessage]) -> None:
        """Apply one chunk in one transaction (retried whole on a transient failure); what
        it leaves in memory is kept once it is committed."""
        consult_claims = not self.every_claim_held

        async def attempt() -> _Chunk:
            nonlocal consult_claims
            try:
                async with conn.transaction():
                    return await self._apply_in(conn, messages, consult_claims)
            except bookkeeping.ConcurrentClaim:
                consult_claims = True  # another reader claimed an id: read the claims
                raise

        chunk = await retry_transient(f"{self.projection.name}: rebuild chunk", attempt)
        self.erasures = chunk.erasures
        if chunk.erased_since:
            # An erasure may have removed rows held here from the shadow: they were read
            # again (``loaded``), and the rest is unknown until read.
            self.records.clear()
            self.heads.clear()
            self.known.clear()
            self.every_key_known = False
        self.records.update(chunk.loaded)
        self.heads.update(chunk.loaded_heads)
        self.records.update(chunk.outcome.records)
        for key, head in chunk.outcome.heads.items():
            if head is None:
                self.heads.pop(key, None)
            else:
                self.heads[key] = head
        self.known |= chunk.keys
        if self.every_claim_held:
            self.seen.update(chunk.claimed)
        self.seen.update(((p.tenant_id, p.event_id), p.body_hash) for p in chunk.outcome.processed)
        if len(self.known) > self.held_limit:
            self.records.clear()
            self.heads.clear()
            self.known.clear()
            self.every_key_known = False
        if len(self.seen) > self.held_limit:
            self.seen.clear()
            self.every_claim_held = False
        self.applied += len(messages)
        self.projection.committed(chunk.outcome)

    async def _apply_in(
        self, conn: Conn, messages: Sequence[InputMessage], consult_claims: bool
    ) -> _Chunk:
        projection = self.projection
        await projection.prepare_decode(conn, messages)
        events, positions = self._decode(messages)
        # As ``MemoryProjection.load``: the shared tenant locks first, then what an erasure
        # may have changed is read.
        await erasure_guard.lock_tenants(conn, (e.tenant_id for e in events), exclusive=False)
        digest = await erasure_guard.erasure_digest(conn)
        erased_since = self.erasures is not None and digest != self.erasures
        keys = {(e.tenant_id, e.memory_id) for e in events}
        records: dict[MemoryKey, MemoryRecord] = {} if erased_since else self.records
        heads: dict[MemoryKey, MemoryRecord] = {} if erased_since else self.heads
        loaded: dict[MemoryKey, MemoryRecord] = {}
        loaded_heads: dict[MemoryKey, MemoryRecord] = {}
        if erased_since or not self.every_key_known:
            unknown = keys if erased_since else keys - self.known
            loaded = await store.load_records(conn, unknown, projection.lookups)
            loaded_heads = await store.load_heads(conn, loaded, projection.lookups)
            records = records | loaded
            heads = heads | loaded_heads
        state = await projection.state_of(conn, events, records, heads)
        claimed: dict[EventKey, bytes] = {}
        if consult_claims:
            claimed = await bookkeeping.load_seen(
                conn,
                projection.name,
                [(e.tenant_id, e.event_id) for e in events],
                projection.lookups,
            )
        outcome = projection.reduce(events, state, self.seen | claimed if claimed else self.seen)
        await bookkeeping.claim_processed(conn, projection.name, outcome.processed)
        stored = {key for key in outcome.records if key in records}
        await store.save_rebuilt_batch(conn, outcome, stored)
        await projection.save_effects(conn, outcome)
        await rejections.record_rejections(
            conn,
            projection.name,
            [
                RejectionRow(rejection, *positions[(rejection.tenant_id, rejection.event_id)])
                for rejection in outcome.rejections
            ],
        )
        await bookkeeping.save_offsets(conn, projection.name, _next_offsets(messages))
        return _Chunk(outcome, loaded, loaded_heads, keys, claimed, digest, erased_since)

    def _decode(
        self, messages: Sequence[InputMessage]
    ) -> tuple[list[MemoryEvent], dict[EventKey, tuple[str, int, int]]]:
        codec = self.projection.codec
        events: list[MemoryEvent] = []
        positions: dict[EventKey, tuple[str, int, int]] = {}
        for message in messages:
            try:
                event = codec.decode(message.key, message.value, message.topic)
            except InvalidMessage as invalid:
                raise cannot_apply(
                    message.topic,
                    message.partition,
                    message.offset,
                    invalid.code.value,
                    "the detail may quote the message: withheld",
                ) from invalid
            events.append(event)  # type: ignore[arg-type]
            positions.setdefault(
                (event.tenant_id, event.event_id),
                (message.topic, message.partition, message.offset),
            )
        return events, positions


def _next_offsets(messages: Sequence[InputMessage]) -> dict[tuple[str, int], int]:
    next_offsets: dict[tuple[str, int], int] = {}
    for message in messages:
        position = (message.topic, message.partition)
        next_offsets[position] = max(next_offsets.get(position, 0), message.offset + 1)
    return next_offsets
