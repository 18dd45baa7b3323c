"""The tables the migration files create, read from the files."""

from __future__ import annotations

import re
from pathlib import Path

MIGRATIONS = Path(__file__).resolve().parents[2] / "projections" / "migrations"
CREATE_TABLE = re.compile(r"create\s+table\s+(?:if\s+not\s+exists\s+)?(\w+)", re.IGNORECASE)


def migration_tables() -> set[str]:
    tables: set[str] = set()
    for migration in sorted(MIGRATIONS.glob("*.sql")):
        tables.update(name.lower() for name in CREATE_TABLE.findall(migration.read_text()))
    return tables
