"""strands_slime.generate and reward_func driven by slime's own rollout code (commit 624b824).

slime's argument parser, data source, ``generate_rollout_async``/``generate_and_rm_group``, abort,
eval, fully-async worker, dynamic filter, sample hooks, tracing, metrics and
``_convert_samples_to_train_data`` run for real; the engine is the dev server behind a thin router
stub (see ``slime_harness``). Each test checks slime's invariants on what comes out.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import slime_harness
from helpers import tool_call
from slime_harness import fresh_slime  # noqa: F401 (autouse: slime fresh around each test)
from test_slime_contract import FIELDS as CONTRACT_FIELDS
from test_slime_contract import as_plain, b64
from test_slime_contract import episode as contract_episode
from waiting import wait_until

from benchmarks.fault_injection import inject_fault
from strands_slime.devserver import DevServer
from strands_slime.devserver.engine import MoEShape, routed_expert_ids
from strands_slime.rollout.slime_compat import Sample as StandIn
from strands_slime.rollout.slime_compat import decode_int32_meta_array

pytestmark = pytest.mark.slow

SCRIPT = [
    {
        "match": "SEVENTEEN",
        "replies": [f"Let me compute.\n{tool_call('print(17 * 2)')}", "Answer: \\boxed{34}"],
    },
    {"match": "PLAINQ", "replies": ["Simple.\n\nAnswer: \\boxed{5}"]},
    {"match": "MEDIUMQ", "replies": ["Counting. " + "one more step, " * 60 + "\n\nAnswer: \\boxed{5}"]},
    {"match": "WRONGQ", "replies": ["Hmm.\n\nAnswer: \\boxed{7}"]},
    {"match": "LONGQ", "replies": ["word " * 600]},
    {
        "match": "SLOWTOOL",
        "replies": [
            f"Let me compute.\n{tool_call('import time; time.sleep(3); print(17 * 2)')}",
            "Answer: \\boxed{34}",
        ],
    },
    {
        "match": "BADCALL",
        "replies": [  # a tool call cut before its closing brace: the plugin answers it with the parser's error
            'Let me compute.\n<tool_call>\n{"name": "execute_python_code", "arguments": {"code": "print(34)"\n</tool_call>',
            "The call failed, so by hand: " + "one more step, " * 150 + "\n\nAnswer: \\boxed{34}",
        ],
    },
]
NO_TOOLS = {"strands_slime": {"tools": [], "client": {"max_retries": 0}}}
WITH_TOOLS = {"strands_slime": {"sandbox": {"timeout_s": 5.0}, "client": {"max_retries": 0}}}


@pytest.fixture
async def engine() -> AsyncIterator[DevServer]:
    async with DevServer(
        "scripted",
        script=SCRIPT,
        routed_experts=(2, 2, 8),
        speculative_algorithm="EAGLE",
        speculative_num_draft_tokens=4,
    ) as dev:
        yield dev


@pytest.fixture
async def router(engine: DevServer) -> AsyncIterator[str]:
    async with slime_harness.router_in_front_of(engine) as url:
        yield url


Args = Callable[..., Any]


@pytest.fixture
def make_args(router: str, tmp_path: Path) -> Args:
    def build(rows: list[tuple[str, str]], *flags: str, custom: dict[str, Any] | None = None) -> Any:
        data = slime_harness.write_prompts(tmp_path / f"prompts_{time.monotonic_ns()}.jsonl", rows)
        args = slime_harness.slime_args(
            router, data, *flags, custom=custom if custom is not None else NO_TOOLS
        )
        from slime.utils.http_utils import init_http_client

        init_http_client(args)
        return args

    return build


def data_source(args: Any) -> Any:
    from slime.rollout.data_source import RolloutDataSourceWithBuffer

    return RolloutDataSourceWithBuffer(args)


def flatten(groups: list[list[Any]]) -> list[Any]:
    return [sample for group in groups for sample in group]


def check_sample(
    sample: Any, *, grouped: bool = True, fanned_out: bool = False, offpolicy_prefix: int = 0
) -> None:
    """slime's per-sample invariants (what training and logging assume). The first
    ``offpolicy_prefix`` response tokens were masked by ``--mask-offpolicy-in-partial-rollout``, which
    keeps their logprobs."""
    assert sample.response_length >= 1 and len(sample.tokens) > sample.response_length
    assert len(sample.loss_mask) == len(sample.rollout_log_probs) == sample.response_length
    for i, (mask, logprob) in enumerate(zip(sample.loss_mask, sample.rollout_log_probs, strict=True)):
        masked_rollout = mask == 0 and i >= offpolicy_prefix
        assert mask in (0, 1) and (logprob == 0.0 if masked_rollout else logprob <= 0.0)
    if not fanned_out:
        assert sample.rollout_id is None, "one Sample per episode: slime numbers rollouts itself"
    if grouped:
        assert sample.session_id, "generate_and_rm_group gave the sample a session id"


async def rollout(
    args: Any, source: Any, rollout_id: int = 0
) -> tuple[list[list[Any]], list[list[Any]], Any]:
    from slime.rollout.sglang_rollout import generate_rollout_async

    output, aborted = await generate_rollout_async(args, rollout_id, source.get_samples)
    return output.samples, aborted, output.metrics


def running_requests(engine: DevServer) -> int:
    assert engine.scheduler is not None
    return engine.scheduler.num_running


# --------------------------------------------------------------------------- GRPO rollout


async def test_grpo_rollout_through_slime_to_train_data(
    make_args: Args, engine: DevServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = make_args(
        [("What is SEVENTEEN times two?", "34"), ("PLAINQ: two plus three?", "5")],
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--reward-key",
        "score",
        custom=WITH_TOOLS,
    )
    groups, aborted, _ = await rollout(args, data_source(args))
    assert aborted == [] and len(groups) == 2 and all(len(group) == 2 for group in groups)
    samples = flatten(groups)
    for sample in samples:
        check_sample(sample)
        why = {
            k: sample.metadata.get(k) for k in ("finish_reason", "truncation", "infra_error", "tool_errors")
        }
        assert sample.status.name == "COMPLETED" and sample.reward["score"] == 1.0, why
        assert len(sample.weight_versions) == sample.metadata["turns"], "one weight version per model call"
        assert sample.prefix_cache_info.total_prompt_tokens == sample.metadata["prompt_tokens"] > 0
        assert sample.metadata["abort_detection"] == "slime", "the episode watches GenerateState.aborted"
    tool = next(s for s in samples if s.metadata["tool_calls"])
    assert 0 in tool.loss_mask and tool.loss_mask[0] == 1 and tool.loss_mask[-1] == 1, (
        "tool tokens are masked"
    )
    data = slime_harness.train_data(args, samples)
    assert data["response_lengths"] == [len(mask) for mask in data["loss_masks"]]
    assert data["rollout_log_probs"] and data["raw_reward"] == [1.0] * 4
    assert data["rewards"] == pytest.approx([0.0] * 4), "GRPO normalizes per group of n_samples_per_prompt"
    metrics = slime_harness.rollout_metrics(args, samples)
    assert any(key.startswith("request/e2e_latency") for key in metrics), "slime's trace spans are recorded"
    # our metrics reach W&B through slime's own logging path (logging_utils.log)
    from slime.observability import logging_utils

    from strands_slime.rollout.metrics import log_rollout

    logged: list[dict[str, Any]] = []
    monkeypatch.setattr(logging_utils.wandb, "log", logged.append)
    monkeypatch.setattr(args, "use_wandb", True)
    assert log_rollout(0, args, samples) is False
    assert logged and logged[0]["rollout/step"] == 0
    assert logged[0]["rollout/strands/abort_detection/slime"] == 1.0
    assert logged[0]["rollout/strands/masked_null_logprobs/total"] == 0.0


async def test_stand_in_and_slime_sample_fill_identically(make_args: Args, engine: DevServer) -> None:
    """The same episode through slime's Sample and through our stand-in gives the same fields."""
    from slime.utils.types import Sample as SlimeSample

    from strands_slime import generate
    from strands_slime.rollout.slime_compat import Sample as StandIn

    args = make_args(
        [("x", "34")],
        "--rollout-top-p",
        "0.95",
        "--use-rollout-routing-replay",
        "--num-layers",
        "2",
        "--moe-router-topk",
        "2",
        "--sglang-speculative-algorithm",
        "EAGLE",
        custom=WITH_TOOLS,
    )
    from slime.rollout.sglang_rollout import GenerateState

    params = dict(GenerateState(args).sampling_params)
    prompt = [{"role": "user", "content": "What is SEVENTEEN times two?"}]
    results = []
    for cls in (SlimeSample, StandIn):
        sample = cls(prompt=prompt, label="34", index=0, group_index=0)
        results.append(await generate(args, sample, dict(params)))
    real, ours = results

    def as_list(value: Any) -> Any:
        return value.tolist() if hasattr(value, "tolist") else value

    for name in (
        "tokens",
        "response",
        "response_length",
        "loss_mask",
        "rollout_log_probs",
        "rollout_top_p_token_ids",
        "rollout_top_p_token_offsets",
        "rollout_routed_experts",
        "weight_versions",
    ):
        assert as_list(getattr(real, name)) == as_list(getattr(ours, name)), name
    assert real.spec_info.to_dict() == ours.spec_info.to_dict() and real.spec_info.spec_verify_ct > 0
    assert real.prefix_cache_info.total_prompt_tokens == ours.prefix_cache_info.total_prompt_tokens
    assert real.status.value == ours.status.value == "completed"
    assert len(as_list(real.rollout_routed_experts)) == len(real.tokens) - 1


