"""Semantic recall's cost follows its answer, not its candidates: the vector store ranks and
answers ids and versions only (no text, no vector), and the projection hydrates candidates in
rank order only as far as the answer needs. Against the real workers, PostgreSQL and LanceDB;
the store and the projection's record loader are watched, not replaced."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import pytest

from projections.embeddings.vectors import Match
from projections.memory import store as memory_store
from projections.memory.store import RecallQuery
from streams import reads
from streams.sample import EventFactory
from support.embedders import embedder_of, vectors_of
from support.environment import Env
from topics.registry import MEMORY_EVENTS

pytestmark = pytest.mark.integration

TENANT = "acme"
SUBJECT = ("user", "u1")


class Watched:
    """The vector store, with the name of every method a read called."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.called: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.store, name)
        if not callable(attribute):
            return attribute

        def called(*args: Any, **kwargs: Any) -> Any:
            self.called.append(name)
            return attribute(*args, **kwargs)

        return called


def test_a_search_ranks_ids_only_and_hydrates_what_it_returns(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.start("memory", "embeddings")
    events = EventFactory(id_prefix="e-recall")
    env.produce_events(
        [
            events.proposed(TENANT, f"m{n:02d}", SUBJECT, {"text": f"drinks tea number {n}"})
            for n in range(40)
        ]
    )
    env.wait_caught_up(MEMORY_EVENTS, "memory")
    store = vectors_of(env.settings)
    env.wait_until(
        lambda: len(store.find(Match(TENANT, subject=SUBJECT))) == 40, "40 memories indexed"
    )

    hydrated: list[str] = []
    load_records = memory_store.load_records

    async def watched_load(conn: Any, keys: Iterable[tuple[str, str]], lookups: Any) -> Any:
        keys = list(keys)
        hydrated.extend(memory_id for _, memory_id in keys)
        return await load_records(conn, keys, lookups)

    monkeypatch.setattr(memory_store, "load_records", watched_load)
    watched = Watched(store)
    query = RecallQuery(TENANT, *SUBJECT, limit=5)
    found = env.run(
        lambda conn: reads.recall_by_text(
            conn, watched, embedder_of(env.settings), query, "tea", datetime.now(UTC)
        )
    )
    returned = [record.memory_id for record in found.records]
    assert len(returned) == 5
    # Never the entries with text and vector: both rankings (hybrid, the default) read ids.
    assert sorted(watched.called) == ["lexical_candidates", "search_candidates"]
    assert sorted(hydrated) == sorted(returned)  # not the 4 x 5 candidates ranked
