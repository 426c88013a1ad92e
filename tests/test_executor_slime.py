"""The episode executor under slime's own rollout code (commit 624b824): slime's ``Sample``, its
``GenerateState`` abort flag, ``generate_rollout_async``, its abort with partial rollout and its
training-data conversion, with real worker processes (which do not import slime)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import slime_harness
from slime_harness import fresh_slime  # noqa: F401 (autouse: slime fresh around each test)
from test_slime_integration import SCRIPT, WITH_TOOLS, check_sample, data_source, flatten, rollout

from strands_slime.devserver import DevServer
from strands_slime.rollout import executor
from strands_slime.rollout.resume import STATE_KEY

pytestmark = pytest.mark.slow

EXECUTOR = {"strands_slime": {**WITH_TOOLS["strands_slime"], "executor": {"workers": 1}}}


@pytest.fixture
async def engine() -> AsyncIterator[DevServer]:
    async with DevServer("scripted", script=SCRIPT) as dev:
        yield dev
        await executor.shutdown_executors()


@pytest.mark.slow
async def test_over_sampling_abort_and_partial_rollout_through_workers(
    engine: DevServer, tmp_path: Path
) -> None:
    await over_sampling_abort_and_partial_rollout(engine, tmp_path, EXECUTOR)


async def over_sampling_abort_and_partial_rollout(engine: DevServer, tmp_path: Path, custom: dict) -> None:
    """slime's rollout with over-sampling and --partial-rollout through the executor ``custom`` names;
    aborted samples resume in the next rollout (also used by ``tests/test_executor_ray.py``)."""
    from slime.utils.http_utils import init_http_client
    from slime.utils.types import Sample

    rows = [("What is SEVENTEEN times two?", "34"), ("LONGQ one", "1"), ("LONGQ two", "1")]
    async with slime_harness.router_in_front_of(engine) as router:
        args = slime_harness.slime_args(
            router,
            slime_harness.write_prompts(tmp_path / "prompts.jsonl", rows),
            "--rollout-batch-size",
            "1",
            "--over-sampling-batch-size",
            "3",
            "--n-samples-per-prompt",
            "2",
            "--partial-rollout",
            "--rollout-max-response-len",
            "256",  # LONGQ's 600-token reply is cut by the episode budget
            custom=custom,
        )
        init_http_client(args)
        assert engine.scheduler is not None
        engine.scheduler.token_latency = 0.01  # LONGQ runs long enough for slime's abort to land
        source = data_source(args)
        groups, aborted, _ = await rollout(args, source)
        samples = flatten(groups)
        assert [s.label for s in samples] == ["34", "34"]
        for sample in samples:
            assert isinstance(sample, Sample), "results are written onto slime's own samples"
            check_sample(sample)
            assert sample.status is Sample.Status.COMPLETED and sample.reward == 1.0
            assert sample.metadata["tool_calls"] == 1, "the sandbox ran in the worker"
            assert len(sample.weight_versions) == sample.metadata["turns"] == 2
            assert isinstance(sample.prefix_cache_info, Sample.PrefixCacheInfo)
            assert 0 in sample.loss_mask and sample.loss_mask[-1] == 1
        data = slime_harness.train_data(args, samples)
        assert data["response_lengths"] == [len(mask) for mask in data["loss_masks"]]
        assert engine.scheduler.num_running == 0, "slime's abort left nothing running"
        recycled = flatten(aborted)
        assert len(recycled) == 4 and all(s.status is Sample.Status.ABORTED for s in recycled)
        assert all(s.metadata["abort_source"] == "slime" and s.reward is None for s in recycled)
        for sample in recycled:
            check_sample(sample)
        # slime puts them back; the next rollout finishes them in the same workers: a sample whose cut
        # call kept its partial output (the server's abort reply came first) goes on from it in a
        # worker, the others start over
        resumable = {s.index for s in recycled if STATE_KEY in s.metadata}
        assert all(s.response_length > 1 for s in recycled if s.index in resumable)
        source.add_samples(aborted)
        engine.scheduler.token_latency = 0.0
        args.rollout_batch_size = args.over_sampling_batch_size = 2
        groups, _, _ = await rollout(args, source, rollout_id=1)
        again = flatten(groups)
        assert sorted(s.label for s in again) == ["1"] * 4
        for sample in again:
            check_sample(sample)
            key = "resumes" if sample.index in resumable else "restarts"
            assert sample.metadata[key] == 1 and sample.status is Sample.Status.TRUNCATED
            assert "abort_source" not in sample.metadata and STATE_KEY not in sample.metadata
