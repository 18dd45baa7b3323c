"""memproj uses the libraries it depends on (the standard library included) through their
public APIs. A private name of a library (``module._name``, ``from module._private import
...``) is an upgrade that breaks without a word: the few memproj relies on are listed below,
each where its module names the library's pinned version and the test that fails when the
library changes it."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("topics", "projections", "streams", "ops")
FIRST_PARTY = frozenset({*PACKAGES, "support", "tests", "conftest"})

# Each private name relied on, and why it may be.
ALLOWED = {
    # Documented (the standard library's exit without cleanup, for a child process).
    "os._exit": "public despite its underscore",
    # streams/api/heads.py names h11 0.16 (pinned in ops/constraints.txt);
    # tests/streams/api/test_heads.py fails when h11 changes it.
    "h11._connection.DEFAULT_MAX_INCOMPLETE_EVENT_SIZE": "pinned and guarded",
}


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def private_uses(source: str) -> set[str]:
    """The private names of other libraries ``source`` reaches, as dotted names."""
    tree = ast.parse(source)
    modules: dict[str, str] = {}  # local name -> library module
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top not in FIRST_PARTY:
                    modules[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in FIRST_PARTY:
                continue
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                if any(_private(part) for part in name.split(".")):
                    found.add(name)
                elif _is_module(name):
                    modules[alias.asname or alias.name] = name
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        chain: list[str] = []
        value: ast.expr = node
        while isinstance(value, ast.Attribute):
            chain.insert(0, value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in modules:
            # The whole chain up to and including its first private part.
            for n, part in enumerate(chain):
                if _private(part):
                    found.add(".".join([modules[value.id], *chain[: n + 1]]))
                    break
    return found


def test_the_check_finds_a_private_name_however_it_is_reached() -> None:
    source = (
        "import asyncio\n"
        "import multiprocessing as mp\n"
        "from concurrent import futures\n"
        "from lancedb.table import _optimize_cleanup_since_ms\n"
        "from streams.worker import _private_of_ours\n"
        "asyncio.events._set_running_loop(None)\n"
        "mp.util._exit_function()\n"
        "futures._base.LOGGER\n"
        "asyncio.run(main())\n"
    )
    assert private_uses(source) == {
        "asyncio.events._set_running_loop",
        "multiprocessing.util._exit_function",
        "concurrent.futures._base",
        "lancedb.table._optimize_cleanup_since_ms",
    }


def test_memproj_reaches_no_private_name_of_a_library_but_the_listed_ones() -> None:
    found: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for name in private_uses(path.read_text()):
                found.setdefault(name, []).append(str(path.relative_to(REPO)))
    unlisted = {name: paths for name, paths in found.items() if name not in ALLOWED}
    assert not unlisted, f"private names of libraries: {unlisted}"
    assert set(ALLOWED) <= set(found), f"no longer used: {sorted(set(ALLOWED) - set(found))}"
