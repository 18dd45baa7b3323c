"""The Citus placement registry: every table the migrations create is placed once, the
committed distribution script is the registry's, and the cross-tenant list is used."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from projections.distribution import (
    CROSS_TENANT,
    TABLES,
    Placement,
    citus_sql,
    cross_tenant,
    placed,
)
from support.migrations import migration_tables
from support.routing import judge

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ops" / "citus" / "distribute.sql"


def test_every_table_of_the_migrations_is_placed() -> None:
    # schema_migrations is created by projections/migrate.py, not by a migration file.
    assert set(TABLES) == migration_tables() | {"schema_migrations"}


def test_tables_without_a_tenant_say_why() -> None:
    for name in placed(Placement.REFERENCE) + placed(Placement.COORDINATOR):
        assert TABLES[name].why, f"{name} is not distributed and does not say why"


def test_the_committed_script_is_the_registrys() -> None:
    assert SCRIPT.read_text() == citus_sql(), (
        "ops/citus/distribute.sql is stale: memproj deploy citus"
    )


def test_the_script_distributes_each_tenant_table_once_co_located() -> None:
    script = citus_sql()
    distributed = re.findall(r"create_distributed_table\('(\w+)', 'tenant_id'", script)
    assert sorted(distributed) == placed(Placement.DISTRIBUTED)
    assert script.count("colocate_with => 'memories'") == len(distributed) - 1
    assert sorted(re.findall(r"create_reference_table\('(\w+)'\)", script)) == placed(
        Placement.REFERENCE
    )


def source_texts() -> str:
    return "\n".join(
        path.read_text()
        for package in ("projections", "streams")
        for path in (ROOT / package).rglob("*.py")
    )


def test_every_cross_tenant_statement_is_marked_in_the_code() -> None:
    texts = source_texts()
    unused = [name for name in CROSS_TENANT if f'cross_tenant("{name}")' not in texts]
    assert unused == [], f"CROSS_TENANT entries no statement names: {unused}"
    for name, why in CROSS_TENANT.items():
        assert why, f"{name} does not say why it reaches every tenant"


def test_a_statement_cannot_claim_an_unlisted_exemption() -> None:
    with pytest.raises(KeyError):
        cross_tenant("anything-goes")


ROUTED = [
    "SELECT * FROM memories WHERE tenant_id = $1 AND memory_id = $2",
    "SELECT * FROM memories WHERE tenant_id IN ($1)",
    "SELECT m.value FROM memories m JOIN memory_versions v"
    " ON v.tenant_id = m.tenant_id AND v.memory_id = m.memory_id WHERE m.tenant_id = $1",
    "SELECT a.store FROM deletion_store_acks a JOIN deletion_requests r"
    " USING (tenant_id, deletion_id) WHERE a.tenant_id = $1",
    "SELECT 1 FROM memories m WHERE m.tenant_id = $1 AND NOT EXISTS"
    " (SELECT 1 FROM erased_entities e WHERE e.tenant_id = m.tenant_id)",
    "WITH c AS (SELECT tenant_id, memory_id FROM memories WHERE tenant_id = $1)"
    " SELECT * FROM c JOIN memory_versions v ON v.tenant_id = c.tenant_id",
    "INSERT INTO memories (tenant_id, memory_id) VALUES ($1, $2)"
    " ON CONFLICT (tenant_id, memory_id) DO NOTHING",
    "UPDATE memories SET status = $2 WHERE tenant_id = $1 AND memory_id = $3",
    "COPY processed_events (projection, tenant_id, event_id, body_hash) FROM STDIN",
    # Reference and coordinator tables are free.
    "UPDATE projection_offsets SET next_offset = $1",
    "SELECT * FROM api_keys WHERE key_id = $1",
    "/* cross-tenant: redelivery */ SELECT * FROM deletion_store_acks",
]
UNROUTED = {
    "SELECT * FROM memories WHERE memory_id = $1": "memories is not tied",
    "SELECT m.value FROM memories m JOIN memory_versions v ON v.memory_id = m.memory_id"
    " WHERE m.tenant_id = $1": "memory_versions is not tied",
    "SELECT 1 FROM memories m WHERE m.tenant_id = $1 AND NOT EXISTS"
    " (SELECT 1 FROM erased_entities e WHERE e.entity_id = m.memory_id)": "erased_entities",
    "SELECT * FROM memories WHERE tenant_id = $1 OR memory_id = $2": "memories is not tied",
    "INSERT INTO processed_events (projection, tenant_id, event_id) VALUES ($1, $2, $3)"
    " ON CONFLICT (projection, event_id) DO NOTHING": "ON CONFLICT (projection, event_id)",
    "INSERT INTO rejections (projection, event_id) VALUES ($1, $2)": "without tenant_id",
    "COPY memories TO STDOUT": "reads every tenant",
    "DELETE FROM deletion_probes p USING deletion_requests r"
    " WHERE p.tenant_id = r.tenant_id AND r.deadline_at < now()": "deletion_probes",
    "/* cross-tenant: anything */ SELECT * FROM memories": "not in CROSS_TENANT",
}


@pytest.mark.parametrize("query", ROUTED)
def test_a_statement_tied_to_one_tenant_is_routable(query: str) -> None:
    verdict = judge(query)
    assert verdict.routable and not verdict.batch, verdict.problems


@pytest.mark.parametrize("query", list(UNROUTED))
def test_a_statement_not_tied_to_one_tenant_is_named_with_its_table(query: str) -> None:
    verdict = judge(query)
    assert not verdict.routable
    assert any(UNROUTED[query] in problem for problem in verdict.problems), verdict.problems


def test_a_lookup_of_a_batch_of_several_tenants_keys_is_told_apart() -> None:
    keyset = (
        "SELECT tenant_id, memory_id FROM memories JOIN (SELECT r->>$2 AS tenant_id,"
        " r->>$3 AS memory_id FROM jsonb_array_elements($1::jsonb) AS r) AS k"
        " USING (tenant_id, memory_id)"
    )
    for query in (keyset, "SELECT * FROM admission_policies WHERE tenant_id = ANY($1)"):
        verdict = judge(query)
        assert verdict.routable and verdict.batch, query
