"""Shared PostgreSQL access: the binary COPY dumpers byte for byte against psycopg's own and
the statements of the batch lookups in both modes (no services), and COPY's round trip against
the real PostgreSQL."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, cast

import pytest
from psycopg import postgres
from psycopg.adapt import Transformer
from psycopg.pq import Format

from projections.bookkeeping import load_seen
from projections.sql import Conn, KeyLookups, _JsonbTextDumper, _TextArrayDumper, copy_rows
from support.routing import judge


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


@dataclass
class _Recorded:
    statement: str
    params: Mapping[str, Any]
    pipelined: bool


@dataclass
class _RecordingConnection:
    """Records the statements a lookup sends (and whether inside a pipeline); each finds
    one row, of its tenant."""

    sent: list[_Recorded] = field(default_factory=list)
    pipelines: int = 0

    @asynccontextmanager
    async def pipeline(self) -> AsyncIterator[None]:
        self.pipelines += 1
        yield
        self.pipelines -= 1

    def cursor(self, row_factory: object = None) -> _RecordingCursor:
        return _RecordingCursor(self)


@dataclass
class _RecordingCursor:
    conn: _RecordingConnection
    rowcount: int = 1
    tenant: str | None = None

    async def execute(self, statement: bytes, params: Mapping[str, Any]) -> None:
        self.conn.sent.append(_Recorded(statement.decode(), params, self.conn.pipelines > 0))
        self.tenant = params.get("tenant")

    async def fetchall(self) -> list[Any]:
        return [(self.tenant, "e0", b"")]

    async def close(self) -> None:
        pass


def _as_recorded(statement: str) -> str:
    """As pg_stat_statements records it: named parameters numbered."""
    names: dict[str, int] = {}
    return re.sub(
        r"%\((\w+)\)s", lambda m: f"${names.setdefault(m.group(1), len(names) + 1)}", statement
    )


def _seen(per_tenant: bool, tenants: list[str]) -> list[_Recorded]:
    conn = _RecordingConnection()
    keys = [(tenant, f"e{n}") for tenant in tenants for n in range(2)]
    seen = asyncio.run(load_seen(cast(Conn, conn), "memory", keys, KeyLookups(per_tenant)))
    if per_tenant:  # every tenant's rows, merged
        assert set(seen) == {(tenant, "e0") for tenant in tenants}
    return conn.sent


def test_per_tenant_lookups_send_one_statement_of_each_tenant_in_one_pipeline() -> None:
    sent = _seen(True, ["acme", "globex", "initech"])
    assert [s.params["tenant"] for s in sent] == ["acme", "globex", "initech"]
    assert all(s.pipelined for s in sent)
    assert [s.params["keys"] for s in sent] == ['[["e0"],["e1"]]'] * 3
    for recorded in sent:
        verdict = judge(_as_recorded(recorded.statement))
        assert verdict.routable and not verdict.batch, verdict


def test_one_statement_serves_a_batch_of_several_tenants_unless_per_tenant() -> None:
    (sent,) = _seen(False, ["acme", "globex"])
    assert not sent.pipelined and "tenant" not in sent.params
    assert judge(_as_recorded(sent.statement)).batch == ["processed_events"]


@pytest.mark.parametrize("per_tenant", [False, True])
def test_one_tenants_keys_make_one_statement_of_that_tenant_in_either_mode(
    per_tenant: bool,
) -> None:
    (sent,) = _seen(per_tenant, ["acme"])
    assert sent.params["tenant"] == "acme" and not sent.pipelined
    verdict = judge(_as_recorded(sent.statement))
    assert verdict.routable and not verdict.batch, verdict


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
