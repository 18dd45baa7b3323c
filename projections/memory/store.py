"""PostgreSQL persistence of the memory projection (``memories``, ``memory_versions``): load the
records a batch touches, save the batch's new records and history, answer reads (recall,
provenance), and find and erase what a deletion covers."""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson
from psycopg.rows import dict_row

from projections.deletion.erasure import ErasureScope
from projections.distribution import cross_tenant
from projections.memory.evolve import MemoryKey, MemoryVersion
from projections.memory.reducer import BatchResult
from projections.sql import ONE_TENANT, Conn, KeyLookups, copy_rows, staging_table
from topics.outputs import ELIGIBLE_STATUSES, MemoryRecord, MemoryStatus

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


async def load_records(
    conn: Conn, keys: Iterable[MemoryKey], lookups: KeyLookups
) -> dict[MemoryKey, MemoryRecord]:
    rows = await lookups.fetch(
        conn,
        f"SELECT {RECORD_COLUMNS} FROM memories"
        " JOIN {keys} USING (tenant_id, memory_id) WHERE memories.tenant_id = {tenant}",
        ("tenant_id", "memory_id"),
        keys,
        row_factory=dict_row,
    )
    return {(row["tenant_id"], row["memory_id"]): record_from_row(row) for row in rows}


async def load_heads(
    conn: Conn, records: dict[MemoryKey, MemoryRecord], lookups: KeyLookups
) -> dict[MemoryKey, MemoryRecord]:
    """The held or rejected heads above these rows (served versions), where there are any:
    the head is the version ``memories.head_version`` names, kept in ``memory_versions``."""
    rows = await lookups.fetch(
        conn,
        f"SELECT {VERSION_RECORD_COLUMNS}, m.created_at FROM memories m"
        " JOIN {keys} USING (tenant_id, memory_id)"
        " JOIN memory_versions v ON v.tenant_id = m.tenant_id AND v.memory_id = m.memory_id"
        " AND v.version = m.head_version WHERE m.tenant_id = {tenant}",
        ("tenant_id", "memory_id"),
        records,
        row_factory=dict_row,
    )
    return {(row["tenant_id"], row["memory_id"]): record_from_row(row) for row in rows}


# A version row read as the record it made (``created_at`` is the memory's).
VERSION_RECORD_COLUMNS = (
    "v.tenant_id, v.memory_id, v.subject_type, v.subject_id, v.scope, v.kind, v.value,"
    " v.source_type, v.source_ref, v.status, v.version, v.observed_at, v.expires_at,"
    " v.verification, v.evidence_event_ids, v.revoked_reason, v.occurred_at AS updated_at,"
    " v.event_id AS last_event_id"
)


async def evidence_versions(conn: Conn, tenant_id: str, event_ids: Iterable[str]) -> dict[str, str]:
    """Of these event ids, those of memory versions the tenant holds (applied, not erased):
    event id -> the source type of the version it made."""
    wanted = sorted(set(event_ids))
    if not wanted:
        return {}
    cursor = await conn.execute(
        "SELECT event_id, source_type FROM memory_versions"
        " WHERE tenant_id = %s AND event_id = ANY(%s) AND status <> 'erased'",
        (tenant_id, wanted),
    )
    return {str(row[0]): str(row[1]) for row in await cursor.fetchall()}


async def evidence_of(
    conn: Conn, keys: Iterable[MemoryKey], lookups: KeyLookups
) -> dict[MemoryKey, tuple[str, ...]]:
    """The evidence event ids of these memories (a proposal sets them, nothing changes them)."""
    rows = await lookups.fetch(
        conn,
        "SELECT tenant_id, memory_id, evidence_event_ids FROM memories"
        " JOIN {keys} USING (tenant_id, memory_id) WHERE memories.tenant_id = {tenant}",
        ("tenant_id", "memory_id"),
        keys,
    )
    return {(row[0], row[1]): tuple(row[2]) for row in rows}


async def event_ids_of(
    conn: Conn, tenant_id: str, memories: Iterable[str], conversations: Iterable[str]
) -> list[str]:
    """The event ids of every version of these memories and of every version taken from
    these conversations: what their erasure removes."""
    cursor = await conn.execute(
        "SELECT event_id FROM memory_versions WHERE tenant_id = %s"
        " AND (memory_id = ANY(%s) OR source_conversation_id = ANY(%s))",
        (tenant_id, sorted(set(memories)), sorted(set(conversations))),
    )
    return [str(row[0]) for row in await cursor.fetchall()]


