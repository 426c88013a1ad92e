"""strands_slime.generate driven by slime's real rollout code (commit 624b824) against real SGLang.

slime's parser, data source, ``generate_rollout_async``, eval, abort (``/abort_request`` then
``/v1/loads`` until idle), partial rollout and fully-async loop run for real (``tests/slime_harness.py``
stubs only ray and sglang's argument builders in this process); the engine is SGLang 0.5.23 behind
slime's router stub and a recording :class:`FaultProxy`. A random model never answers right, so rewards
are the wrong-answer reward; what is checked is slime's invariants on every sample and what SGLang did.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import slime_harness
from sglang_server import SGLangServer
from test_errors import running_and_waiting
from test_slime_integration import check_sample, data_source, flatten, rollout
from test_slime_integration import slime as slime  # autouse: slime's real code, fresh state per test
from waiting import wait_until

from benchmarks.devserver_reference import full_forward_logprobs
from benchmarks.fault_injection import FaultProxy
from strands_slime.rollout.resume import STATE_KEY

pytestmark = pytest.mark.sglang

NO_TOOLS = {"strands_slime": {"tools": [], "client": {"max_retries": 0}}}
TOLERANCE = 1e-5


@pytest.fixture
async def recorder(sglang: SGLangServer) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(sglang.url, record_replies=True) as proxy:
        yield proxy


Args = Callable[..., Any]


def args_builder(router: str, tmp_path: Path) -> Args:
    def build(rows: list[tuple[str, str]], *flags: str) -> Any:
        data = slime_harness.write_prompts(tmp_path / f"prompts_{time.monotonic_ns()}.jsonl", rows)
        args = slime_harness.slime_args(router, data, *flags, custom=NO_TOOLS)
        from slime.utils.http_utils import init_http_client

        init_http_client(args)
        return args

    return build


@pytest.fixture
async def make_args(recorder: FaultProxy, tmp_path: Path) -> AsyncIterator[Args]:
    async with slime_harness.router_in_front_of(recorder) as router:  # type: ignore[arg-type]
        yield args_builder(router, tmp_path)


def replies(proxy: FaultProxy) -> list[dict[str, Any]]:
    return [entry["reply"] for entry in proxy.request_log if isinstance(entry.get("reply"), dict)]


def check_logprobs(sample: Any, reference: Any) -> None:
    """The sample's trained-on logprobs equal an fp32 forward pass of ``reference`` over its tokens."""
    tokens = [int(t) for t in sample.tokens]
    expected = full_forward_logprobs(reference, tokens)
    prompt = len(tokens) - sample.response_length
    for offset, (mask, logprob) in enumerate(zip(sample.loss_mask, sample.rollout_log_probs, strict=True)):
        if mask:
            assert abs(logprob - expected[prompt + offset - 1]) <= TOLERANCE, offset


async def idle(url: str, since: float) -> bool:
    return await running_and_waiting(url, since) == (0, 0)


async def running(url: str, count: int, since: float) -> bool:
    counts = await running_and_waiting(url, since)
    return counts is not None and counts[0] >= count


async def test_training_rollout_and_the_radix_cache_across_a_group(
    make_args: Args, recorder: FaultProxy, reference_models: dict[int, Any]
) -> None:
    args = make_args(
        [("What is 17 times two?", "34"), ("Two plus three?", "5")],
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--rollout-max-response-len",
        "16",
        "--sglang-server-concurrency",
        "1",  # one request at a time: each group member finds the one before it in the radix cache
    )
    groups, aborted, _ = await rollout(args, data_source(args))
    assert aborted == [] and len(groups) == 2 and all(len(group) == 2 for group in groups)
    samples = flatten(groups)
    for sample in samples:
        check_sample(sample)
        assert sample.status.name == "TRUNCATED" and sample.response_length == 16
        assert sample.weight_versions == ["default"]
        check_logprobs(sample, reference_models[0])
    # GRPO group: the second member's prompt is all in the cache but the last token
    for _, second in groups:
        assert second.prefix_cache_info.cached_tokens >= second.prefix_cache_info.total_prompt_tokens - 1
    data = slime_harness.train_data(args, samples)
    assert data["response_lengths"] == [16] * 4 and data["rollout_log_probs"]
    assert all(reply["meta_info"]["finish_reason"]["type"] == "length" for reply in replies(recorder))