def test_stand_in_append_rules_match_slimes_sample() -> None:
    from slime.utils.misc import decode_int32_meta_array as slime_decode
    from slime.utils.types import Sample as SlimeSample

    real, ours = contract_episode(SlimeSample()), contract_episode(StandIn())
    for name in CONTRACT_FIELDS:
        real_value, our_value = as_plain(getattr(real, name)), as_plain(getattr(ours, name))
        if name == "status":
            real_value, our_value = real_value.value, our_value.value
        assert real_value == our_value, name
    assert real.spec_info.to_dict() == ours.spec_info.to_dict()
    assert real.prefix_cache_info.to_dict() == ours.prefix_cache_info.to_dict()
    assert set(SlimeSample.__dataclass_fields__) == set(StandIn.__dataclass_fields__), "same fields"
    meta = {"top_p_token_ids": b64([3, -1, 7]), "other": [[1, 2], [3, 4]]}
    assert slime_decode(meta, "top_p_token_ids").tolist() == decode_int32_meta_array(meta, "top_p_token_ids")
    assert slime_decode(meta, "other").tolist() == decode_int32_meta_array(meta, "other") == [1, 2, 3, 4]


# --------------------------------------------------------------------------- flags


async def test_top_p_replay_arrays_satisfy_training_conversion(make_args: Args, engine: DevServer) -> None:
    args = make_args(
        [("What is SEVENTEEN times two?", "34")],
        "--rollout-batch-size",
        "1",
        "--n-samples-per-prompt",
        "2",
        "--rollout-top-p",
        "0.95",
        custom=WITH_TOOLS,
    )
    inject_fault(engine, status=500, count=1)  # one sample is lost: it must still convert
    groups, _, _ = await rollout(args, data_source(args))
    samples = flatten(groups)
    assert sorted(s.status.name for s in samples) == ["COMPLETED", "FAILED"]
    data = slime_harness.train_data(args, samples)  # asserts offsets == response_length + 1 and ids
    assert len(data["rollout_top_p_token_offsets"]) == 2
    good = next(s for s in samples if s.status.name == "COMPLETED")
    offsets = [int(v) for v in good.rollout_top_p_token_offsets]
    spans = [offsets[i + 1] - offsets[i] for i in range(good.response_length)]
    assert all((span > 0) == bool(mask) for span, mask in zip(spans, good.loss_mask, strict=True)), (
        "model tokens carry their nucleus; tool and template tokens an empty span"
    )
    requests = [entry["json"] for entry in engine.request_log if entry.get("json")]
    assert all(r["sampling_params"]["custom_params"] == {"return_top_p_token_ids": True} for r in requests)


