"""The retention classes of each tenant (``retention_classes``): class -> period after the
conversation's last message, or keep (a NULL period). The class ``*`` is the tenant's default
for the classes it does not name."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from projections.distribution import cross_tenant
from projections.retention.schedule import TENANT_DEFAULT, Period, Policy
from projections.sql import Conn, KeyLookups

# The period of a row's class, in seconds, for the queries that narrow rows down by it in SQL
# (the retention schedule's): the tenant's class, else the tenant's default, else the
# deployment's (``%(global)s``); NULL: kept. It reads the aliases ``period_joins`` adds.
PERIOD = (
    "CASE WHEN k.tenant_id IS NOT NULL THEN k.period_seconds"
    " WHEN d.tenant_id IS NOT NULL THEN d.period_seconds ELSE %(global)s::bigint END"
)


def period_joins(row: str) -> str:
    """The joins ``PERIOD`` reads, for the row alias ``row`` that has ``tenant_id`` and
    ``retention_class`` columns (adds the aliases ``k`` and ``d``)."""
    return (
        " LEFT JOIN retention_classes k"
        f" ON k.tenant_id = {row}.tenant_id AND k.retention_class = {row}.retention_class"
        " LEFT JOIN retention_classes d"
        f" ON d.tenant_id = {row}.tenant_id AND d.retention_class = '{TENANT_DEFAULT}'"
    )


@dataclass(frozen=True, slots=True)
class ClassRow:
    tenant_id: str
    retention_class: str
    period: Period
    updated_at: datetime
    updated_by: str


async def set_class(
    conn: Conn, tenant_id: str, retention_class: str, period: Period, now: datetime, by: str
) -> None:
    await conn.execute(
        "INSERT INTO retention_classes"
        " (tenant_id, retention_class, period_seconds, updated_at, updated_by)"
        " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (tenant_id, retention_class) DO UPDATE SET"
        " period_seconds = EXCLUDED.period_seconds, updated_at = EXCLUDED.updated_at,"
        " updated_by = EXCLUDED.updated_by",
        (
            tenant_id,
            retention_class,
            None if period is None else round(period.total_seconds()),
            now,
            by,
        ),
    )


async def clear_class(conn: Conn, tenant_id: str, retention_class: str) -> bool:
    cursor = await conn.execute(
        "DELETE FROM retention_classes WHERE tenant_id = %s AND retention_class = %s",
        (tenant_id, retention_class),
    )
    return cursor.rowcount > 0


async def list_classes(conn: Conn, tenant_id: str | None = None) -> list[ClassRow]:
    cursor = await conn.execute(
        cross_tenant("operator-listing")
        + "SELECT tenant_id, retention_class, period_seconds, updated_at, updated_by"
        " FROM retention_classes WHERE %(tenant)s::text IS NULL OR tenant_id = %(tenant)s"
        " ORDER BY tenant_id, retention_class",
        {"tenant": tenant_id},
    )
    return [
        ClassRow(t, c, None if p is None else timedelta(seconds=p), at, by)
        for t, c, p, at, by in await cursor.fetchall()
    ]


async def policies(
    conn: Conn, tenants: Iterable[str], global_default: Period, lookups: KeyLookups
) -> dict[str, Policy]:
    """Every tenant's policy among ``tenants`` (one with no class of its own gets the
    deployment's default alone)."""
    wanted = sorted(set(tenants))
    rows = await lookups.fetch(
        conn,
        "SELECT c.tenant_id, c.retention_class, c.period_seconds FROM retention_classes c"
        " JOIN {keys} USING (tenant_id) WHERE c.tenant_id = {tenant}",
        ("tenant_id",),
        ((tenant,) for tenant in wanted),
    )
    found: dict[str, dict[str, Period]] = {t: {} for t in wanted}
    for tenant, retention_class, seconds in rows:
        found[tenant][retention_class] = None if seconds is None else timedelta(seconds=seconds)
    return {t: Policy(classes, global_default) for t, classes in found.items()}