async def test_eval_rollout_uses_each_datasets_max_response_len(make_args: Args, tmp_path: Path) -> None:
    from slime.rollout.sglang_rollout import eval_rollout

    short = slime_harness.write_prompts(tmp_path / "short.jsonl", [("Count to ten.", "1")])
    longer = slime_harness.write_prompts(tmp_path / "longer.jsonl", [("Two plus three?", "5")])
    config = tmp_path / "eval.yaml"
    config.write_text(
        '{"eval": {"defaults": {"n_samples_per_eval_prompt": 2, "input_key": "prompt", "label_key": "label"},'
        f' "datasets": [{{"name": "short", "path": "{short}", "max_response_len": 6}},'
        f' {{"name": "longer", "path": "{longer}", "max_response_len": 12}}]}}}}'
    )
    args = make_args(
        [("Two plus three?", "5")], "--eval-config", str(config), "--eval-max-response-len", "64"
    )
    output, _ = await eval_rollout(args, 0)
    assert [s.response_length for s in output.data["short"]["samples"]] == [6, 6]
    assert [s.response_length for s in output.data["longer"]["samples"]] == [12, 12]
    for sample in output.data["short"]["samples"] + output.data["longer"]["samples"]:
        check_sample(sample, grouped=False)
        assert sample.metadata["evaluation"] is True


async def test_over_sampling_abort_with_partial_rollout(
    make_args: Args, sglang: SGLangServer, reference_models: dict[int, Any]
) -> None:
    args = make_args(
        [("Short one.", "1"), ("Long one.", "1"), ("Long two.", "1")],
        "--rollout-batch-size",
        "1",
        "--over-sampling-batch-size",
        "3",
        "--n-samples-per-prompt",
        "2",
        "--partial-rollout",
        "--rollout-max-response-len",
        "24",
        "--sglang-server-concurrency",
        "2",  # the first group runs alone; slime aborts the next one in flight and the last unsent
    )
    source = data_source(args)
    groups, aborted, _ = await rollout(args, source)
    returned = time.time()
    assert len(groups) == 1 and all(s.status.name == "TRUNCATED" for s in groups[0])
    # slime returned once /v1/loads said idle after its /abort_request; a later snapshot agrees
    await wait_until(lambda: idle(sglang.url, returned), what="SGLang idle after slime's abort", timeout=60)
    recycled = flatten(aborted)
    assert len(recycled) == 4 and all(s.status.name == "ABORTED" for s in recycled)
    for sample in recycled:  # a sample slime never started has nothing of ours in its metadata
        assert sample.reward is None and sample.metadata.get("abort_source", "slime") == "slime"
    resumable = {s.index for s in recycled if STATE_KEY in s.metadata}
    source.add_samples(aborted)
    args.rollout_batch_size = args.over_sampling_batch_size = 2
    groups, _, _ = await rollout(args, source, rollout_id=1)
    again = flatten(groups)
    assert len(again) == 4
    for sample in again:
        check_sample(sample)
        key = "resumes" if sample.index in resumable else "restarts"
        assert sample.metadata[key] == 1 and sample.status.name == "TRUNCATED"
        assert sample.response_length == 24
        check_logprobs(sample, reference_models[0])


