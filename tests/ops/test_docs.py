"""The README and the pages of docs/ and ops/ stay navigable and true to the registries: every
relative link resolves (its anchor too), every page of docs/ is reachable from the README, and
every table or line that names a worker kind's port says what the worker registry says."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from streams.worker import WORKERS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
RUNBOOKS = sorted((ROOT / "ops" / "runbooks").glob("*.md"))
# The operator's pages (the API and erasure references, decisions, runbooks, results) too.
OPS_PAGES = sorted((ROOT / "ops").glob("**/*.md"))
LINKED_PAGES = [README, *DOCS, *OPS_PAGES]
# Where operators read worker ports: the README, the design pages and the runbooks.
PORT_PAGES = [README, *DOCS, *RUNBOOKS]
README_MAX_LINES = 600
TABLE_ROW_MAX_CHARS = 1000

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def prose(text: str) -> Iterator[str]:
    """The lines of a Markdown page outside its code blocks."""
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield line


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for line in prose(page.read_text()):
        if line.startswith("#"):
            slug = anchor(line.lstrip("#"))
            # A repeated heading gets -1, -2, ...
            n = 0
            candidate = slug
            while candidate in found:
                n += 1
                candidate = f"{slug}-{n}"
            found.add(candidate)
    return found


def relative_links(page: Path) -> Iterator[tuple[str, str]]:
    for line in prose(page.read_text()):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            yield path, fragment


@pytest.mark.parametrize("page", LINKED_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for path, fragment in relative_links(page):
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{path}: no such file")
        elif fragment and target.suffix == ".md" and fragment not in anchors(target):
            broken.append(f"{path}#{fragment}: no such heading")
    assert not broken, broken


def test_every_page_of_docs_is_linked_from_the_readme() -> None:
    linked = {(README.parent / path).resolve() for path, _ in relative_links(README) if path}
    assert [p.name for p in DOCS if p.resolve() not in linked] == []


def test_the_readme_is_a_users_guide() -> None:
    # The design reference lives in docs/; the README stays short enough to read.
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES
    long_rows = [
        line[:60] for line in lines if line.startswith("|") and len(line) > TABLE_ROW_MAX_CHARS
    ]
    assert long_rows == []


def worker_tables(page: Path) -> Iterator[list[list[str]]]:
    """Every table whose header has a 'kind' and a 'metrics port' column, as rows of cells."""
    rows: list[list[str]] = []
    for line in [*prose(page.read_text()), ""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
            continue
        if rows and "kind" in rows[0] and "metrics port" in rows[0]:
            yield rows
        rows = []


def test_the_readme_lists_every_worker_kind_as_the_registry_does() -> None:
    tables = list(worker_tables(README))
    assert len(tables) == 1, "the README's worker table"
    header, _, *rows = tables[0]
    column = {name: header.index(name) for name in header}
    listed = [row[column["kind"]].strip("`") for row in rows]
    assert listed == list(WORKERS.kinds)
    for row in rows:
        kind = WORKERS.kinds[row[column["kind"]].strip("`")]
        assert row[column["metrics port"]] == str(kind.metrics_port), kind.name
        group = f"`memproj-{kind.name}`" if kind.consumers else "(none)"
        assert row[column["consumer group"]] == group, kind.name
        assert row[column["processes"]] == ("many" if kind.single is None else "one"), kind.name


@pytest.mark.parametrize("page", PORT_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_worker_port_named_by_hand_is_the_registrys(page: Path) -> None:
    ports = WORKERS.metrics_ports
    kinds = "|".join(ports)
    # "memory 9101", "`memory` (9101)", "memory: 9101", ...
    pattern = re.compile(rf"\b({kinds})\b`?\W{{0,3}}(9\d{{3}})\b")
    wrong = [
        (name, int(port))
        for line in page.read_text().splitlines()
        for name, port in pattern.findall(line)
        if ports[name] != int(port)
    ]
    assert wrong == []
    for header, _, *rows in worker_tables(page):
        kind_at, port_at = header.index("kind"), header.index("metrics port")
        table = {row[kind_at].strip("`"): int(row[port_at]) for row in rows}
        assert table == ports
