"""The runner's bookkeeping against the real PostgreSQL: competing event-id claims."""

from __future__ import annotations

from typing import Any

import pytest

from projections.bookkeeping import ConcurrentClaim, claim_processed
from projections.idempotency import ProcessedEvent
from projections.sql import Conn


@pytest.mark.integration
def test_an_event_id_claimed_by_another_worker_fails_the_whole_claim(env: Any) -> None:
    def claims(*event_ids: str) -> list[ProcessedEvent]:
        return [ProcessedEvent("t1", event_id, b"hash") for event_id in event_ids]

    async def claim_twice(conn: Conn) -> set[str]:
        async with conn.transaction():
            await claim_processed(conn, "memory", claims("e1", "e2"))
        with pytest.raises(ConcurrentClaim):
            async with conn.transaction():
                await claim_processed(conn, "memory", claims("e3", "e2"))
        async with conn.transaction():
            await claim_processed(conn, "conversation", claims("e2"))  # another projection's
        cursor = await conn.execute("SELECT projection || ':' || event_id FROM processed_events")
        return {row[0] for row in await cursor.fetchall()}

    assert env.run(claim_twice) == {"memory:e1", "memory:e2", "conversation:e2"}
