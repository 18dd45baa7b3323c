"""No import cycle among memproj's modules: a newcomer can read any module after the modules
it imports, and change one without the others coming back to it.

The graph is read from the source (``ast``), not by importing: every ``import`` counts,
at a module's top and inside its functions alike, since an import moved into a function
to dodge a cycle still ties the two modules together.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("topics", "projections", "streams", "ops")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def imported(module: str, path: Path, known: Mapping[str, Path]) -> Iterator[str]:
    """The project modules ``module`` imports: ``from a.b import c`` is module ``a.b.c``
    when that is a module, else ``a.b`` (a name defined in it)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for name in names:
            if name in known and name != module:
                yield name


@functools.cache
def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {module: set(imported(module, path, known)) for module, path in known.items()}


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_graph_sees_imports_inside_functions() -> None:
    graph = import_graph()
    # build_embedder imports the model's module only when it is chosen (numpy, tokenizers).
    assert "projections.embeddings.wordllama" in graph["projections.embeddings.factory"]
    assert "projections.deletion.ledger" in graph["projections.memory.reducer"]


def test_a_cycle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_module_imports_itself_back() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)
