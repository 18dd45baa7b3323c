"""PostgreSQL persistence of the memory projection: load the records a batch touches, save the
batch's new records and history, and answer reads (recall, provenance)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson
from psycopg.rows import dict_row

from projections.bookkeeping import Conn
from projections.memory.reducer import BatchResult, MemoryKey
from topics.outputs import MemoryRecord, MemoryStatus

RECORD_COLUMNS = (
    "tenant_id, memory_id, subject_type, subject_id, scope, kind, value, source_type,"
    " source_ref, status, version, observed_at, expires_at, verification, evidence_event_ids,"
    " created_at, updated_at, last_event_id, revoked_reason"
)


def record_from_row(row: dict[str, Any]) -> MemoryRecord:
    return MemoryRecord(
        tenant_id=row["tenant_id"],
        memory_id=row["memory_id"],
        subject={"type": row["subject_type"], "id": row["subject_id"]},
        scope=row["scope"],
        kind=row["kind"],
        value=row["value"],
        source={"type": row["source_type"], "ref": row["source_ref"]},
        status=row["status"],
        version=row["version"],
        observed_at=row["observed_at"],
        expires_at=row["expires_at"],
        verification=row["verification"],
        evidence_event_ids=tuple(row["evidence_event_ids"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        last_event_id=row["last_event_id"],
        revoked_reason=row["revoked_reason"],
    )


async def load_records(conn: Conn, keys: Iterable[MemoryKey]) -> dict[MemoryKey, MemoryRecord]:
    tenants, memory_ids = [], []
    for tenant_id, memory_id in set(keys):
        tenants.append(tenant_id)
        memory_ids.append(memory_id)
    if not tenants:
        return {}
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            f"SELECT {RECORD_COLUMNS} FROM memories"
            " JOIN unnest(%s::text[], %s::text[]) AS k(tenant_id, memory_id)"
            " USING (tenant_id, memory_id)",
            (tenants, memory_ids),
        )
        rows = await cursor.fetchall()
    return {(row["tenant_id"], row["memory_id"]): record_from_row(row) for row in rows}


def _record_columns(records: Sequence[MemoryRecord]) -> list[list[Any]]:
    return [
        [r.tenant_id for r in records],
        [r.memory_id for r in records],
        [r.subject.type for r in records],
        [r.subject.id for r in records],
        [r.scope for r in records],
        [r.kind for r in records],
        [orjson.dumps(r.value).decode() for r in records],
        [r.source.type for r in records],
        [r.source.ref for r in records],
        [r.status for r in records],
        [r.version for r in records],
        [r.observed_at for r in records],
        [r.expires_at for r in records],
        [r.verification for r in records],
        # Arrays of arrays must be rectangular in PostgreSQL, so the ids travel as JSON.
        [orjson.dumps(r.evidence_event_ids).decode() for r in records],
        [r.revoked_reason for r in records],
    ]


_UNNEST_RECORD = (
    "unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[],"
    " %s::jsonb[], %s::text[], %s::text[], %s::text[], %s::integer[], %s::timestamptz[],"
    " %s::timestamptz[], %s::text[], %s::jsonb[], %s::text[]"
)
_RECORD_ALIASES = (
    "tenant_id, memory_id, subject_type, subject_id, scope, kind, value, source_type,"
    " source_ref, status, version, observed_at, expires_at, verification, evidence, revoked_reason"
)
_EVIDENCE = "ARRAY(SELECT jsonb_array_elements_text(evidence))"


async def save_batch(conn: Conn, result: BatchResult) -> None:
    """Upsert the changed records and append their versions, inside the caller's transaction."""
    records = list(result.records.values())
    if records:
        await conn.execute(
            f"INSERT INTO memories ({RECORD_COLUMNS})"
            f" SELECT tenant_id, memory_id, subject_type, subject_id, scope, kind, value,"
            f" source_type, source_ref, status, version, observed_at, expires_at, verification,"
            f" {_EVIDENCE}, created_at, updated_at, last_event_id, revoked_reason"
            f" FROM {_UNNEST_RECORD}, %s::timestamptz[], %s::timestamptz[], %s::text[])"
            f" AS r({_RECORD_ALIASES}, created_at, updated_at, last_event_id)"
            " ON CONFLICT (tenant_id, memory_id) DO UPDATE SET"
            " value = EXCLUDED.value, source_type = EXCLUDED.source_type,"
            " source_ref = EXCLUDED.source_ref, status = EXCLUDED.status,"
            " version = EXCLUDED.version, observed_at = EXCLUDED.observed_at,"
            " expires_at = EXCLUDED.expires_at, verification = EXCLUDED.verification,"
            " updated_at = EXCLUDED.updated_at, last_event_id = EXCLUDED.last_event_id,"
            " revoked_reason = EXCLUDED.revoked_reason",
            (
                *_record_columns(records),
                [r.created_at for r in records],
                [r.updated_at for r in records],
                [r.last_event_id for r in records],
            ),
        )
    versions = result.versions
    if versions:
        await conn.execute(
            "INSERT INTO memory_versions (tenant_id, memory_id, subject_type, subject_id, scope,"
            " kind, value, source_type, source_ref, status, version, observed_at, expires_at,"
            " verification, evidence_event_ids, revoked_reason, event_id, event_type,"
            " occurred_at, actor_type, actor_id)"
            " SELECT tenant_id, memory_id, subject_type, subject_id, scope, kind, value,"
            " source_type, source_ref, status, version, observed_at, expires_at, verification,"
            f" {_EVIDENCE}, revoked_reason, event_id, event_type, occurred_at, actor_type,"
            f" actor_id FROM {_UNNEST_RECORD}, %s::text[], %s::text[], %s::timestamptz[],"
            f" %s::text[], %s::text[]) AS v({_RECORD_ALIASES}, event_id, event_type,"
            " occurred_at, actor_type, actor_id)",
            (
                *_record_columns([v.record for v in versions]),
                [v.event_id for v in versions],
                [v.event_type for v in versions],
                [v.record.updated_at for v in versions],
                [v.actor_type for v in versions],
                [v.actor_id for v in versions],
            ),
        )


