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
