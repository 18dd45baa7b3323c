"""Where each table lives on a Citus cluster, and the statements allowed to reach every tenant.

One registry, read by the Citus SQL (``memproj deploy citus``: ops/citus/distribute.sql) and by
the routing test (tests/streams/test_citus_routing.py) that checks every statement memproj runs:

- ``DISTRIBUTED``: sharded by ``tenant_id``, the first column of the primary key and part of
  every unique constraint, all co-located with ``memories``. A statement on one filters (or
  inserts) by ``tenant_id`` equality, and joins two of them on ``tenant_id``: Citus routes it to
  one tenant's shard.
- ``REFERENCE``: small tables without a tenant, copied to every node, so that any statement
  may join them with a distributed table.
- ``COORDINATOR``: tables without a tenant that no statement joins with a distributed table;
  they stay plain tables on the coordinator (every memproj process connects to it), written in
  the same transactions as the shards.

A statement that must reach every tenant (a sweep of the maintenance duties) names its entry
of ``CROSS_TENANT`` in a leading comment (``cross_tenant``): Citus runs it on every shard, and
the routing test accepts it because it is on the list, with its reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import LiteralString

DISTRIBUTION_COLUMN = "tenant_id"
# The table the distributed tables are co-located with (any one of them would do).
COLOCATION_ANCHOR = "memories"


class Placement(StrEnum):
    DISTRIBUTED = "distributed"
    REFERENCE = "reference"
    COORDINATOR = "coordinator"


@dataclass(frozen=True)
class Table:
    placement: Placement
    why: str = ""


_TENANT = Table(Placement.DISTRIBUTED)

TABLES: Mapping[str, Table] = {
    # A tenant's data and its ledger.
    "memories": _TENANT,
    "memory_versions": _TENANT,
    "memory_evidence_flags": _TENANT,
    "conversations": _TENANT,
    "conversation_messages": _TENANT,
    "conversation_summaries": _TENANT,
    "conversation_context": _TENANT,
    "entity_keys": _TENANT,
    "shredded_keys": _TENANT,
    "vector_entries": _TENANT,
    "deletion_requests": _TENANT,
    "deletion_items": _TENANT,
    "deletion_store_acks": _TENANT,
    "deletion_probes": _TENANT,
    "deletion_purges": _TENANT,
    "erased_entities": _TENANT,
    "retention_classes": _TENANT,
    "retention_issued": _TENANT,
    "legal_holds": _TENANT,
    "admission_policies": _TENANT,
    "subject_pauses": _TENANT,
    "subject_pause_log": _TENANT,
    "processed_events": _TENANT,
    "rejections": _TENANT,
    "api_purposes": _TENANT,
    "api_proposals": _TENANT,
    "api_deletion_requests": _TENANT,
    "api_read_audit": _TENANT,
    # Without a tenant.
    "api_keys": Table(
        Placement.REFERENCE,
        "a request is authenticated by its key's id before its tenant is known; one row per key",
    ),
    "vector_collections": Table(
        Placement.REFERENCE,
        "one row per vector collection (the live one and the rebuilds'), read with the entries",
    ),
    "rebuild_schemas": Table(
        Placement.REFERENCE, "one row per rebuild schema; erasures walk it to reach the copies"
    ),
    "projection_offsets": Table(
        Placement.COORDINATOR,
        "one row per projection and input partition, written in each batch's transaction",
    ),
    "outbox": Table(
        Placement.COORDINATOR,
        "a producer's queue of decided messages, keyed by producer and batch, not by tenant",
    ),
    "dead_letter_keys": Table(
        Placement.COORDINATOR,
        "a dead letter's owner is read best effort: its tenant may be unknown (NULL)",
    ),
    "ghost_reads_blocked": Table(Placement.COORDINATOR, "one counter per derived store"),
    "ghost_audits": Table(Placement.COORDINATOR, "one audit row per derived store"),
    "schema_migrations": Table(
        Placement.COORDINATOR, "the migrations applied; Citus propagates DDL"
    ),
}

# name -> why it must reach every tenant. Short on purpose: a new entry is a statement that
# Citus runs on every shard.
CROSS_TENANT: Mapping[str, str] = {
    "redelivery": "the deletion duty resends every tombstone past its deadline, whose tenant it"
    " does not know before it finds it",
    "verification": "the deletion duty verifies the completed deletions not verified yet, oldest"
    " first, of every tenant",
    "purge-schedule": "the purge duty writes the places of every completed deletion not"
    " scheduled yet",
    "purge-due": "the purge duty's round over one place: the deletions not purged there yet",
    "purge-finish": "the purge duty marks purged every deletion whose places are all purged",
    "probe-expiry": "the probes of every deletion past its deadline are dropped in one"
    " statement, so that none outlives it",
    "read-audit-trim": "the read audit is trimmed past its retention, whatever the tenant",
    "deletion-gauges": "the metrics count the pending deletions per store and the unpurged"
    " ones per place, over every tenant",
    "review-gauges": "the metrics count the held versions and the flagged memories over every"
    " tenant",
    "retention-round": "the retention schedule finds the conversations and memories due, of"
    " every tenant, oldest first",
    "retention-receipt": "the retention report counts per tenant and class, over every tenant",
    "key-rotation": "a master-key rotation re-wraps and counts the data keys and sealed probes"
    " of every tenant",
    "operator-listing": "the CLI's listings for one tenant or, without --tenant, every tenant;"
    " and the tenants that hold a deletion id, when an operator names no tenant",
}


def cross_tenant(name: LiteralString) -> LiteralString:
    """The comment that marks a statement as the cross-tenant maintenance statement ``name``;
    pg_stat_statements keeps it, so the routing test (and an operator) sees which one it is."""
    if name not in CROSS_TENANT:
        raise KeyError(f"{name} is not a cross-tenant statement of projections.distribution")
    return "/* cross-tenant: " + name + " */ "


def placed(placement: Placement) -> list[str]:
    return sorted(name for name, table in TABLES.items() if table.placement is placement)


CITUS_SQL_HEADER = """\
-- Distributes memproj's tables on a Citus cluster: generated by `memproj deploy citus` from
-- projections/distribution.py; edit that registry, not this file.
--
-- Run it on the coordinator after `memproj db migrate`, and again after every migrate that
-- adds a table: it distributes only the tables not distributed yet. Tenant tables are sharded
-- by tenant_id and co-located; tables without a tenant are reference tables or stay on the
-- coordinator (ops/DEPLOY.md, "PostgreSQL on Citus").
"""


def citus_sql() -> str:
    """The idempotent Citus statements of the registry, in one transaction-free script."""

    def unless_done(call: str, table: str) -> str:
        return (
            "DO $$ BEGIN\n"
            "  IF NOT EXISTS (SELECT FROM pg_dist_partition"
            f" WHERE logicalrelid = '{table}'::regclass) THEN\n"
            f"    PERFORM {call};\n"
            "  END IF;\n"
            "END $$;\n"
        )

    lines = [CITUS_SQL_HEADER, "CREATE EXTENSION IF NOT EXISTS citus;\n"]
    lines.append(
        "\n-- Tables without a tenant that any statement may join: a copy on every node.\n"
    )
    for table in placed(Placement.REFERENCE):
        lines.append(unless_done(f"create_reference_table('{table}')", table))
    lines.append(
        f"\n-- A tenant's rows: sharded by {DISTRIBUTION_COLUMN}, co-located with"
        f" {COLOCATION_ANCHOR}.\n"
    )
    anchor = COLOCATION_ANCHOR
    lines.append(
        unless_done(f"create_distributed_table('{anchor}', '{DISTRIBUTION_COLUMN}')", anchor)
    )
    for table in placed(Placement.DISTRIBUTED):
        if table != anchor:
            call = (
                f"create_distributed_table('{table}', '{DISTRIBUTION_COLUMN}',"
                f" colocate_with => '{anchor}')"
            )
            lines.append(unless_done(call, table))
    lines.append("\n-- Left as plain tables on the coordinator:\n")
    for table in placed(Placement.COORDINATOR):
        lines.append(f"--   {table}: {TABLES[table].why}\n")
    return "".join(lines)
