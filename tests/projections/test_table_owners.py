"""Each table's SQL lives in one module: the scan that keeps it so.

The tables are the ones the migrations create; a module "has SQL for" a table when a string
literal in it names the table after FROM, INTO, UPDATE, JOIN, USING or TABLE, or passes it to a
``copy_*`` helper. The
allow-list names each remaining exception and why it stays.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

from support.migrations import migration_tables

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("projections", "streams")

SQL_VERB = r"(?:from|into|update|join|using|table|exists)"

# (module, table): why this module may hold SQL naming a table it does not own. A query that
# spans tables lives with the table it is about and reads the others through the row sources
# and rules their owners name (``memory_store.REACH_ROWS``, ``classes.period_joins``, ...).
ALLOWED: dict[tuple[str, str], str] = {
    ("projections/deletion/probes.py", "deletion_requests"): (
        "the probes past their request's deadline are dropped in one statement reading the"
        " ledger, so that no probe outlives it between two; the ledger's owner (lifecycle)"
        " drops a verified request's probes through this module, so this module cannot"
        " import a row source from it"
    ),
    ("projections/deletion/coverage.py", "erased_entities"): (
        "the coverage rules compose the erasure index into the erase, count and ghost"
        " statements of every personal-data table; its owners run them"
    ),
}


def string_literals(source: str) -> list[str]:
    """The module's strings; a table named to a ``copy_*`` helper (``COPY ... FROM STDIN``)
    counts as ``INTO`` it."""
    literals: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            literals.append(node.value)
        elif isinstance(node, ast.Call) and _called(node.func).startswith("copy"):
            for arg in node.args[:2]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    literals.append(f"INTO {arg.value}")
    return literals


def _called(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def modules_naming_tables(tables: set[str]) -> dict[str, set[str]]:
    pattern = re.compile(
        rf"\b{SQL_VERB}\s+(?:only\s+)?({'|'.join(sorted(tables, key=len, reverse=True))})\b",
        re.IGNORECASE,
    )
    modules: dict[str, set[str]] = defaultdict(set)
    for package in SCANNED:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = path.relative_to(ROOT).as_posix()
            for literal in string_literals(path.read_text()):
                for table in pattern.findall(literal):
                    modules[table.lower()].add(module)
    return modules


def test_the_migrations_create_tables() -> None:
    assert {"memories", "deletion_requests", "erased_entities"} <= migration_tables()


def test_each_table_has_sql_in_one_module() -> None:
    shared = {}
    for table, modules in modules_naming_tables(migration_tables()).items():
        remaining = {module for module in modules if (module, table) not in ALLOWED}
        if len(remaining) > 1:
            shared[table] = sorted(remaining)
    assert shared == {}, f"tables with SQL in more than one module: {shared}"


def test_the_allow_list_names_only_real_exceptions() -> None:
    modules = modules_naming_tables(migration_tables())
    stale = [key for key in ALLOWED if key[0] not in modules.get(key[1], set())]
    assert stale == [], f"allow-listed modules that no longer name the table: {stale}"
