"""The agent that keeps the embeddings store in step with the projections.

Each batch of index updates is decided under the shared tenant locks, against the erasure
index and the authoritative versions read in the same transaction (see
``projections.deletion.store``), and written to the vector store before that transaction
ends: a deletion of the tenant either sees these vectors and removes them, or committed first
and they are refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from psycopg_pool import AsyncConnectionPool
from pydantic import ValidationError

from projections.conversation import store as conversation_store
from projections.conversation.published import PublishedMessage, parse_record
from projections.deadletters.sealing import Position
from projections.deletion import guard as erasure_guard
from projections.embeddings.embedder import Embedder
from projections.embeddings.indexer import (
    Authoritative,
    IndexPlan,
    IndexUpdate,
    MemoryUpdate,
    MessageUpdate,
    erasure_keys,
    plan_index,
)
from projections.embeddings.vectors import VectorStore, check_embedder
from projections.memory import store as memory_store
from projections.outbox import OutboxMessage
from projections.sealing.crypto import Unreadable
from projections.sealing.fields import EntityRef, Shredded
from projections.sealing.keys import KeyStore, ever_shredded
from projections.sql import Conn
from streams.isolation import Isolation, position, stage
from streams.metrics import Metrics
from streams.runner import Publisher
from topics.codec import InvalidMessage, encode
from topics.messages import InputMessage
from topics.outputs import DeadLetterReason, MemoryRecord
from topics.registry import (
    CONVERSATION_REJECTIONS,
    MEMORY_CURRENT,
    MEMORY_REJECTIONS,
    TopicNames,
    entity_of_message,
    output_key,
)


class EmbeddingsIndexer:
    def __init__(
        self,
        pool: AsyncConnectionPool[Conn],
        vectors: VectorStore,
        embedder: Embedder,
        publisher: Publisher,
        topics: TopicNames,
        metrics: Metrics,
        writes: asyncio.Lock,
        keys: KeyStore,
    ) -> None:
        check_embedder(vectors, embedder.name)  # a worker never mixes two models' vectors
        self._writes = writes
        self._keys = keys
        self._pool = pool
        self._vectors = vectors
        self._embedder = embedder
        self._publisher = publisher
        self._topics = topics
        self._metrics = metrics
        self._memory_topic = topics.name(MEMORY_CURRENT)

    name = "embeddings-index"

    def decode(self, message: InputMessage) -> IndexUpdate | PublishedMessage:
        """The index update a message of ``memory.current`` or ``conversation.messages``
        carries (or a message still sealed, which ``apply`` opens), or ``InvalidMessage``:
        these are memproj's own outputs, so an unreadable one is a bug or a forgery,
        dead-lettered like any other."""
        try:
            if message.topic == self._memory_topic:
                tenant_id, memory_id = entity_of_message(message.key, message.headers)
                record = MemoryRecord.model_validate_json(message.value) if message.value else None
                return MemoryUpdate(tenant_id, memory_id, record)
            published = parse_record(message.value or b"null")
        except (ValidationError, ValueError, KeyError, TypeError) as exc:
            raise InvalidMessage(DeadLetterReason.INVALID_EVENT, str(exc)[:500]) from exc
        return published if published.sealed is not None else _message_update(published)

    async def apply(self, messages: Sequence[InputMessage], isolation: Isolation) -> None:
        """Index a batch: unreadable messages and those whose update fails are dead-lettered,
        the rest indexed (writing an update twice is harmless, so parts may be redone)."""
        updates: dict[Position, IndexUpdate] = {}
        sealed: dict[Position, PublishedMessage] = {}
        dead: list[OutboxMessage] = []
        for message in messages:
            try:
                with stage("decode"):
                    decoded = self.decode(message)
            except InvalidMessage as invalid:
                dead.append(isolation.invalid(message, invalid))
                continue
            if isinstance(decoded, PublishedMessage):
                sealed[position(message)] = decoded
            else:
                updates[position(message)] = decoded

        async def open_part(part: Sequence[InputMessage]) -> list[OutboxMessage]:
            return await self._open(part, sealed, updates, isolation)

        opened, open_failed = await isolation.split(
            [m for m in messages if position(m) in sealed], open_part
        )
        dead += [letter for letters in opened for letter in letters]
        # In the order of the batch: of two updates of one entry, the later one wins.
        decodable = [m for m in messages if position(m) in updates]

        async def index_part(part: Sequence[InputMessage]) -> None:
            await self.index([updates[position(m)] for m in part])

        _, failed = await isolation.split(decodable, index_part)
        dead += isolation.judge(len(messages), open_failed + failed)
        await isolation.dead_letters.keep(dead)  # a letter's key is durable before the letter
        await self._publisher.publish(dead)

    async def _open(
        self,
        part: Sequence[InputMessage],
        sealed: Mapping[Position, PublishedMessage],
        updates: dict[Position, IndexUpdate],
        isolation: Isolation,
    ) -> list[OutboxMessage]:
        """Open the sealed messages of ``part`` with their conversations' data keys (read in
        one query) into ``updates``; returns the dead letters of those whose seal does not
        open. A message whose key an erasure shredded is skipped and counted: never indexed,
        never a dead letter. A key read here and shredded before ``index`` runs changes
        nothing: ``index`` reads the erasure index in its own transaction and refuses it."""
        with stage("unseal"):
            async with self._pool.connection() as conn:
                keys = await self._keys.keys(conn, [sealed[position(m)].entity for m in part])
        shredded = 0
        failed: list[tuple[InputMessage, PublishedMessage, str]] = []
        for message in part:
            published = sealed[position(message)]
            try:
                opened = published.opened(keys.get(published.entity))
            except Shredded:
                shredded += 1
                continue
            except Unreadable as exc:
                failed.append((message, published, str(exc)[:500]))
                continue
            updates[position(message)] = _message_update(opened)
        erased: set[EntityRef] = set()
        if failed:
            # Sealed under a key an erasure destroyed, its conversation having a new one now.
            with stage("unseal"):
                async with self._pool.connection() as conn:
                    refs = [p.entity for _, p, _ in failed]
                    erased = await ever_shredded(conn, refs, self._keys.lookups)
        dead: list[OutboxMessage] = []
        for message, published, why in failed:
            if published.entity in erased:
                shredded += 1
                continue
            unreadable = InvalidMessage(DeadLetterReason.UNREADABLE_SEAL, why)
            dead.append(isolation.invalid(message, unreadable))
        self._metrics.shredded(self.name, shredded)
        return dead

    async def index(self, updates: Sequence[IndexUpdate]) -> None:
        if not updates:
            return
        tenants = sorted({u.tenant_id for u in updates})
        plan: IndexPlan | None = None
        while plan is None:
            # Never waiting for one of the two locks while holding the other: a tombstone
            # holds the vector store's write lock for as long as its purge takes, and a
            # deletion (the ledger's exclusive tenant lock) waits for the projections'
            # transactions; a batch holding one while waiting for the other chained the two
            # waits, a second or more each under load (ops/decisions/erasure-latency.md).
            async with self._pool.connection() as conn:
                async with self._writes, conn.transaction():
                    if await erasure_guard.try_lock_tenants_shared(conn, tenants):
                        plan = await self._index_locked(conn, updates)
                if plan is None:
                    # A deletion of one of these tenants holds or awaits its lock: wait until
                    # it has committed, holding nothing else, and try again.
                    async with conn.transaction():
                        await erasure_guard.lock_tenants(conn, tenants, exclusive=False)
        await self._publisher.publish(
            [
                OutboxMessage(
                    self._topics.name(
                        MEMORY_REJECTIONS
                        if rejection.event_type == "memory.current"
                        else CONVERSATION_REJECTIONS
                    ),
                    output_key(rejection.tenant_id, rejection.entity_id).encode(),
                    encode(rejection),
                )
                for rejection in plan.rejections
            ]
        )
        for rejection in plan.rejections:
            self._metrics.rejected(rejection.reason.value)
        self._metrics.index_update("embeddings", "indexed", len(plan.upserts))
        self._metrics.index_update("embeddings", "removed", len(plan.removals))
        self._metrics.index_update("embeddings", "stale", plan.stale)
        self._metrics.index_update("embeddings", "erased", len(plan.rejections))

    async def _index_locked(self, conn: Conn, updates: Sequence[IndexUpdate]) -> IndexPlan:
        """Decide and write the batch, under the shared tenant locks and the write lock."""
        held = await self._authoritative(conn, updates)
        with stage("embed"):
            plan = plan_index(updates, held, self._embedder)
        with stage("write"):
            if plan.removals:
                # One delete for the batch, not one each: the write lock is held meanwhile, and
                # a revocation's or erasure's null on memory.current is a removal.
                await asyncio.to_thread(self._vectors.remove_any, plan.removals)
            if plan.upserts:
                await asyncio.to_thread(self._vectors.upsert, list(plan.upserts.values()))
        return plan

    async def _authoritative(self, conn: Conn, updates: Sequence[IndexUpdate]) -> Authoritative:
        memories = sorted(
            {(u.tenant_id, u.memory_id) for u in updates if isinstance(u, MemoryUpdate)}
        )
        messages = sorted(
            {
                (u.tenant_id, u.conversation_id, u.message_id)
                for u in updates
                if isinstance(u, MessageUpdate)
            }
        )
        lookups = self._keys.lookups
        held_memories = await memory_store.held_versions(conn, memories, lookups)
        held_messages = await conversation_store.held_messages(conn, messages, lookups)
        erasures = await erasure_guard.load_erasures(
            conn, (key for update in updates for key in erasure_keys(update)), lookups
        )
        return Authoritative(held_memories, held_messages, erasures)


def _message_update(published: PublishedMessage) -> MessageUpdate:
    assert published.content is not None, "opened before it is indexed"
    return MessageUpdate(
        tenant_id=published.tenant_id,
        conversation_id=published.conversation_id,
        message_id=published.message_id,
        owner=published.owner,
        content=published.content,
        occurred_at=published.occurred_at,
        event_id=published.event_id,
    )
