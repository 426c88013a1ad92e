"""The sandbox package's module seams: no import cycles, and a zygote that runs standalone."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import strands_slime.sandbox

PACKAGE_DIR = Path(strands_slime.sandbox.__file__).parent
PACKAGE = "strands_slime.sandbox"


def imported_siblings(path: Path) -> set[str]:
    """Modules of this package that ``path`` imports anywhere (function-level imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1:  # from .x import y / from . import x
                names = [module] if module else [alias.name for alias in node.names]
                found.update(name.split(".")[0] for name in names)
            elif module.startswith(PACKAGE + "."):
                found.add(module.removeprefix(PACKAGE + ".").split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE + "."):
                    found.add(alias.name.removeprefix(PACKAGE + ".").split(".")[0])
    return found - {path.stem}


def test_sandbox_modules_import_each_other_without_cycles() -> None:
    graph = {
        path.stem: imported_siblings(path)
        for path in PACKAGE_DIR.glob("*.py")
        if path.stem != "__init__"  # its lazy table names modules as strings, importing none up front
    }
    assert graph["camel_backend"] <= {"base", "config", "result"}, graph["camel_backend"]
    order = list(graphlib.TopologicalSorter(graph).static_order())  # raises CycleError on a cycle
    assert order.index("base") < order.index("zygote_backend") < order.index("core")


def test_the_zygote_script_uses_only_the_standard_library() -> None:
    tree = ast.parse((PACKAGE_DIR / "_zygote.py").read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert "strands_slime" not in imported
    assert not any(isinstance(node, ast.ImportFrom) and node.level for node in ast.walk(tree))