async def test_routed_experts_replay_across_turns(make_args: Args, engine: DevServer) -> None:
    args = make_args(
        [("What is SEVENTEEN times two?", "34")],
        "--rollout-batch-size",
        "1",
        "--n-samples-per-prompt",
        "3",
        "--use-rollout-routing-replay",
        "--num-layers",
        "2",
        "--moe-router-topk",
        "2",
        "--sglang-server-concurrency",
        "1",
        custom=WITH_TOOLS,
    )
    inject_fault(engine, status=500, count=1)  # a lost episode still carries well-formed routing rows
    groups, _, _ = await rollout(args, data_source(args))
    samples = flatten(groups)
    assert sorted(s.status.name for s in samples) == ["COMPLETED", "COMPLETED", "FAILED"]
    data = slime_harness.train_data(args, samples)  # validates [rows, layers, topk] for R3
    assert [tuple(t.shape) for t in data["rollout_routed_experts"]] == [
        (len(s.tokens) - 1, 2, 2) for s in samples
    ]
    later_turns = [e["json"] for e in engine.request_log if e.get("json", {}).get("routed_experts_start_len")]
    assert len(later_turns) == 2, "later turns only ask for the rows not known yet"
    for sample in samples:
        if sample.status.name == "COMPLETED":
            full = routed_expert_ids(sample.tokens, 0, MoEShape(2, 2, 8))
            assert sample.rollout_routed_experts.flatten().tolist() == full, "rows stitched across turns"


