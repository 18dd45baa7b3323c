"""Rebuilding the vector store: ``memory.current`` and ``conversation.messages`` replayed
through the live indexer into a rebuild table, compared with the live table per tenant, and
swapped in by replacing the live table's content in one commit.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import orjson
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry

from projections import shadow as shadows
from projections.deletion import audit as ghost_audit
from projections.embeddings.vectors import (
    SCHEMA_VERSION,
    VectorEntry,
    VectorStore,
    replay_table_name,
)
from projections.sealing.keys import KeyStore
from projections.stores.embeddings import covered_entries
from streams.isolation import CircuitBreaker, Isolation
from streams.kafka import admin_config
from streams.metrics import Metrics
from streams.rebuild import ReplayStopped
from streams.replay import DiscardingPublisher, ReplayReport, SwapMode, unpublished_letters
from streams.replay_reading import Progress, apply_range, positions, reader
from streams.services import build_embedder, make_pool, open_vector_store, open_vector_tables
from streams.settings import Settings
from topics.registry import CONVERSATION_MESSAGES, MEMORY_CURRENT


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
        KeyStore(settings.worker_master_keys(), settings.key_lookups),
    )  # fmt: skip
    isolation = Isolation(
        CircuitBreaker("replay embeddings"), metrics, unpublished_letters(settings)
    )
    consumer = reader(settings)
    try:
        feeds = [settings.topics.name(MEMORY_CURRENT), settings.topics.name(CONVERSATION_MESSAGES)]
        starts, ends = positions(consumer, feeds, "earliest")
        began = time.monotonic()
        progress = await apply_range(
            consumer,
            starts,
            ends,
            batch_size,
            lambda batch: indexer.apply(batch, isolation),
            on_progress,
        )
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
