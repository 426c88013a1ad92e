"""The lane rules of tests/conftest.py, checked on a scratch test tree run by a real pytest."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

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
    """A tests folder with our conftest and ``modules``."""
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text(INI)
    for name, text in modules.items():
        (tmp_path / f"{name}.py").write_text(text)
    return tmp_path


UNIT_MODULE = "import pytest\n\npytestmark = pytest.mark.unit\n\ndef test_in_unit():\n    pass\n"
SLOW_MODULE = "import pytest\n\npytestmark = pytest.mark.slow\nraise RuntimeError('imported')\n"
MIXED_MODULE = (  # an integration module with one test moved to the slow lane by its own mark
    "import pytest\n\npytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]\n\n"
    "@pytest.mark.slow\ndef test_long():\n    pass\n\ndef test_other():\n    pass\n\n"
    "@pytest.mark.parametrize('n', [1, pytest.param(2, marks=pytest.mark.slow)])\n"
    "def test_param(n):\n    pass\n"
)


def test_lanes_come_from_marks_skip_imports_and_refuse_tests_without_a_lane(tmp_path: Path) -> None:
    tree = scratch_tree(tmp_path, {"test_a": UNIT_MODULE, "test_b": SLOW_MODULE, "test_c": MIXED_MODULE})
    unit = run_pytest(tree, "--lane", "unit", "-v")
    assert unit.returncode == 0, unit.stdout + unit.stderr
    assert "test_a.py::test_in_unit PASSED" in unit.stdout
    assert "1 passed" in unit.stdout and "imported" not in unit.stdout  # no other module imported

    (tree / "test_b.py").unlink()
    integration = run_pytest(tree, "--lane", "integration", "-v")
    assert integration.returncode == 0, integration.stdout + integration.stderr
    assert (
        "test_c.py::test_other PASSED" in integration.stdout and "test_param[1] PASSED" in integration.stdout
    )
    assert "test_long" not in integration.stdout and "test_param[2]" not in integration.stdout

    slow = run_pytest(tree, "--lane", "slow", "-v")
    assert "test_c.py::test_long PASSED" in slow.stdout and "test_param[2] PASSED" in slow.stdout
    assert "2 passed" in slow.stdout, slow.stdout

    marked = run_pytest(tree, "--lane", "integration", "--lane", "slow", "-m", "not slow", "-v")
    assert marked.returncode == 0, marked.stdout + marked.stderr
    assert "test_c.py::test_other PASSED" in marked.stdout and "test_long" not in marked.stdout

    (tree / "test_new_feature.py").write_text("def test_forgotten():\n    pass\n")
    missing = run_pytest(tree)
    assert missing.returncode != 0
    assert (
        "1 tests have no lane" in missing.stderr and "test_new_feature.py::test_forgotten" in missing.stderr
    )

    (tree / "test_new_feature.py").write_text(
        "import pytest\n\n@pytest.mark.unit\n@pytest.mark.integration\ndef test_twice():\n    pass\n"
    )
    twice = run_pytest(tree)
    assert twice.returncode != 0 and "is marked with several lanes: ['integration', 'unit']" in twice.stderr
