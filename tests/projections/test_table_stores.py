"""The summaries and context stores against the real PostgreSQL of ops/stack: a batch of
tombstones is erased in one transaction and checked per tombstone."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from projections.stores.base import Erased
from projections.stores.tables import ContextStore, ConversationTableStore, SummariesStore
from streams.services import make_pool
from topics.deletion import DeletionTarget, Tombstone, TombstoneItem

pytestmark = pytest.mark.integration

NOW = datetime(2026, 9, 1, 12, tzinfo=UTC)
ALICE, BOB = ("user", "alice"), ("user", "bob")


def conversation_erasure(deletion_id: str, tenant_id: str, conversation_id: str) -> Tombstone:
    return Tombstone(
        deletion_id=deletion_id,
        tenant_id=tenant_id,
        kind="erasure",
        target=DeletionTarget(type="conversation", id=conversation_id),
        items=(TombstoneItem(type="conversation", id=conversation_id),),
        issued_at=NOW,
        cut_off=NOW,
        deadline_at=NOW + timedelta(hours=1),
        required_stores=("summaries", "context"),
    )


def write_rows(env: Any, rows: list[tuple[str, str, tuple[str, str]]]) -> None:
    """A summary (two versions) and a context view of each (tenant, conversation, owner)."""
    with env.connect() as conn:
        for tenant, conversation, (owner_type, owner_id) in rows:
            for version in (1, 2):
                conn.execute(
                    "INSERT INTO conversation_summaries VALUES"
                    " (%s, %s, %s, 'a summary', '{}', %s, 'e1', '[]', %s, %s)",
                    (tenant, conversation, version, NOW, owner_type, owner_id),
                )
            conn.execute(
                "INSERT INTO conversation_context VALUES (%s, %s, %s, %s, '{}', 1, 100, NULL, %s)",
                (tenant, conversation, owner_type, owner_id, NOW),
            )


def left(env: Any, table: str) -> list[tuple[str, str]]:
    with env.connect() as conn:
        rows = conn.execute(
            f"SELECT DISTINCT tenant_id, conversation_id FROM {table} ORDER BY 1, 2"
        )
        return [(row[0], row[1]) for row in rows.fetchall()]


def erase_many(env: Any, store: type[ConversationTableStore], batch: list[Tombstone]) -> Any:
    async def main() -> list[Erased]:
        async with make_pool(env.settings.postgres_dsn, 1) as pool:
            return await store(pool).erase_many(batch)

    return asyncio.run(main())


@pytest.mark.parametrize(("store", "per_conversation"), [(SummariesStore, 2), (ContextStore, 1)])
def test_a_batch_is_erased_in_one_transaction_and_checked_per_tombstone(
    env: Any, store: type[ConversationTableStore], per_conversation: int
) -> None:
    write_rows(env, [("acme", "c1", ALICE), ("acme", "c2", BOB), ("acme", "c3", BOB)])
    write_rows(env, [("beta", "c1", ALICE)])
    batch = [
        conversation_erasure("d1", "acme", "c1"),
        conversation_erasure("d2", "acme", "c2"),
        conversation_erasure("d3", "beta", "c1"),
        conversation_erasure("d4", "acme", "c1"),  # redelivered: nothing left to remove
    ]

    erased = erase_many(env, store, batch)

    n = per_conversation
    assert erased == [Erased(n, []), Erased(n, []), Erased(n, []), Erased(0, [])]
    assert left(env, store.table.table) == [("acme", "c3")]
    assert erase_many(env, store, []) == []


def test_a_batch_that_fails_commits_nothing(env: Any) -> None:
    write_rows(env, [("acme", "c1", ALICE)])
    # PostgreSQL text holds no NUL: the tombstone cannot even be asked about.
    poison = conversation_erasure("d2", "acme", "c\x00")

    with pytest.raises(Exception, match="NUL"):
        erase_many(env, SummariesStore, [conversation_erasure("d1", "acme", "c1"), poison])

    assert left(env, "conversation_summaries") == [("acme", "c1")]