async def memories_citing(
    conn: Conn, tenant_id: str, event_ids: Iterable[str]
) -> list[tuple[str, str]]:
    """(memory id, event id) for each memory of the tenant that cites one of these events."""
    wanted = sorted(set(event_ids))
    if not wanted:
        return []
    cursor = await conn.execute(
        "SELECT m.memory_id, e.event_id FROM memories m,"
        " unnest(m.evidence_event_ids) AS e(event_id)"
        " WHERE m.tenant_id = %s AND m.evidence_event_ids && %s::text[]"
        " AND e.event_id = ANY(%s::text[])",
        (tenant_id, wanted, wanted),
    )
    return [(str(row[0]), str(row[1])) for row in await cursor.fetchall()]


CURRENT_FIELDS = (
    *(column.strip() for column in RECORD_COLUMNS.split(",")),
    "head_version",
    "head_status",
)
WRITE_COLUMNS = ", ".join(CURRENT_FIELDS)
VERSION_FIELDS = (
    "tenant_id", "memory_id", "version", "subject_type", "subject_id", "scope", "kind", "value",
    "source_type", "source_ref", "status", "observed_at", "expires_at", "verification",
    "evidence_event_ids", "revoked_reason", "event_id", "event_type", "occurred_at",
    "actor_type", "actor_id", "policy_version", "review_rule",
)  # fmt: skip
_UPDATED_ON_CONFLICT = (
    "value", "source_type", "source_ref", "status", "version", "observed_at", "expires_at",
    "verification", "updated_at", "last_event_id", "revoked_reason", "head_version",
    "head_status",
)  # fmt: skip


class _ValueJson:
    """The JSON text of records' values, serialised once per record: a batch's current row
    of a memory and its last version row hold the same record."""

    __slots__ = ("_by_record",)

    def __init__(self) -> None:
        self._by_record: dict[int, tuple[MemoryRecord, str]] = {}

    def __call__(self, record: MemoryRecord) -> str:
        known = self._by_record.get(id(record))
        if known is None:
            # The record is kept with its text, so that its id names it until the batch ends.
            known = self._by_record[id(record)] = (record, orjson.dumps(record.value).decode())
        return known[1]


def _current_row(
    r: MemoryRecord, head: MemoryRecord | None, value_json: _ValueJson
) -> tuple[Any, ...]:
    return (
        r.tenant_id, r.memory_id, r.subject.type, r.subject.id, r.scope, r.kind,
        value_json(r), r.source.type, r.source.ref, r.status, r.version,
        r.observed_at, r.expires_at, r.verification, list(r.evidence_event_ids), r.created_at,
        r.updated_at, r.last_event_id, r.revoked_reason,
        None if head is None else head.version, None if head is None else head.status,
    )  # fmt: skip


def _version_row(v: MemoryVersion, value_json: _ValueJson) -> tuple[Any, ...]:
    r = v.record
    return (
        r.tenant_id, r.memory_id, r.version, r.subject.type, r.subject.id, r.scope, r.kind,
        value_json(r), r.source.type, r.source.ref, r.status, r.observed_at,
        r.expires_at, r.verification, list(r.evidence_event_ids), r.revoked_reason, v.event_id,
        v.event_type, r.updated_at, v.actor_type, v.actor_id, v.policy_version, v.review_rule,
    )  # fmt: skip


async def save_batch(conn: Conn, result: BatchResult) -> None:
    """Upsert the changed records and append their versions, inside the caller's transaction."""
    await _save_batch(conn, result, _ValueJson())


async def _save_batch(conn: Conn, result: BatchResult, value_json: _ValueJson) -> None:
    if result.records:
        staging = await staging_table(conn, "memories")
        rows = (
            _current_row(record, result.heads.get(key), value_json)
            for key, record in result.records.items()
        )
        await copy_rows(conn, staging, CURRENT_FIELDS, rows)
        updates = ", ".join(f"{column} = EXCLUDED.{column}" for column in _UPDATED_ON_CONFLICT)
        await conn.execute(
            f"INSERT INTO memories ({WRITE_COLUMNS}) SELECT {WRITE_COLUMNS} FROM {staging}"
            f" ON CONFLICT (tenant_id, memory_id) DO UPDATE SET {updates}".encode()
        )
    if result.versions:
        rows = (_version_row(version, value_json) for version in result.versions)
        await copy_rows(conn, "memory_versions", VERSION_FIELDS, rows)


