"""A vector table written before the entries carried the memory's kind and scope: refused by
the worker and the reads until `memproj replay embeddings` rebuilds it, against the real
Kafka, PostgreSQL and LanceDB."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import lancedb
import pytest

from projections.embeddings.lance_schema import SCHEMA_VERSION_KEY
from projections.embeddings.lance_tables import table_schema_version
from projections.embeddings.vectors import SCHEMA_VERSION, Match, VectorSchemaOutdated
from projections.memory.store import RecallQuery
from streams import reads
from streams.replay_embeddings import replay_embeddings
from streams.sample import EventFactory
from streams.services import open_vector_store
from streams.settings import Settings
from support.embedders import embedder_of, vectors_of
from topics.registry import MEMORY_EVENTS

pytestmark = pytest.mark.integration
ALICE = ("user", "alice")


def searched(env: Any, settings: Settings, text: str, kinds: frozenset[str] | None) -> list[str]:
    async def run(conn: Any) -> reads.Hydrated:
        return await reads.recall_by_text(
            conn,
            open_vector_store(settings),
            embedder_of(settings),
            RecallQuery("acme", *ALICE, limit=2, kinds=kinds),
            text,
            datetime.now(UTC),
        )

    return [record.memory_id for record in env.run(run).records]


def as_version_1(settings: Settings) -> None:
    """The live table as the previous memproj wrote it: no memory_kind, no scope, no schema
    version in its metadata (the embedder's name and dimension stay)."""
    database = lancedb.connect(settings.vector_store_path)
    rows = database.open_table("embeddings").to_arrow().drop_columns(["memory_kind", "scope"])
    metadata = dict(rows.schema.metadata or {})
    del metadata[SCHEMA_VERSION_KEY]
    database.create_table("embeddings", rows.replace_schema_metadata(metadata), mode="overwrite")


def test_a_table_of_the_previous_schema_is_refused_until_the_rebuild_swaps_it_in(
    env: Any,
) -> None:
    # LanceDB's table of the previous memproj (PostgreSQL's: test_postgres_vectors.py).
    env.settings = env.settings.model_copy(update={"vector_store": "lancedb"})
    f = EventFactory()
    env.produce_events(
        [
            f.proposed("acme", "mem_mail", ALICE, {"text": "prefers email receipts"}),
            f.proposed("acme", "mem_mail2", ALICE, {"text": "wants receipts by email"}),
            f.proposed("acme", "mem_city", ALICE, {"text": "lives in Lisbon"}, kind="fact"),
        ]
    )
    workers = env.start("memory", "embeddings")
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    store = vectors_of(env.settings)
    env.wait_until(lambda: len(store.find(Match("acme", subject=ALICE))) >= 3, "3 vectors")
    workers["embeddings"].stop()
    as_version_1(env.settings)
    assert table_schema_version(env.settings.vector_store_path) == 1

    # The worker exits and the reads refuse, saying what rebuilds it.
    refused = env.worker("embeddings")
    env.wait_until(lambda: not refused.alive(), "the embeddings worker to refuse the store")
    log = refused.log_tail(80)
    assert "vector schema 1" in log and "memproj replay embeddings" in log, log
    with pytest.raises(VectorSchemaOutdated, match="memproj replay embeddings"):
        searched(env, env.settings, "email receipts", None)

    # The rebuild writes the new columns and swaps in although the entries are the same ones.
    report = asyncio.run(replay_embeddings(env.settings))
    assert report.differences == {} and report.swapped, report.to_json()
    assert report.schema_change == (1, SCHEMA_VERSION)
    assert table_schema_version(env.settings.vector_store_path) == SCHEMA_VERSION
    entries = vectors_of(env.settings).find(Match("acme", subject=ALICE))
    assert {(e.memory_id, e.memory_kind, e.scope) for e in entries} == {
        ("mem_mail", "preference", "user"),
        ("mem_mail2", "preference", "user"),
        ("mem_city", "fact", "user"),
    }
    # A purpose reading facts only finds its fact, however far it is from the text.
    assert searched(env, env.settings, "email receipts", frozenset({"fact"})) == ["mem_city"]
    assert set(searched(env, env.settings, "email receipts", None)) == {"mem_mail", "mem_mail2"}

    # The worker runs again on the rebuilt table.
    env.worker("embeddings")
    env.produce_events(
        [f.proposed("acme", "mem_goal", ALICE, {"text": "learn to sail"}, kind="goal")]
    )
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    env.wait_until(lambda: len(store.find(Match("acme", subject=ALICE))) >= 4, "4 vectors")
    assert searched(env, env.settings, "email receipts", frozenset({"goal"})) == ["mem_goal"]
