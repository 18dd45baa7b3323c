"""A change of embedder: refused by the worker and the reads until `memproj replay embeddings`
rebuilds the vectors with the new model, against the real Kafka, PostgreSQL and LanceDB."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from click.testing import CliRunner

from projections.embeddings.embedder import WORDLLAMA_NAME
from projections.embeddings.vectors import EmbedderMismatch, Match
from projections.memory.store import RecallQuery
from streams import reads
from streams.cli import cli
from streams.replay_embeddings import replay_embeddings
from streams.sample import EventFactory
from streams.services import open_vector_store, open_vector_tables
from streams.settings import Settings
from support.embedders import embedder_of, vectors_of
from topics.registry import MEMORY_EVENTS

pytestmark = pytest.mark.integration
ALICE = ("user", "alice")


def indexed(env: Any, settings: Settings, count: int) -> None:
    store = vectors_of(settings)
    env.wait_until(
        lambda: len(store.find(Match("acme", subject=ALICE))) >= count, f"{count} vectors"
    )


def recalled(env: Any, settings: Settings, text: str) -> list[str]:
    async def run(conn: Any) -> reads.Hydrated:
        return await reads.recall_by_text(
            conn,
            open_vector_store(settings),
            embedder_of(settings),
            RecallQuery("acme", *ALICE, limit=1),
            text,
            datetime.now(UTC),
        )

    return [record.memory_id for record in env.run(run).records]


def test_a_model_change_is_refused_until_the_rebuild_swaps_it_in(env: Any) -> None:
    hashing = env.settings.model_copy(update={"embedder": "hashing"})
    wordllama = env.settings.model_copy(update={"embedder": "wordllama"})
    env.settings = hashing
    f = EventFactory()
    env.produce_events(
        [
            f.proposed("acme", "mem_receipts", ALICE, {"text": "prefers email receipts"}),
            f.proposed("acme", "mem_tennis", ALICE, {"text": "plays tennis on sundays"}),
        ]
    )
    workers = env.start("memory", "embeddings")
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    indexed(env, hashing, 2)
    assert open_vector_tables(hashing).recorded()[0] == "hashing/256"
    workers["embeddings"].stop()

    # Configured for another model: the worker exits and the reads refuse, naming both.
    refused = env.worker("embeddings", embedder="wordllama")
    env.wait_until(lambda: not refused.alive(), "the embeddings worker to refuse the store")
    log = refused.log_tail(80)
    assert "hashing/256" in log and WORDLLAMA_NAME in log and "memproj replay embeddings" in log
    with pytest.raises(EmbedderMismatch, match="memproj replay embeddings"):
        recalled(env, wordllama, "wants invoices by mail")
    environment = wordllama.as_environment()
    shown = CliRunner().invoke(
        cli,
        ["recall", "--tenant", "acme", "--subject", "user:alice", "--query", "invoices"],
        env=environment,
    )
    assert shown.exit_code != 0 and "memproj replay embeddings" in str(shown.exception), shown

    # The rebuild embeds with the configured model and swaps in although the entries are the
    # same ones: the live vectors were of another model.
    report = asyncio.run(replay_embeddings(wordllama))
    assert report.differences == {} and report.swapped, report.to_json()
    assert report.model_change == ("hashing/256", WORDLLAMA_NAME)
    assert open_vector_tables(wordllama).recorded()[0] == WORDLLAMA_NAME
    assert recalled(env, wordllama, "wants invoices by mail") == ["mem_receipts"]
    with pytest.raises(EmbedderMismatch, match=f"embedder {WORDLLAMA_NAME}"):
        vectors_of(hashing)

    # The worker of the new model runs, and indexes with it.
    env.settings = wordllama
    env.worker("embeddings")
    env.produce_events([f.proposed("acme", "mem_city", ALICE, {"text": "lives in a flat in Lyon"})])
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    indexed(env, wordllama, 3)
    assert recalled(env, wordllama, "resides in an apartment in France") == ["mem_city"]