async def save_rebuilt_batch(conn: Conn, result: BatchResult, stored: Container[MemoryKey]) -> None:
    """``save_batch`` into a rebuild's shadow, whose rows the caller knows: the records it does
    not hold yet (``stored``: the keys it holds) are copied straight in, the others upserted."""
    value_json = _ValueJson()
    new = [key for key in result.records if key not in stored]
    if new:
        rows = (_current_row(result.records[k], result.heads.get(k), value_json) for k in new)
        await copy_rows(conn, "memories", CURRENT_FIELDS, rows)
    changed = {key: record for key, record in result.records.items() if key in stored}
    heads = {key: result.heads[key] for key in changed if key in result.heads}
    await _save_batch(
        conn, BatchResult(records=changed, heads=heads, versions=result.versions), value_json
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
    # A purpose policy's confinement (projections.access.policy): only these kinds and scopes
    # (None: any), applied in the query, before ranking and limit.
    kinds: frozenset[str] | None = None
    scopes: frozenset[str] | None = None


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
            " AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s))"
            " AND (%(scopes)s::text[] IS NULL OR scope = ANY(%(scopes)s))"
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
                "kinds": sorted(query.kinds) if query.kinds is not None else None,
                "scopes": sorted(query.scopes) if query.scopes is not None else None,
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
    policy_version: int = 0
    review_rule: str | None = None


async def load_memory(conn: Conn, tenant_id: str, memory_id: str) -> MemoryRecord | None:
    records = await load_records(conn, [(tenant_id, memory_id)], ONE_TENANT)
    return records.get((tenant_id, memory_id))


async def load_history(conn: Conn, tenant_id: str, memory_id: str) -> list[VersionEntry]:
    """Every version, oldest first; a version is superseded when the next one happened."""
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            "SELECT tenant_id, memory_id, subject_type, subject_id, scope, kind, value,"
            " source_type, source_ref, status, version, observed_at, expires_at, verification,"
            " evidence_event_ids, revoked_reason, event_id, event_type, occurred_at, actor_type,"
            " actor_id, policy_version, review_rule,"
            " first_value(occurred_at) OVER (ORDER BY version) AS created_at,"
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
            policy_version=row["policy_version"],
            review_rule=row["review_rule"],
        )
        for row in rows
    ]


@dataclass(frozen=True, slots=True)
class TenantChecksum:
    memories: int
    versions: int
    digest: str


async def checksums(conn: Conn) -> dict[str, TenantChecksum]:
    """Row counts and a content digest per tenant over the current records and the history:
    two projections are the same exactly when their checksums are."""
    cursor = await conn.execute(
        "WITH m AS (SELECT tenant_id, count(*) AS n, md5(string_agg(row_to_json(t)::text, '|'"
        "   ORDER BY memory_id)) AS d FROM memories t GROUP BY tenant_id),"
        " v AS (SELECT tenant_id, count(*) AS n, md5(string_agg(row_to_json(t)::text, '|'"
        "   ORDER BY memory_id, version)) AS d FROM memory_versions t GROUP BY tenant_id)"
        " SELECT coalesce(m.tenant_id, v.tenant_id), coalesce(m.n, 0), coalesce(v.n, 0),"
        " md5(coalesce(m.d, '') || coalesce(v.d, ''))"
        " FROM m FULL JOIN v USING (tenant_id) ORDER BY 1"
    )
    return {
        row[0]: TenantChecksum(int(row[1]), int(row[2]), row[3]) for row in await cursor.fetchall()
    }


@dataclass(frozen=True, slots=True)
class PendingReview:
    """A version held for review: what a reviewer decides on, beside what is served now."""

    held: VersionEntry
    # The version served meanwhile (a held correction's predecessor), if any.
    served: MemoryRecord | None


# A memory with a version held for review (its row, or the head above it).
_HELD = "(m.status = 'pending_review' OR m.head_status = 'pending_review')"
# The version held for review of every memory that has one.
_HELD_VERSIONS = (
    "FROM memories m JOIN memory_versions v ON v.tenant_id = m.tenant_id"
    " AND v.memory_id = m.memory_id AND v.version = coalesce(m.head_version, m.version)"
    f" WHERE {_HELD}"
)