async def test_speculative_counters_and_sampling_seed(make_args: Args, engine: DevServer) -> None:
    args = make_args(
        [("PLAINQ", "5")],
        "--rollout-batch-size",
        "1",
        "--n-samples-per-prompt",
        "2",
        "--sglang-speculative-algorithm",
        "EAGLE",
        "--sglang-enable-deterministic-inference",
        "--rollout-seed",
        "7",
    )
    groups, _, _ = await rollout(args, data_source(args))
    for sample in flatten(groups):
        assert sample.spec_info.spec_verify_ct > 0 and sample.spec_info.spec_accept_rate > 0
    seeds = sorted(e["json"]["sampling_params"]["sampling_seed"] for e in engine.request_log if e.get("json"))
    assert seeds == [7, 8], "slime's per-sample sampling_seed reaches every request"


async def test_log_reward_category_and_preset_rewards(make_args: Args, engine: DevServer) -> None:
    args = make_args(
        [("PLAINQ", "5"), ("WRONGQ", "5")],
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--reward-key",
        "score",
        "--log-reward-category",
        "reason",
        "--sglang-server-concurrency",
        "1",
    )
    inject_fault(engine, status=500, count=1)
    groups, _, _ = await rollout(args, data_source(args))
    samples = flatten(groups)
    failed = [s for s in samples if s.status.name == "FAILED"]
    assert len(failed) == 1 and failed[0].remove_sample
    scored = next(s for s in samples if s.status.name == "COMPLETED")
    assert set(failed[0].reward) == set(scored.reward), "a preset reward has the real reward's keys"
    metrics = slime_harness.rollout_metrics(args, samples)
    assert metrics["error_cat/infra_failure"] == pytest.approx(0.25)
    data = slime_harness.train_data(args, samples)
    removed = samples.index(failed[0])
    assert sum(data["loss_masks"][removed]) == 0


async def test_group_rm_gives_removed_samples_their_preset(make_args: Args, engine: DevServer) -> None:
    from slime.rollout.sglang_rollout import GenerateState, generate_and_rm_group

    args = make_args(
        [("PLAINQ", "5")], "--n-samples-per-prompt", "3", "--group-rm", "--sglang-server-concurrency", "1"
    )
    source = data_source(args)
    inject_fault(engine, status=500, count=1)
    group = await generate_and_rm_group(
        args, source.get_samples(1)[0], dict(GenerateState(args).sampling_params)
    )
    rewards = sorted(s.reward for s in group)
    assert rewards == [0.0, 1.0, 1.0], "slime's group RM scored the group; the removed one keeps its preset"
    removed = next(s for s in group if s.remove_sample)
    assert removed.metadata["infra_error"] and removed.metadata["raw_reward"] == 0.0
    data = slime_harness.train_data(args, group)
    assert sum(data["loss_masks"][group.index(removed)]) == 0


async def test_sample_hooks_see_our_samples(make_args: Args, engine: DevServer) -> None:
    args = make_args(
        [("PLAINQ", "5")],
        "--rollout-batch-size",
        "1",
        "--n-samples-per-prompt",
        "2",
        "--rollout-sample-hook-path",
        "test_slime_integration.tag_sample",
    )
    groups, _, _ = await rollout(args, data_source(args))
    assert [s.metadata["hooked"] for s in flatten(groups)] == ["completed", "completed"]


def tag_sample(args: Any, sample: Any, evaluation: bool = False) -> Any:
    """A rollout sample hook (``--rollout-sample-hook-path``) that reads what generate filled."""
    sample.metadata["hooked"] = sample.status.value
    return sample


# --------------------------------------------------------------------------- aborts and retries


