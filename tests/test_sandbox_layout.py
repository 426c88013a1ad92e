"""The sandbox package's seams: the zygote script runs standalone (import cycles: test_import_cycles.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import strands_slime.sandbox

pytestmark = pytest.mark.unit

PACKAGE_DIR = Path(strands_slime.sandbox.__file__).parent


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
