"""The dev server's modules import each other without cycles (counting lazy and type-only imports)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import strands_slime.devserver

pytestmark = pytest.mark.unit

PACKAGE = "strands_slime.devserver"


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere (top level, in functions, under TYPE_CHECKING)."""
    root = Path(strands_slime.devserver.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
                deps.add(node.module)
                deps.update(f"{node.module}.{alias.name}" for alias in node.names)  # submodule imports
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names if alias.name.startswith(PACKAGE))
        graph[".".join([PACKAGE, *parts])] = deps
    return {name: {dep for dep in deps if dep in graph and dep != name} for name, deps in graph.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_devserver_modules_have_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 15 and f"{PACKAGE}.backends.base" in graph[f"{PACKAGE}.backends.hf"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