def _step_counts(rollout_id: int, args: Any, groups: list[list[Any]], metrics: Any) -> dict[str, float]:
    """What our rollout log function records for the step (every episode the sample hook counted)."""
    import json
    import logging

    from strands_slime.rollout.metrics import STEP_RECORD_PREFIX, log_rollout

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("strands_slime.rollout.metrics")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        assert log_rollout(rollout_id, args, groups, metrics, 1.0) is False
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    (line,) = [r for r in records if r.startswith(f"{STEP_RECORD_PREFIX} {rollout_id}: ")]
    record = json.loads(line.split(": ", 1)[1])
    return {k.removeprefix("rollout/strands/step/"): v for k, v in record.items() if "/step/" in k}


@pytest.mark.slow
async def test_over_sampling_abort_and_partial_rollout(make_args: Args, engine: DevServer) -> None:
    from slime.rollout.sample_hooks import set_current_rollout_id

    from strands_slime.rollout.resume import STATE_KEY

    args = make_args(
        [("PLAINQ", "5"), ("LONGQ one", "1"), ("LONGQ two", "1")],
        "--rollout-batch-size",
        "1",
        "--over-sampling-batch-size",
        "3",
        "--n-samples-per-prompt",
        "2",
        "--partial-rollout",
        "--rollout-max-response-len",
        "256",  # LONGQ's 600-token reply is cut by the episode budget (SGLang has no limit without one)
        # every episode of a step is counted, also those slime's abort cuts off (the launch's setting)
        "--rollout-sample-hook-path",
        "strands_slime.rollout.metrics.count_episode",
    )
    assert engine.scheduler is not None
    engine.scheduler.token_latency = 0.01
    source = data_source(args)
    set_current_rollout_id(0)  # as slime's rollout manager does before each step
    groups, aborted, metrics = await rollout(args, source)
    counts = _step_counts(0, args, groups, metrics)
    # the kept PLAINQ group finished; both LONGQ groups were cut off by the abort and recycled
    assert (counts["completed"], counts["aborted"], counts["episodes"]) == (2.0, 4.0, 6.0)
    assert counts["aborted_ratio"] == pytest.approx(4 / 6) and counts["groups_kept"] == 1.0
    assert [s.label for s in flatten(groups)] == ["5", "5"]
    assert running_requests(engine) == 0, "slime's abort left nothing running"
    recycled = flatten(aborted)
    assert len(recycled) == 4 and all(s.status.name == "ABORTED" for s in recycled)
    assert all(s.metadata["abort_source"] == "slime" and s.reward is None for s in recycled)
    assert all(s.metadata["start_rollout_id"] == 0 for s in recycled if s.response)
    # slime puts them back in the buffer; the next rollout finishes them: a sample whose cut call kept
    # its partial output (the server's abort reply came before the client stopped waiting on slime's
    # flag) goes on from it, the others start over
    resumable = {s.index for s in recycled if STATE_KEY in s.metadata}
    assert all(s.response_length > 1 for s in recycled if s.index in resumable)
    source.add_samples(aborted)
    engine.scheduler.token_latency = 0.0
    args.rollout_batch_size = args.over_sampling_batch_size = 2
    set_current_rollout_id(1)
    groups, _, metrics = await rollout(args, source, rollout_id=1)
    counts = _step_counts(1, args, groups, metrics)
    # the recycled episodes finished this step, cut by the episode budget; those that kept their
    # partial output count as resumed
    assert (counts["truncated"], counts["length_truncated"], counts["aborted"]) == (4.0, 4.0, 0.0)
    assert counts["resumed"] == float(len(resumable))
    again = flatten(groups)
    assert sorted(s.label for s in again) == ["1"] * 4
    for sample in again:
        check_sample(sample)
        key = "resumes" if sample.index in resumable else "restarts"
        assert sample.metadata[key] == 1 and sample.status.name == "TRUNCATED"
        assert "abort_source" not in sample.metadata and STATE_KEY not in sample.metadata


