"""The migrations ship with the package, numbered once each, in order."""

from __future__ import annotations

from pathlib import Path

from projections.migrate import available

PACKAGE = Path(__file__).resolve().parents[2] / "projections"


def test_the_migrations_are_the_packages_numbered_sql_files_in_order() -> None:
    found = available()
    assert [name for _, name, _ in found] == sorted(
        p.name for p in PACKAGE.glob("migrations/*.sql")
    )
    numbers = [number for number, _, _ in found]
    assert numbers == list(range(1, len(found) + 1))
