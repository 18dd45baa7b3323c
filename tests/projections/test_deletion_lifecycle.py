"""The ledger's lifecycle queries against the real PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from projections.deletion import lifecycle

INTERVAL = timedelta(seconds=30)


def record_overdue_request(env: Any, deletion_id: str) -> datetime:
    """A request whose deadline passed before the ledger recorded it (an old revocation, a
    backlog), pending in the embeddings store; returns when it was recorded."""
    with env.connect() as conn:
        row = conn.execute(
            "INSERT INTO deletion_requests (tenant_id, deletion_id, kind, target_type, target_id,"
            " reason, cut_off, deadline_at, required_stores, status, request_event_id,"
            " tombstone) VALUES ('acme', %s, 'revocation', 'memory', 'm1', 'revoked',"
            " now() - interval '2 hours', now() - interval '1 hour', '{embeddings}',"
            " 'pending', 'e1', '{}') RETURNING recorded_at",
            (deletion_id,),
        ).fetchone()
        conn.execute(
            "INSERT INTO deletion_store_acks (tenant_id, deletion_id, store, status, deadline_at)"
            " VALUES ('acme', %s, 'embeddings', 'pending', now() - interval '1 hour')",
            (deletion_id,),
        )
        conn.commit()
    assert row is not None
    recorded: datetime = row[0]
    return recorded


@pytest.mark.integration
def test_a_tombstone_overdue_on_arrival_is_redelivered_one_interval_after_it_was_published(
    env: Any,
) -> None:
    recorded = record_overdue_request(env, "d_late")

    assert env.run(lambda conn: lifecycle.overdue(conn, recorded + INTERVAL / 2, INTERVAL)) == []
    later = recorded + INTERVAL + timedelta(seconds=1)
    assert env.run(lambda conn: lifecycle.overdue(conn, later, INTERVAL)) == [
        ("acme", "d_late", "embeddings")
    ]