@pytest.mark.slow
@pytest.mark.parametrize("replay", [False, True], ids=["plain", "r3-and-top-p"])
async def test_partial_rollout_resumes_an_aborted_agent_group(
    make_args: Args, engine: DevServer, replay: bool
) -> None:
    """slime's over-sampling abort lands while the SLOWTOOL episodes run their tool; their recycled
    group resumes after the first turn instead of starting over, across a weight update. With R3 and
    top-p replay the resumed calls extend the kept arrays."""
    from slime.utils.types import Sample as SlimeSample

    from strands_slime.rollout.resume import STATE_KEY

    replay_flags = ["--use-rollout-routing-replay", "--num-layers", "2", "--moe-router-topk", "2"]
    replay_flags += ["--rollout-top-p", "0.95"]
    args = make_args(
        [("MEDIUMQ", "5"), ("SLOWTOOL: 17 times 2?", "34")],
        "--rollout-batch-size",
        "1",
        "--over-sampling-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--partial-rollout",
        "--mask-offpolicy-in-partial-rollout",
        *(replay_flags if replay else []),
        custom=WITH_TOOLS,
    )
    source = data_source(args)
    assert engine.scheduler is not None
    # MEDIUMQ's group finishes (and slime aborts the rest) while SLOWTOOL's first turn is done and its
    # 3 s tool call runs: ~180 tokens at 5 ms against ~30
    engine.scheduler.token_latency = 0.005
    groups, aborted, _ = await rollout(args, source)
    engine.scheduler.token_latency = 0.0
    assert [s.label for s in flatten(groups)] == ["5", "5"]
    recycled = flatten(aborted)
    assert len(recycled) == 2 and len(engine.request_log) == 4, "MEDIUMQ x2, SLOWTOOL's first turn x2"
    kept = {}
    for sample in recycled:
        check_sample(sample)
        assert sample.status.name == "ABORTED" and sample.metadata["start_rollout_id"] == 0
        state = sample.metadata[STATE_KEY]
        assert state["messages"][-1]["role"] == "assistant", "the cut tool call runs again on resume"
        assert sample.weight_versions == ["default"]
        kept[sample.index] = sample.response_length
    if not replay:  # what a data buffer that serializes its samples would do to them (no tensors)
        aborted = [
            [SlimeSample.from_dict(json.loads(json.dumps(s.to_dict()))) for s in group] for group in aborted
        ]
    source.add_samples(aborted)
    async with __import__("aiohttp").ClientSession() as session:  # a weight update in between
        await session.post(
            engine.url + "/update_weights_from_disk", json={"model_path": "/ckpt", "weight_version": "v2"}
        )
    args.rollout_batch_size = args.over_sampling_batch_size = 1  # only the recycled group
    groups, again, _ = await rollout(args, source, rollout_id=1)
    resumed = flatten(groups)
    assert again == [] and sorted(s.label for s in resumed) == ["34", "34"]
    assert len(engine.request_log) == 6, "each resumed episode sent only its second turn"
    for sample in resumed:
        check_sample(sample, offpolicy_prefix=kept[sample.index])
        assert sample.status.name == "COMPLETED" and sample.reward == 1.0
        assert sample.metadata["resumes"] == 1 and "restarts" not in sample.metadata
        assert STATE_KEY not in sample.metadata and sample.metadata["tool_calls"] == 1
        assert sample.metadata["turns"] == 2 and sample.metadata["tool_errors"] == 0
        assert sample.weight_versions == ["default", "v2"], "one weight version per model call"
        # slime's generate_and_rm masked the part generated before the abort; the rest trains
        assert set(sample.loss_mask[: kept[sample.index]]) == {0}
        assert 1 in sample.loss_mask[kept[sample.index] :]
        assert "<tool_response>\n34\n</tool_response>" in sample.response
        if replay:
            full = routed_expert_ids(sample.tokens, 0, MoEShape(2, 2, 8))
            assert sample.rollout_routed_experts.flatten().tolist() == full, "rows stitched across the resume"
            assert len(sample.rollout_top_p_token_offsets) == sample.response_length + 1
    data = slime_harness.train_data(args, resumed)  # validates top-p offsets and R3 shapes too
    assert data["response_lengths"] == [len(mask) for mask in data["loss_masks"]]