async def test_resume_mid_generation_after_sglangs_abort_request(
    make_args: Args, sglang: SGLangServer, recorder: FaultProxy, reference_models: dict[int, Any]
) -> None:
    """A real ``/abort_request`` cuts a generation; SGLang's partial output stays in the sample, and
    slime's recycled sample goes on from it: the next request is the prompt plus that output."""
    from slime.rollout.sglang_rollout import GenerateState, generate_and_rm

    args = make_args([("Tell a long story.", "1")], "--partial-rollout", "--rollout-max-response-len", "400")
    sample = data_source(args).get_samples(1)[0][0]
    params = dict(GenerateState(args).sampling_params)
    sent = time.time()
    task = asyncio.create_task(generate_and_rm(args, sample, dict(params)))
    await wait_until(lambda: running(sglang.url, 1, sent), what="the generation running", timeout=120)
    async with aiohttp.ClientSession() as session:
        await session.post(sglang.url + "/abort_request", json={"abort_all": True})
    sample = await task
    (cut,) = replies(recorder)
    assert cut["meta_info"]["finish_reason"]["type"] == "abort"
    partial = cut["output_ids"]
    assert 1 <= len(partial) < 400
    why = {k: v for k, v in sample.metadata.items() if k not in ("final_text", STATE_KEY)}
    assert sample.status.name == "ABORTED" and why.get("abort_source") == "server", (sample.status, why)
    assert STATE_KEY in sample.metadata
    sample = await generate_and_rm(args, sample, dict(params))
    check_sample(sample, grouped=False)
    assert sample.status.name == "TRUNCATED" and sample.metadata["resumes"] == 1
    assert sample.response_length == 400
    first, second = (entry["json"]["input_ids"] for entry in recorder.request_log)
    assert second == first + partial, "the resumed call continues SGLang's partial output"
    assert replies(recorder)[1]["meta_info"]["cached_tokens"] >= len(first) - 1
    check_logprobs(sample, reference_models[0])


# ----------------------------------------------------------------------------- weight update


@pytest.fixture(scope="module")
def updatable(checkpoints: dict[int, Path], lane_dir: Path) -> Iterator[SGLangServer]:
    """A server of its own: its weights change."""
    with SGLangServer(checkpoints[0], lane_dir, name="weights") as server:
        yield server


async def test_fully_async_pause_update_weights_from_disk_and_continue(
    updatable: SGLangServer, checkpoints: dict[int, Path], reference_models: dict[int, Any], tmp_path: Path
) -> None:
    from slime.rollout import fully_async_rollout

    async with (
        FaultProxy(updatable.url, record_replies=True) as proxy,
        slime_harness.router_in_front_of(proxy) as router,  # type: ignore[arg-type]
    ):
        args = args_builder(router, tmp_path)(
            [("Long one.", "1"), ("Long two.", "1")],
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--rollout-max-response-len",
            "200",
            "--rollout-function-path",
            "slime.rollout.fully_async_rollout.generate_rollout_fully_async",
            "--sglang-server-concurrency",
            "4",
        )
        source = data_source(args)
        sent = time.time()
        collecting = asyncio.create_task(fully_async_rollout._generate_rollout_async(args, 0, source))
        try:
            await wait_until(
                lambda: running(updatable.url, 4, sent), what="4 generations running", timeout=120
            )
            async with aiohttp.ClientSession() as session:  # what slime's weight sync does
                async with session.post(updatable.url + "/pause_generation", json={}) as reply:
                    assert reply.status == 200, await reply.text()
                update = {"model_path": str(checkpoints[1]), "weight_version": "v2"}
                async with session.post(updatable.url + "/update_weights_from_disk", json=update) as reply:
                    body = await reply.json()
                    assert reply.status == 200 and body["success"], body
                async with session.post(updatable.url + "/continue_generation", json={}) as reply:
                    assert reply.status == 200, await reply.text()
                async with session.get(updatable.url + "/model_info") as reply:
                    assert (await reply.json())["weight_version"] == "v2"
            groups = await asyncio.wait_for(collecting, 600)
        finally:
            fully_async_rollout._stop_global_worker()
    cut = [r for r in replies(proxy) if r["meta_info"]["finish_reason"]["type"] == "abort"]
    assert cut and all(r["meta_info"]["weight_version"] == "default" for r in cut), "paused in abort mode"
    samples = flatten(groups)
    assert len(samples) == 4
    for sample in samples:
        check_sample(sample)
        assert sample.status.name == "TRUNCATED" and not sample.remove_sample
        assert sample.weight_versions == ["v2"], "the groups paused mid-generation were generated again"
        check_logprobs(sample, reference_models[1])  # the new weights generated them
    with pytest.raises(AssertionError):
        check_logprobs(samples[0], reference_models[0])
