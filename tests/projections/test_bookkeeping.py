"""Shared bookkeeping: the binary COPY dumpers byte for byte against psycopg's own (no
services), and against the real PostgreSQL, COPY's round trip and competing event-id claims."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from psycopg import postgres
from psycopg.adapt import Transformer
from psycopg.pq import Format

from projections.bookkeeping import (
    ConcurrentClaim,
    Conn,
    _JsonbTextDumper,
    _TextArrayDumper,
    claim_processed,
    copy_rows,
)
from projections.idempotency import ProcessedEvent


def _psycopg_dumps(oid: int, value: object) -> bytes:
    transformer = Transformer()
    transformer.set_dumper_types([oid], Format.BINARY)
    (dumped,) = transformer.dump_sequence([value], [])  # formats come from the types set
    assert dumped is not None
    return bytes(dumped)


@pytest.mark.parametrize(
    "items", [[], ["e1"], ["e1", "e2", "e3"], ["évidence", "", 'with,comma "quoted"'], ["a", None]]
)
def test_text_arrays_are_dumped_as_psycopg_dumps_them(items: list[str | None]) -> None:
    ours = _TextArrayDumper(list).dump(items)
    assert ours == _psycopg_dumps(postgres.types["text"].array_oid, items)


def test_jsonb_takes_the_serialised_text_as_it_is() -> None:
    assert _JsonbTextDumper(str).dump('{"a":[1,"é"]}') == b'\x01{"a":[1,"\xc3\xa9"]}'


@pytest.mark.integration
def test_binary_copy_stores_every_column_type_as_given(env: Any) -> None:
    observed = datetime(2026, 11, 30, 1, 2, 3, 456789, tzinfo=UTC)
    row = (
        "t1", "m1", 2, "user", "u1", "travel", "preference",
        '{"text": "prefers é", "n": [1, 2.5, null]}',
        "conversation", "c1/x", "verified", observed, None, "user_confirmed",
        ["e1", "é,\"2\"", ""], None, "e2", "memory.verified",
        observed.astimezone(timezone(timedelta(hours=5))), "user", "u1",
    )  # fmt: skip
    columns = (
        "tenant_id", "memory_id", "version", "subject_type", "subject_id", "scope", "kind",
        "value", "source_type", "source_ref", "status", "observed_at", "expires_at",
        "verification", "evidence_event_ids", "revoked_reason", "event_id", "event_type",
        "occurred_at", "actor_type", "actor_id",
    )  # fmt: skip

    async def round_trip(conn: Conn) -> tuple[Any, ...] | None:
        await copy_rows(conn, "memory_versions", columns, [row])
        cursor = await conn.execute(f"SELECT {', '.join(columns)} FROM memory_versions")
        return await cursor.fetchone()

    stored = env.run(round_trip)

    assert stored is not None
    assert stored[:7] == row[:7] and stored[8:] == row[8:]
    assert stored[7] == {"text": "prefers é", "n": [1, 2.5, None]}  # jsonb, parsed back


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