@pytest.mark.slow
async def test_partial_rollout_resumes_after_a_tool_round_the_model_already_read(
    make_args: Args, engine: DevServer
) -> None:
    """slime's over-sampling abort lands during the model call that follows a tool round (a malformed
    call, answered with the parser's explanation): the resumed episodes go on from the history the model
    read, under --mask-offpolicy-in-partial-rollout, and finish. A regression: the round was dropped
    from the saved history, ran again with another result, and the resumed call refused the history."""
    from strands_slime.rollout.resume import STATE_KEY

    args = make_args(
        [("MEDIUMQ", "5"), ("BADCALL: 17 times 2?", "34")],
        "--rollout-batch-size",
        "1",
        "--over-sampling-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--partial-rollout",
        "--mask-offpolicy-in-partial-rollout",
        custom=WITH_TOOLS,
    )
    source = data_source(args)
    assert engine.scheduler is not None
    engine.scheduler.token_latency = 0.005  # MEDIUMQ's ~180 tokens end while BADCALL's 600-token reply runs
    _, aborted, _ = await rollout(args, source)
    engine.scheduler.token_latency = 0.0
    recycled = flatten(aborted)
    assert len(recycled) == 2
    kept = {}
    for sample in recycled:
        state = sample.metadata[STATE_KEY]
        assert state["messages"][-1]["role"] == "user", "the answered round stays in the saved history"
        assert sample.metadata["parse_errors"] == 1
        kept[sample.index] = sample.response_length
    source.add_samples(aborted)
    args.rollout_batch_size = args.over_sampling_batch_size = 1
    groups, again, _ = await rollout(args, source, rollout_id=1)
    resumed = flatten(groups)
    assert again == [] and len(resumed) == 2
    for sample in resumed:
        assert sample.status.name == "COMPLETED", sample.metadata.get("infra_error")
        check_sample(sample, offpolicy_prefix=kept[sample.index])
        assert sample.metadata["resumes"] == 1 and sample.reward == 1.0
        assert set(sample.loss_mask[: kept[sample.index]]) == {0}
        assert sample.metadata["parse_errors"] == 1, "the malformed call was answered once, not again"


async def test_dynamic_sampling_replaces_groups_with_infra_failures(
    make_args: Args, engine: DevServer
) -> None:
    args = make_args(
        [("PLAINQ", "5"), ("WRONGQ", "5")],
        "--rollout-batch-size",
        "1",
        "--over-sampling-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--dynamic-sampling-filter-path",
        "strands_slime.rollout.filters.drop_groups_with_infra_failures",
        "--sglang-server-concurrency",
        "1",
    )
    inject_fault(engine, status=500, count=2)  # the first group's two episodes (one engine slot: FIFO)
    groups, _, metrics = await rollout(args, data_source(args))
    kept = flatten(groups)
    assert [s.prompt[0]["content"] for s in kept] == ["WRONGQ"] * 2
    assert all(not s.metadata["infra_error"] for s in kept)
    assert any("infra_failure" in key for key in metrics), metrics


async def test_recycled_failed_sample_is_scored_on_retry(make_args: Args, engine: DevServer) -> None:
    from slime.rollout.sglang_rollout import GenerateState, generate_and_rm

    args = make_args([("PLAINQ", "5")], "--reward-key", "score")
    sample = data_source(args).get_samples(1)[0][0]
    params = dict(GenerateState(args).sampling_params)
    inject_fault(engine, status=500, count=1)
    sample = await generate_and_rm(args, sample, dict(params))
    assert (
        sample.status.name == "FAILED" and sample.remove_sample and sample.reward["reason"] == "infra_failure"
    )
    sample = await generate_and_rm(args, sample, dict(params))  # slime regenerates what is not done
    check_sample(sample, grouped=False)
    assert sample.status.name == "COMPLETED" and not sample.remove_sample
    assert sample.reward["score"] == 1.0 and sample.metadata["raw_reward"] == 1.0
    assert sample.metadata["restarts"] == 1 and sample.metadata["infra_error"] is None


@pytest.mark.slow
async def test_fully_async_weight_update_requeues_aborted_groups(make_args: Args, engine: DevServer) -> None:
    from slime.rollout import fully_async_rollout

    args = make_args(
        [("LONGQ one", "1"), ("LONGQ two", "1")],
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--rollout-function-path",
        "slime.rollout.fully_async_rollout.generate_rollout_fully_async",
        "--sglang-server-concurrency",
        "2",
    )
    assert engine.scheduler is not None
    engine.scheduler.token_latency = 0.01
    source = data_source(args)
    collecting = asyncio.create_task(fully_async_rollout._generate_rollout_async(args, 0, source))
    try:
        await wait_until(lambda: running_requests(engine) >= 2)
        async with __import__("aiohttp").ClientSession() as session:  # what slime's weight sync does
            await session.post(engine.url + "/pause_generation", json={})
            await session.post(
                engine.url + "/update_weights_from_disk", json={"model_path": "/ckpt", "weight_version": "v2"}
            )
            engine.scheduler.token_latency = 0.0
            await session.post(engine.url + "/continue_generation", json={})
        groups = await asyncio.wait_for(collecting, 120)
    finally:
        fully_async_rollout._stop_global_worker()
    samples = flatten(groups)
    assert len(samples) == 4
    for sample in samples:
        check_sample(sample)
        assert sample.status.name in ("COMPLETED", "TRUNCATED") and not sample.remove_sample
        assert sample.weight_versions and sample.weight_versions[-1] == "v2"
    assert any(s.metadata.get("restarts") for s in samples), "aborted groups went back to the buffer"


