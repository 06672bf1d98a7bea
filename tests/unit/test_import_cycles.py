"""No import cycle between the top-level packages of `tailguard` (issue 26): with one, no order
of layers holds, and a newcomer cannot tell which side is the lower one.

The graph is grimp's, the one import-linter checks the layers contract (pyproject.toml) on;
every import counts, those inside functions too. The imports that contract ignores (each a
known wrong-way arrow, with its reason there) are left out here as well, and each must still
exist, so that the exception goes once the arrow does.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

import grimp
import pytest

ROOT = "tailguard"
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _layers_contract() -> dict[str, object]:
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c["type"] == "layers" and c["containers"] == [ROOT]]
    return dict(layers)


def _ignored() -> list[tuple[str, str]]:
    rules = _layers_contract().get("ignore_imports", [])
    assert isinstance(rules, list)
    return [(a.strip(), b.strip()) for a, b in (str(rule).split("->") for rule in rules)]


def _top(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == ROOT else None


def package_graph(
    graph: grimp.ImportGraph, ignored: Iterable[tuple[str, str]] = ()
) -> dict[str, set[str]]:
    """Top-level package -> the top-level packages it imports (the package file of `tailguard`
    itself, which loads the public API lazily, is no package of its own)."""
    skip = set(ignored)
    edges: dict[str, set[str]] = {}
    for importer in graph.modules:
        source = _top(importer)
        if source is None:
            continue
        edges.setdefault(source, set())
        for imported in graph.find_modules_directly_imported_by(importer):
            target = _top(imported)
            if target is not None and target != source and (importer, imported) not in skip:
                edges[source].add(target)
    return edges


def cycles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one package (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(ROOT, cache_dir=None)


def test_no_cycle_between_top_level_packages(graph: grimp.ImportGraph) -> None:
    found = cycles(package_graph(graph, _ignored()))
    assert found == [], (
        "import cycles between tailguard's top-level packages (move the shared piece down to "
        f"the lower layer it belongs to): {found}"
    )


def test_each_ignored_wrong_way_import_still_exists(graph: grimp.ImportGraph) -> None:
    for importer, imported in _ignored():
        assert imported in graph.find_modules_directly_imported_by(importer), (
            f"{importer} no longer imports {imported}: take it out of the layers contract's "
            "ignore_imports in pyproject.toml"
        )


def test_the_cycle_finder_finds_cycles_through_any_number_of_packages() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}) == [["a", "b"], ["c", "d"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