async def pending_reviews(
    conn: Conn, tenant_id: str, limit: int = 100, memory_id: str | None = None
) -> list[PendingReview]:
    """The tenant's versions held for review, oldest first (of one memory, if named)."""
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            f"SELECT {VERSION_RECORD_COLUMNS}, m.created_at, v.event_type, v.occurred_at,"
            " v.actor_type, v.actor_id, v.policy_version, v.review_rule,"
            " m.status AS row_status, m.head_version"
            f" {_HELD_VERSIONS} AND m.tenant_id = %(tenant)s"
            " AND (%(memory)s::text IS NULL OR m.memory_id = %(memory)s)"
            " ORDER BY v.occurred_at, v.memory_id LIMIT %(limit)s",
            {"tenant": tenant_id, "limit": limit, "memory": memory_id},
        )
        rows = await cursor.fetchall()
    served = await load_records(
        conn,
        [(tenant_id, row["memory_id"]) for row in rows if row["head_version"] is not None],
        ONE_TENANT,
    )
    return [
        PendingReview(
            VersionEntry(
                record=record_from_row(row),
                event_id=row["last_event_id"],
                event_type=row["event_type"],
                occurred_at=row["occurred_at"],
                actor_type=row["actor_type"],
                actor_id=row["actor_id"],
                superseded_at=None,
                policy_version=row["policy_version"],
                review_rule=row["review_rule"],
            ),
            served.get((tenant_id, row["memory_id"])) if row["head_version"] is not None else None,
        )
        for row in rows
    ]


async def review_queue(conn: Conn, now: datetime) -> dict[str, tuple[int, float]]:
    """Per tenant: how many versions await review and the oldest one's age in seconds."""
    # The held version's time by primary key, one probe per held memory, whatever the
    # planner estimates: it misjudges the join on the coalesce and may scan all of
    # memory_versions (ops/decisions/governed-writes.md, "Review surfaces"). Refreshed every
    # second, this grows with the queue, never with the history.
    cursor = await conn.execute(
        cross_tenant("review-gauges")
        + "SELECT m.tenant_id, count(*), extract(epoch FROM %s - min(("
        " SELECT v.occurred_at FROM memory_versions v WHERE v.tenant_id = m.tenant_id"
        " AND v.memory_id = m.memory_id AND v.version = coalesce(m.head_version, m.version))))"
        f" FROM memories m WHERE {_HELD} GROUP BY m.tenant_id",
        (now,),
    )
    return {str(r[0]): (int(r[1]), float(r[2])) for r in await cursor.fetchall()}


async def memories_from_conversation(
    conn: Conn, tenant_id: str, conversation_id: str
) -> list[MemoryRecord]:
    """Every memory whose source is a message of this conversation, whatever its status."""
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            f"SELECT {RECORD_COLUMNS} FROM memories"
            " WHERE tenant_id = %s AND source_conversation_id = %s ORDER BY memory_id",
            (tenant_id, conversation_id),
        )
        return [record_from_row(row) for row in await cursor.fetchall()]


async def held_versions(
    conn: Conn, keys: Sequence[MemoryKey], lookups: KeyLookups
) -> dict[MemoryKey, tuple[int, str]]:
    """The version and status of each of these memories the projection holds."""
    rows = await lookups.fetch(
        conn,
        "SELECT tenant_id, memory_id, version, status FROM memories"
        " JOIN {keys} USING (tenant_id, memory_id) WHERE memories.tenant_id = {tenant}",
        ("tenant_id", "memory_id"),
        keys,
    )
    return {(r[0], r[1]): (r[2], r[3]) for r in rows}


async def count_recallable(conn: Conn, tenant_id: str, memory_ids: Sequence[str]) -> int:
    """How many of these memories recall may return (by status)."""
    cursor = await conn.execute(
        "SELECT count(*) FROM memories WHERE tenant_id = %s AND memory_id = ANY(%s)"
        f" AND status IN ({', '.join(repr(status) for status in ELIGIBLE_STATUSES)})",
        (tenant_id, list(memory_ids)),
    )
    row = await cursor.fetchone()
    return int(row[0]) if row else 0


# -- erasure ------------------------------------------------------------------------------------