# --------------------------------------------------------------------------- eval


async def test_eval_rollout_uses_each_datasets_max_response_len(
    make_args: Args, engine: DevServer, tmp_path: Path
) -> None:
    from slime.rollout.sglang_rollout import eval_rollout

    short = slime_harness.write_prompts(tmp_path / "short.jsonl", [("LONGQ", "1")])
    full = slime_harness.write_prompts(tmp_path / "full.jsonl", [("PLAINQ", "5")])
    config = tmp_path / "eval.yaml"
    config.write_text(
        json.dumps(
            {
                "eval": {
                    "defaults": {"n_samples_per_eval_prompt": 2, "input_key": "prompt", "label_key": "label"},
                    "datasets": [
                        {"name": "short", "path": str(short), "max_response_len": 48},
                        {"name": "full", "path": str(full)},
                    ],
                }
            }
        )
    )
    args = make_args([("PLAINQ", "5")], "--eval-config", str(config), "--eval-max-response-len", "4096")
    output, _ = await eval_rollout(args, 0)
    short_samples = output.data["short"]["samples"]
    assert [s.response_length for s in short_samples] == [48, 48]
    assert output.data["short"]["truncated"] == [True, True]
    assert output.data["full"]["rewards"] == [1.0, 1.0]
    for sample in short_samples + output.data["full"]["samples"]:
        check_sample(sample, grouped=False)
        assert sample.metadata["evaluation"] is True


# --------------------------------------------------------------------------- fan-out

FANOUT_SCRIPT = [
    {"match": "<tool_response>\n2\n", "replies": ["Done.\n\nAnswer: \\boxed{6}"]},
    {"match": "<tool_response>\n1\n", "replies": [tool_call("print(2)")]},
    {"match": "FANOUTQ", "replies": [tool_call("print(1)")]},
    {"match": "PLAINQ", "replies": ["Answer: \\boxed{5}"]},
]


async def test_fanout_one_sample_per_context_segment(tmp_path: Path) -> None:
    from slime.observability.rollout_data_utils import validate_rollout_id_annotated

    fanout = {
        "strands_slime": {**WITH_TOOLS["strands_slime"], "fanout": {"enabled": True, "window_messages": 3}}
    }
    async with (
        DevServer("scripted", script=FANOUT_SCRIPT) as engine,
        slime_harness.router_in_front_of(engine) as router,
    ):
        data = slime_harness.write_prompts(tmp_path / "p.jsonl", [("FANOUTQ", "6"), ("PLAINQ", "5")])
        args = slime_harness.slime_args(
            router,
            data,
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--custom-reward-post-process-path",
            "strands_slime.rollout.fanout.normalize_by_group_index",
            custom=fanout,
        )
        from slime.utils.http_utils import init_http_client

        init_http_client(args)
        groups, _, _ = await rollout(args, data_source(args))
    validate_rollout_id_annotated(groups)  # siblings share a rollout_id
    episodes = [episode for group in groups for episode in group]
    assert all(isinstance(episode, list) for episode in episodes), "fan-out always returns a list"
    compacted = [episode for episode in episodes if len(episode) > 1]
    assert len(compacted) == 2 and all(len(episode) == 2 for episode in compacted)
    for episode in compacted:
        first, second = episode
        assert first.rollout_id == second.rollout_id is not None
        assert [s.metadata["fanout_segment"] for s in episode] == [0, 1]
        assert first.reward == second.reward == 1.0, "every segment carries its episode's reward"
        assert len(second.tokens) - second.response_length < len(first.tokens), (
            "the compacted prompt is shorter"
        )
        for sample in episode:
            check_sample(sample, fanned_out=True)
    samples = [sample for episode in episodes for sample in episode]
    train = slime_harness.train_data(args, samples)
    assert len(train["tokens"]) == 6 and train["rewards"] == pytest.approx([0.0] * 6)
    sums = dict(zip(train["rollout_ids"], train["rollout_mask_sums"], strict=True))
    assert sums[compacted[0][0].rollout_id] == sum(sum(s.loss_mask) for s in compacted[0])
