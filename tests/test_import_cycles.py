"""No import cycles inside strands_slime.

The import graph of every module of the package (imports inside functions and under
``TYPE_CHECKING`` included: a lazy import is still a dependency) is built statically with grimp,
and every strongly connected component of more than one module is a cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pytest

grimp = pytest.importorskip("grimp", reason="grimp (a [dev] dependency) builds the import graph")

pytestmark = pytest.mark.unit

PACKAGE = "strands_slime"

# Cycles other engineers are breaking on their branches (issue 15, point 3). Remove each entry once its
# fix is merged: an entry whose cycle no longer exists fails the test, so the list cannot go stale.
ALLOWED_CYCLES: frozenset[frozenset[str]] = frozenset()


def strongly_connected_components(edges: Mapping[str, Iterable[str]]) -> list[frozenset[str]]:
    """Tarjan's algorithm, iterative (no recursion limit): the components with more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[frozenset[str]] = []
    for root in edges:
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(edges.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, pending = work[-1]
            if pending:
                child = pending.pop()
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, sorted(edges.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                members = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.add(member)
                    if member == node:
                        break
                if len(members) > 1:
                    components.append(frozenset(members))
    return components


def test_the_cycle_finder_finds_cycles_and_nothing_else() -> None:
    edges = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": ["e"], "e": ["d"], "f": ["a"], "g": []}
    assert set(strongly_connected_components(edges)) == {frozenset("abc"), frozenset("de")}
    assert strongly_connected_components({"a": ["b"], "b": []}) == []


@pytest.fixture(scope="module")
def import_graph():
    return grimp.build_graph(PACKAGE, cache_dir=None)


def _describe(graph, cycle: frozenset[str]) -> str:
    lines = []
    for importer in sorted(cycle):
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & cycle):
            for detail in graph.get_import_details(importer=importer, imported=imported):
                lines.append(f"  {importer}:{detail['line_number']}: {detail['line_contents']}")
    return "\n".join(lines)


def test_the_graph_covers_every_module(import_graph) -> None:
    modules = import_graph.modules
    for expected in (
        "strands_slime.config",
        "strands_slime.reward.dapo",
        "strands_slime.runtime",
        "strands_slime.rollout.episode",
    ):
        assert expected in modules
    assert any(name.startswith("strands_slime.devserver.") for name in modules)


def test_no_import_cycles_in_the_package(import_graph) -> None:
    edges = {
        module: import_graph.find_modules_directly_imported_by(module) for module in import_graph.modules
    }
    cycles = strongly_connected_components(edges)
    new = [cycle for cycle in cycles if cycle not in ALLOWED_CYCLES]
    assert not new, "import cycles:\n" + "\n\n".join(_describe(import_graph, cycle) for cycle in new)
    stale = ALLOWED_CYCLES - set(cycles)
    assert not stale, (
        f"these allow-listed cycles are gone, remove them from ALLOWED_CYCLES: {sorted(map(sorted, stale))}"
    )


def test_config_and_reward_do_not_import_each_other(import_graph) -> None:
    assert not import_graph.chain_exists(
        importer="strands_slime.config", imported="strands_slime.reward.dapo"
    )
    assert import_graph.direct_import_exists(
        importer="strands_slime.reward.dapo", imported="strands_slime.config"
    )


def test_the_runtime_is_a_leaf(import_graph) -> None:
    """Every module may use the runtime, so it imports nothing of the package (not even for types)."""
    assert import_graph.find_modules_directly_imported_by("strands_slime.runtime") == set()