async def memories_about(
    conn: Conn, tenant_id: str, subject_type: str | None, subject_id: str
) -> list[str]:
    """The ids of the memories about a subject."""
    cursor = await conn.execute(
        "SELECT memory_id FROM memories"
        " WHERE tenant_id = %s AND subject_type = %s AND subject_id = %s",
        (tenant_id, subject_type, subject_id),
    )
    return [row[0] for row in await cursor.fetchall()]


async def memories_taken_from(
    conn: Conn, tenant_id: str, conversation_ids: Sequence[str]
) -> list[str]:
    """The ids of the memories whose source points into these conversations."""
    cursor = await conn.execute(
        "SELECT memory_id FROM memories WHERE tenant_id = %s AND source_conversation_id = ANY(%s)",
        (tenant_id, list(conversation_ids)),
    )
    return [row[0] for row in await cursor.fetchall()]


async def memory_values(
    conn: Conn, tenant_id: str, memory_ids: Sequence[str]
) -> list[tuple[str, str, dict[str, Any]]]:
    """(id, kind, value) of these memories."""
    cursor = await conn.execute(
        "SELECT memory_id, kind, value FROM memories WHERE tenant_id = %s AND memory_id = ANY(%s)",
        (tenant_id, list(memory_ids)),
    )
    return [(row[0], row[1], row[2]) for row in await cursor.fetchall()]


async def erase(conn: Conn, scope: ErasureScope) -> None:
    """The erased memories and their history, and every version taken from a conversation
    whose derived memories are erased (a memory not erased keeps its other versions; a
    content erasure leaves every version taken from it)."""
    memories = list(scope.memories)
    await conn.execute(
        "DELETE FROM memories WHERE tenant_id = %s AND memory_id = ANY(%s)",
        (scope.tenant_id, memories),
    )
    await conn.execute(
        "DELETE FROM memory_versions WHERE tenant_id = %s"
        " AND (memory_id = ANY(%s) OR source_conversation_id = ANY(%s))",
        (scope.tenant_id, memories, list(scope.sources)),
    )


# -- rows that other modules' queries join -------------------------------------------------------

REACH_ROWS = (
    "SELECT tenant_id, memory_id, subject_type, subject_id, source_conversation_id, expires_at"
    " FROM memories"
)
"""Each memory's subject, source conversation and expiry: the row source that the legal holds'
and the retention schedule's queries join (``FROM ({REACH_ROWS}) m``). One statement each, so a
hold and an expiry are read together; this module stays the one that knows the table."""


# -- statistics (the demo's report) --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemoryStatistics:
    by_status: list[tuple[str, str, int]]
    """(tenant, status, count), by tenant and status."""
    versions: int
    expired_now: int
    with_history: tuple[str, str, str] | None
    """A memory that has a history worth showing (version 3 or later, not revoked): tenant,
    ``subject_type:subject_id``, memory id."""


async def statistics(conn: Conn) -> MemoryStatistics:
    cursor = await conn.execute(
        "SELECT tenant_id, status, count(*) FROM memories GROUP BY 1, 2 ORDER BY 1, 2"
    )
    by_status = [(str(t), str(s), int(c)) for t, s, c in await cursor.fetchall()]
    cursor = await conn.execute("SELECT count(*) FROM memories WHERE expires_at <= now()")
    expired = await cursor.fetchone()
    cursor = await conn.execute("SELECT count(*) FROM memory_versions")
    versions = await cursor.fetchone()
    cursor = await conn.execute(
        "SELECT tenant_id, subject_type || ':' || subject_id, memory_id FROM memories"
        " WHERE version >= 3 AND status <> 'revoked' ORDER BY tenant_id, memory_id LIMIT 1"
    )
    example = await cursor.fetchone()
    return MemoryStatistics(
        by_status,
        int(versions[0]) if versions else 0,
        int(expired[0]) if expired else 0,
        None if example is None else (str(example[0]), str(example[1]), str(example[2])),
    )


async def most_remembered_subject(conn: Conn) -> tuple[str, str, str] | None:
    """The subject with the most eligible, unexpired memories: tenant, subject type and id."""
    cursor = await conn.execute(
        "SELECT tenant_id, subject_type, subject_id FROM memories"
        " WHERE status IN ('verified', 'proposed') AND (expires_at IS NULL OR expires_at > now())"
        " GROUP BY 1, 2, 3 ORDER BY count(*) DESC, 1, 2, 3 LIMIT 1"
    )
    row = await cursor.fetchone()
    return None if row is None else (str(row[0]), str(row[1]), str(row[2]))
