"""The lane rules of tests/conftest.py, checked on a scratch test tree run by a real pytest."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
INI = """[pytest]
addopts = --strict-markers -p no:cacheprovider
asyncio_default_fixture_loop_scope = function
markers =
    unit: u
    integration: i
    slow: s
"""


def run_pytest(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(TESTS.parent), "PATH": "/usr/bin:/bin", "HOME": str(tree)},
    )


def scratch_tree(tmp_path: Path, modules: dict[str, str]) -> Path:
    """A tests folder with our conftest and ``modules`` (names of real modules, so the maps apply)."""
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text(INI)
    for name, text in modules.items():
        (tmp_path / f"{name}.py").write_text(text)
    return tmp_path


def test_lanes_select_tests_skip_imports_and_refuse_tests_without_a_lane(tmp_path: Path) -> None:
    tree = scratch_tree(
        tmp_path,
        {
            "test_chat": "def test_in_unit():\n    pass\n",  # a unit module
            "test_soak": "raise RuntimeError('imported')\n",  # a slow module: never imported for unit
            "test_sandbox_tool": (  # an integration module with one test moved to slow by TEST_LANES
                "def test_tool_runs_code_and_counts():\n    pass\ndef test_other():\n    pass\n"
            ),
        },
    )
    unit = run_pytest(tree, "--lane", "unit", "-v")
    assert unit.returncode == 0, unit.stdout + unit.stderr
    assert "test_chat.py::test_in_unit PASSED" in unit.stdout
    assert "1 passed" in unit.stdout and "imported" not in unit.stdout  # no other module imported

    (tree / "test_soak.py").unlink()
    marked = run_pytest(tree, "--lane", "integration", "--lane", "slow", "-m", "not slow", "-v")
    assert marked.returncode == 0, marked.stdout + marked.stderr
    assert "test_sandbox_tool.py::test_other PASSED" in marked.stdout
    assert "test_tool_runs_code_and_counts" not in marked.stdout and "1 deselected" in marked.stdout

    (tree / "test_new_feature.py").write_text("def test_forgotten():\n    pass\n")
    missing = run_pytest(tree)
    assert missing.returncode != 0
    assert (
        "1 tests have no lane" in missing.stderr and "test_new_feature.py::test_forgotten" in missing.stderr
    )

    (tree / "test_new_feature.py").write_text(
        "import pytest\n\n@pytest.mark.integration\ndef test_forgotten():\n    pass\n"
    )
    (tree / "test_sandbox_tool.py").write_text("def test_renamed():\n    pass\n")
    stale = run_pytest(tree)
    assert stale.returncode != 0
    assert "TEST_LANES names tests that do not exist" in stale.stderr
