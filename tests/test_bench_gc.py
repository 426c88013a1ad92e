"""The garbage-collector benchmark's parts: the episode shapes, the list baseline, one measurement."""

from __future__ import annotations

import math

import numpy
import pytest

from benchmarks import bench_gc, run_all
from strands_slime.provider.trajectory import TokenTrajectory

pytestmark = pytest.mark.unit


def test_episodes_are_a_prompt_then_outputs_and_tool_results_in_turn() -> None:
    rng = numpy.random.default_rng(5)
    for _ in range(500):
        total = int(rng.integers(bench_gc.MIN_TOKENS, bench_gc.MAX_TOKENS + 1))
        segments = bench_gc._segments(rng, total)
        assert sum(length for _, length in segments) == total
        assert all(length > 0 for _, length in segments)
        assert [is_output for is_output, _ in segments] == [i % 2 == 1 for i in range(len(segments))]
        assert segments[-1][0], "an episode ends on the model's output"


def test_the_list_baseline_holds_what_the_trajectory_holds() -> None:
    lists, tokens = bench_gc.build_episodes("lists", 3, seed=7)
    arrays, same_tokens = bench_gc.build_episodes("arrays", 3, seed=7)
    assert tokens == same_tokens >= 3 * bench_gc.MIN_TOKENS
    for old, new in zip(lists, arrays, strict=True):
        assert isinstance(new, TokenTrajectory)
        new.check()
        assert old.token_ids == new.token_ids.tolist()
        assert old.loss_mask == new.loss_mask.tolist()
        assert old.logprobs == new.logprobs.tolist()
    baseline = bench_gc.ListTrajectory()
    baseline.add_output([1, 2, 3], [None, float("nan"), -0.5])
    assert baseline.logprobs == [-math.inf, -math.inf, -0.5] and baseline.missing_logprobs == 2


@pytest.mark.slow
def test_one_measurement_per_layout_in_fresh_processes() -> None:
    lists = bench_gc._run_child("lists", 4, 2, 16)
    arrays = bench_gc._run_child("arrays", 4, 2, 16)
    assert lists["tokens"] == arrays["tokens"] > 0
    # three lists: an edge per element each; arrays: a few per segment, none per token
    lists_edges = lists["collector_edges"] - lists["before_build"]["collector_edges"]
    arrays_edges = arrays["collector_edges"] - arrays["before_build"]["collector_edges"]
    assert lists_edges >= 3 * lists["tokens"]
    assert arrays_edges < lists["tokens"] / 10
    assert 13 <= arrays["held_bytes_per_token"] < 16 < 40 < lists["held_bytes_per_token"]
    for cell in (lists, arrays):
        assert cell["full_collect_ms"]["median"] > 0 and cell["add_output_ns_per_token"] > 0
    results = {
        "date": "2026-01-01T00:00:00+00:00",
        "quick": True,
        "machine": {"cpu": "test", "cpus": 2, "implementation": "CPython", "python": "3.11"},
        "plan": {"tokens_per_episode": [2000, 32000], "held_bytes_episodes": 32},
        "cells": {"4": {"lists": lists, "arrays": arrays}},
    }
    text = bench_gc.render_markdown(results)
    assert "three lists (before)" in text and "`TokenTrajectory` arrays" in text
    assert "**4 live episodes:**" in text
    assert run_all.BENCHMARKS["gc"][0] == "bench_gc"
