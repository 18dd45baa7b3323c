"""The purpose policy table (``api_purposes``): one row per tenant and purpose."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from projections.access.policy import PurposePolicy
from projections.distribution import cross_tenant
from projections.sql import Conn


def _policy(row: dict[str, Any]) -> PurposePolicy:
    return PurposePolicy(
        tenant_id=row["tenant_id"],
        purpose=row["purpose"],
        kinds=frozenset(row["kinds"]),
        scopes=frozenset(row["scopes"]),
        conversations=row["conversations"],
    )


async def load_policy(conn: Conn, tenant_id: str, purpose: str) -> PurposePolicy | None:
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            "SELECT tenant_id, purpose, kinds, scopes, conversations FROM api_purposes"
            " WHERE tenant_id = %s AND purpose = %s",
            (tenant_id, purpose),
        )
        row = await cursor.fetchone()
    return _policy(row) if row is not None else None


async def set_policy(
    conn: Conn,
    tenant_id: str,
    purpose: str,
    kinds: Iterable[str],
    scopes: Iterable[str],
    conversations: bool,
    now: datetime,
) -> PurposePolicy:
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            "INSERT INTO api_purposes"
            " (tenant_id, purpose, kinds, scopes, conversations, updated_at)"
            " VALUES (%s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (tenant_id, purpose) DO UPDATE SET kinds = excluded.kinds,"
            " scopes = excluded.scopes, conversations = excluded.conversations,"
            " updated_at = excluded.updated_at"
            " RETURNING tenant_id, purpose, kinds, scopes, conversations",
            (tenant_id, purpose, sorted(set(kinds)), sorted(set(scopes)), conversations, now),
        )
        row = await cursor.fetchone()
    assert row is not None
    return _policy(row)


async def list_policies(conn: Conn, tenant_id: str | None = None) -> list[PurposePolicy]:
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(
            cross_tenant("operator-listing")
            + "SELECT tenant_id, purpose, kinds, scopes, conversations FROM api_purposes"
            " WHERE %(tenant)s::text IS NULL OR tenant_id = %(tenant)s ORDER BY tenant_id, purpose",
            {"tenant": tenant_id},
        )
        return [_policy(row) for row in await cursor.fetchall()]


async def remove_policy(conn: Conn, tenant_id: str, purpose: str) -> bool:
    cursor = await conn.execute(
        "DELETE FROM api_purposes WHERE tenant_id = %s AND purpose = %s", (tenant_id, purpose)
    )
    return cursor.rowcount > 0