@dataclass(frozen=True, slots=True)
class RecallQuery:
    tenant_id: str
    subject_type: str
    subject_id: str
    scope: str | None = None
    kind: str | None = None
    statuses: tuple[MemoryStatus, ...] = ("verified", "proposed")
    max_age: timedelta | None = None
    limit: int = 50


async def recall(conn: Conn, query: RecallQuery, now: datetime) -> list[MemoryRecord]:
    """Eligible memories about one subject of one tenant: never revoked, superseded (only the
    current version is stored here) or expired; newest observation first."""
    statuses = [s for s in query.statuses if s != "revoked"]
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            f"SELECT {RECORD_COLUMNS} FROM memories"
            " WHERE tenant_id = %(tenant)s AND subject_type = %(subject_type)s"
            " AND subject_id = %(subject_id)s AND status = ANY(%(statuses)s)"
            " AND (expires_at IS NULL OR expires_at > %(now)s)"
            " AND (%(scope)s::text IS NULL OR scope = %(scope)s)"
            " AND (%(kind)s::text IS NULL OR kind = %(kind)s)"
            " AND (%(oldest)s::timestamptz IS NULL OR observed_at >= %(oldest)s)"
            " ORDER BY observed_at DESC, memory_id LIMIT %(limit)s",
            {
                "tenant": query.tenant_id,
                "subject_type": query.subject_type,
                "subject_id": query.subject_id,
                "statuses": statuses,
                "now": now,
                "scope": query.scope,
                "kind": query.kind,
                "oldest": now - query.max_age if query.max_age else None,
                "limit": query.limit,
            },
        )
        rows = await cursor.fetchall()
    return [record_from_row(row) for row in rows]


@dataclass(frozen=True, slots=True)
class VersionEntry:
    record: MemoryRecord
    event_id: str
    event_type: str
    occurred_at: datetime
    actor_type: str
    actor_id: str
    superseded_at: datetime | None


async def load_memory(conn: Conn, tenant_id: str, memory_id: str) -> MemoryRecord | None:
    records = await load_records(conn, [(tenant_id, memory_id)])
    return records.get((tenant_id, memory_id))


async def load_history(conn: Conn, tenant_id: str, memory_id: str) -> list[VersionEntry]:
    """Every version, oldest first; a version is superseded when the next one happened."""
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            "SELECT tenant_id, memory_id, subject_type, subject_id, scope, kind, value,"
            " source_type, source_ref, status, version, observed_at, expires_at, verification,"
            " evidence_event_ids, revoked_reason, event_id, event_type, occurred_at, actor_type,"
            " actor_id, first_value(occurred_at) OVER (ORDER BY version) AS created_at,"
            " occurred_at AS updated_at,"
            " event_id AS last_event_id,"
            " lead(occurred_at) OVER (ORDER BY version) AS superseded_at"
            " FROM memory_versions WHERE tenant_id = %s AND memory_id = %s ORDER BY version",
            (tenant_id, memory_id),
        )
        rows = await cursor.fetchall()
    return [
        VersionEntry(
            record=record_from_row(row),
            event_id=row["event_id"],
            event_type=row["event_type"],
            occurred_at=row["occurred_at"],
            actor_type=row["actor_type"],
            actor_id=row["actor_id"],
            superseded_at=row["superseded_at"],
        )
        for row in rows
    ]
