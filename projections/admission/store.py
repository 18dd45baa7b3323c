"""PostgreSQL persistence of admission policies (table ``admission_policies``): append-only,
one row per (tenant, version). Read by (tenant, version), which never changes once written,
so the decisions made from a policy are as replayable as the log."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from projections.admission.policy import (
    EMPTY_DOCUMENT,
    NO_POLICY_VERSION,
    Policy,
    PolicyDocument,
    parse_document,
)
from projections.sql import Conn, KeyLookups


@dataclass(frozen=True, slots=True)
class StoredPolicy:
    tenant_id: str
    version: int
    document: PolicyDocument
    created_at: datetime
    created_by: str

    @property
    def policy(self) -> Policy:
        return self.document.policy(self.tenant_id, self.version)

    @property
    def cleared(self) -> bool:
        return self.document == EMPTY_DOCUMENT


def _stored(row: dict[str, object]) -> StoredPolicy:
    return StoredPolicy(
        tenant_id=str(row["tenant_id"]),
        version=int(row["version"]),  # type: ignore[call-overload]
        document=parse_document(row["rules"]),
        created_at=row["created_at"],  # type: ignore[arg-type]
        created_by=str(row["created_by"]),
    )


async def add_version(
    conn: Conn, tenant_id: str, document: PolicyDocument, created_by: str
) -> StoredPolicy:
    """Store ``document`` as the tenant's next policy version (in the caller's transaction;
    two writers of one tenant are serialised by the primary key: the second fails)."""
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            "INSERT INTO admission_policies (tenant_id, version, rules, created_by)"
            " SELECT %(tenant)s, coalesce(max(version), 0) + 1, %(rules)s, %(by)s"
            " FROM admission_policies WHERE tenant_id = %(tenant)s"
            " RETURNING tenant_id, version, rules, created_at, created_by",
            {
                "tenant": tenant_id,
                "rules": Jsonb(document.model_dump(mode="json")),
                "by": created_by,
            },
        )
        row = await cursor.fetchone()
    assert row is not None
    return _stored(row)


async def current_versions(
    conn: Conn, tenants: Iterable[str], lookups: KeyLookups
) -> dict[str, int]:
    """Each tenant's latest policy version; a tenant without a policy is absent (version 0)."""
    rows = await lookups.fetch(
        conn,
        "SELECT a.tenant_id, max(a.version) FROM admission_policies a"
        " JOIN {keys} USING (tenant_id) WHERE a.tenant_id = {tenant} GROUP BY a.tenant_id",
        ("tenant_id",),
        ((tenant,) for tenant in tenants),
    )
    return {str(row[0]): int(row[1]) for row in rows}


async def load_policies(
    conn: Conn, keys: Iterable[tuple[str, int]], lookups: KeyLookups
) -> dict[tuple[str, int], Policy]:
    """The policies of these (tenant, version) pairs; version 0 (no policy) is not stored."""
    wanted = {key for key in keys if key[1] != NO_POLICY_VERSION}
    if not wanted:
        return {}
    rows = await lookups.fetch(
        conn,
        "SELECT a.tenant_id, a.version, a.rules, a.created_at, a.created_by"
        " FROM admission_policies a JOIN {keys}"
        " ON a.tenant_id = {tenant} AND a.version = k.version::integer",
        ("tenant_id", "version"),
        ((tenant, str(version)) for tenant, version in wanted),
        row_factory=dict_row,
    )
    found = (s for s in map(_stored, rows) if (s.tenant_id, s.version) in wanted)
    return {(s.tenant_id, s.version): s.policy for s in found}


async def history(conn: Conn, tenant_id: str) -> list[StoredPolicy]:
    """Every version of the tenant's policy, oldest first."""
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            "SELECT tenant_id, version, rules, created_at, created_by FROM admission_policies"
            " WHERE tenant_id = %s ORDER BY version",
            (tenant_id,),
        )
        return [_stored(row) for row in await cursor.fetchall()]


async def load_version(conn: Conn, tenant_id: str, version: int | None) -> StoredPolicy | None:
    """One version of the tenant's policy (None: the latest); None if there is none."""
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            "SELECT tenant_id, version, rules, created_at, created_by FROM admission_policies"
            " WHERE tenant_id = %(tenant)s AND (%(version)s::int IS NULL OR version = %(version)s)"
            " ORDER BY version DESC LIMIT 1",
            {"tenant": tenant_id, "version": version},
        )
        row = await cursor.fetchone()
    return None if row is None else _stored(row)


async def tenants(conn: Conn) -> list[tuple[str, int, datetime]]:
    """Every tenant with a policy: its latest version and when it was set."""
    cursor = await conn.execute(
        "SELECT DISTINCT ON (tenant_id) tenant_id, version, created_at FROM admission_policies"
        " ORDER BY tenant_id, version DESC"
    )
    return [(str(r[0]), int(r[1]), r[2]) for r in await cursor.fetchall()]
