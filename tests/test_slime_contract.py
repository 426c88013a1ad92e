"""The Sample contract without slime's rollout loop: the stand-in against slime's real ``Sample``,
resets between attempts, preset rewards and server-side aborts."""

from __future__ import annotations

import asyncio
import base64
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from strands_slime import generate
from strands_slime.cli import RolloutOptions, slime_args
from strands_slime.devserver import DevServer
from strands_slime.episode_metadata import EPISODE_METADATA_KEYS
from strands_slime.reward.dapo import RewardConfig, preset_reward, reward_func
from strands_slime.rollout.sample_fill import reset_attempt
from strands_slime.rollout.slime_compat import Sample

pytestmark = pytest.mark.unit


def b64(values: list[int]) -> str:
    return base64.b64encode(struct.pack(f"<{len(values)}i", *values)).decode()


ARGS = type("Args", (), {"num_layers": 2, "moe_router_topk": 1, "sglang_speculative_algorithm": "EAGLE"})()


def episode(sample: Any) -> Any:
    """Two model calls around a tool result, as generate replays them (top-p, R3, spec, versions)."""
    sample.tokens = [1, 2, 3]
    sample.rollout_top_p_token_ids, sample.rollout_top_p_token_offsets = [], [0]
    sample.append_response_tokens(
        ARGS,
        tokens=[10, 11],
        log_probs=[-0.5, -0.25],
        meta_info={
            "finish_reason": {"type": "stop"},
            "weight_version": "v1",
            "prompt_tokens": 3,
            "cached_tokens": 1,
            "completion_tokens": 2,
            "spec_accept_token_num": 1,
            "spec_draft_token_num": 3,
            "spec_verify_ct": 1,
            "top_p_token_ids": b64([10, 7, 11]),
            "top_p_token_offsets": b64([0, 2, 3]),
            "routed_experts": b64([4, 5, 6, 7, 1, 2, 3, 0]),  # 4 rows x 2 layers x top-1
        },
    )
    sample.append_response_tokens(ARGS, tokens=[20, 21, 22], trainable=False)
    sample.append_response_tokens(
        ARGS,
        tokens=[30],
        log_probs=[-1.0],
        meta_info={
            "finish_reason": {"type": "length", "length": 1},
            "weight_version": "v2",
            "prompt_tokens": 8,
            "cached_tokens": 4,
            "completion_tokens": 1,
            "top_p_token_ids": [30, 31],
            "top_p_token_offsets": [0, 2],
            "routed_experts": [9, 9, 8, 8, 7, 7, 6, 6],  # rows 4..7 (start_len 4)
            "routed_experts_start_len": 4,
        },
    )
    return sample


def as_plain(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


FIELDS = (
    "tokens",
    "response_length",
    "loss_mask",
    "rollout_log_probs",
    "rollout_top_p_token_ids",
    "rollout_top_p_token_offsets",
    "rollout_routed_experts",
    "weight_versions",
    "status",
)


def test_stand_in_append_response_tokens_rules() -> None:
    sample = episode(Sample())
    assert sample.response_length == 6 and sample.loss_mask == [1, 1, 0, 0, 0, 1]
    assert sample.rollout_log_probs == [-0.5, -0.25, 0.0, 0.0, 0.0, -1.0]
    assert sample.rollout_top_p_token_ids == [10, 7, 11, 30, 31]
    assert sample.rollout_top_p_token_offsets == [0, 2, 3, 3, 3, 3, 5], "tool tokens get empty spans"
    assert len(sample.rollout_routed_experts) == len(sample.tokens) - 1 == 8
    assert sample.rollout_routed_experts[4:] == [[[9], [9]], [[8], [8]], [[7], [7]], [[6], [6]]]
    assert sample.weight_versions == ["v1", "v2"] and sample.status is Sample.Status.TRUNCATED
    assert sample.spec_info.to_dict() == {
        "spec_accept_token_num": 1,
        "spec_draft_token_num": 3,
        "spec_verify_ct": 1,
        "completion_token_num": 3,
    }
    assert sample.prefix_cache_info.to_dict() == {"cached_tokens": 5, "total_prompt_tokens": 11}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tokens": [1], "log_probs": [-1.0, -2.0]}, "log_probs length"),
        ({"tokens": [1]}, "require rollout log probabilities"),
        (
            {"tokens": [1], "log_probs": [-1.0], "trainable": False},
            "should not pass rollout log probabilities",
        ),
        (
            {"tokens": [1], "log_probs": [-1.0], "meta_info": {"top_p_token_ids": [1]}},
            "both token ids and offsets",
        ),
        (
            {
                "tokens": [1],
                "log_probs": [-1.0],
                "meta_info": {"top_p_token_ids": [1], "top_p_token_offsets": [0, 2]},
            },
            "offsets\\[-1\\]=2",
        ),
        ({"tokens": [1], "log_probs": [-1.0], "meta_info": {"routed_experts": [1, 2, 3]}}, "element count"),
    ],
)
def test_stand_in_rejects_what_slime_rejects(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Sample(tokens=[5]).append_response_tokens(ARGS, **kwargs)


@pytest.mark.parametrize("status", list(Sample.Status))
def test_reset_undoes_every_earlier_attempt(status: Sample.Status) -> None:
    dirty = episode(Sample(metadata={"dataset_key": "kept", **dict.fromkeys(EPISODE_METADATA_KEYS, "stale")}))
    dirty.status, dirty.reward, dirty.remove_sample, dirty.response = status, {"score": 0.0}, True, "old"
    dirty.non_generation_time, dirty.teacher_log_probs = 3.0, [0.0]
    reset_attempt(dirty)
    fresh = Sample()
    for name in (*FIELDS, "response", "reward", "remove_sample", "non_generation_time", "teacher_log_probs"):
        expected = [] if name == "tokens" else getattr(fresh, name)
        assert getattr(dirty, name) == expected, name
    assert dirty.spec_info == fresh.spec_info and dirty.prefix_cache_info == fresh.prefix_cache_info
    assert dirty.metadata == {"dataset_key": "kept", "restarts": 1}


def test_a_fresh_sample_is_not_counted_as_a_restart() -> None:
    sample = Sample(metadata={"k": 1})
    reset_attempt(sample)
    assert sample.metadata == {"k": 1}


@pytest.mark.parametrize("reward_key", [None, "score"])
async def test_preset_rewards_have_the_real_rewards_keys(reward_key: str | None) -> None:
    args = type("Args", (), {"reward_key": reward_key, "eval_reward_key": None})()
    config = RewardConfig()
    scored = Sample(response="Answer: 5", label="5", metadata={"final_text": "Answer: 5"})
    real = await reward_func(args, scored, config=config)
    preset = preset_reward(args, 0.0, config=config)
    assert type(real) is type(preset)
    if reward_key:
        assert set(real) == set(preset) and preset["reason"] == "infra_failure" and preset["score"] == 0.0
    removed = Sample(remove_sample=True, metadata={"infra_error": "boom"}, response="Answer: 5", label="5")
    assert await reward_func(args, removed, config=config) == preset, "never graded on a lost episode"


# --------------------------------------------------------------------------- with the dev server

SCRIPT = [{"match": "LONGQ", "replies": ["word " * 600]}, {"replies": ["Answer: \\boxed{5}"]}]


@pytest.fixture
async def server() -> AsyncIterator[DevServer]:
    async with DevServer("scripted", script=SCRIPT, token_latency=0.01) as running:
        yield running


def make_args(url: str) -> Any:
    args = slime_args(
        RolloutOptions(data=Path("unused"), out=Path("unused"), max_response_len=2048), url, None
    )
    args.strands_slime = {"tools": [], "client": {"max_retries": 0}}
    return args


async def test_server_side_abort_comes_back_aborted(server: DevServer) -> None:
    sample = Sample(prompt=[{"role": "user", "content": "LONGQ"}], label="1")
    running = asyncio.create_task(generate(make_args(server.url), sample, {"max_new_tokens": 2048}))
    assert server.scheduler is not None
    scheduler = server.scheduler
    await wait_until(lambda: scheduler.num_running > 0, what="the generation to start")
    server.abort(abort_all=True)  # not slime's abort: an operator, a weight update, ...
    await asyncio.wait_for(running, 30)
    assert sample.status is Sample.Status.ABORTED and sample.metadata["abort_source"] == "server"
    assert not sample.remove_sample and sample.reward is None and sample.metadata["infra_error"] is None


async def test_generate_writes_only_the_declared_metadata_keys(server: DevServer) -> None:
    sample = Sample(prompt=[{"role": "user", "content": "hi"}], label="5", metadata={"dataset_key": 1})
    args = make_args(server.url)
    await generate(args, sample, {"max_new_tokens": 64})
    sample.reward = await reward_func(args, sample)
    assert set(sample.metadata) - {"dataset_key"} <= EPISODE_METADATA_KEYS


def test_fanout_normalization_counts_each_episode_once() -> None:
    from strands_slime.rollout.fanout import normalize_by_group_index

    args = type("Args", (), {"reward_key": None, "advantage_estimator": "grpo"})()
    samples = [
        Sample(group_index=0, rollout_id=7, reward=1.0),
        Sample(group_index=0, rollout_id=7, reward=1.0),  # the same episode's second segment
        Sample(group_index=0, rollout_id=8, reward=0.0),
        Sample(group_index=1, reward=0.5),
        Sample(group_index=1, reward=0.5),
    ]
    raw, normalized = normalize_by_group_index(args, samples)
    assert raw == [1.0, 1.0, 0.0, 0.5, 0.5]
    spread = 0.5 / (2**-0.5 + 1e-6)
    assert normalized == pytest.approx([spread, spread, -spread, 0.0, 0.0])
    args.advantage_estimator = "ppo"
    assert normalize_by_group_index(args, samples) == (raw, raw)


async def test_fanout_refuses_loops_that_cannot_requeue_lists(server: DevServer) -> None:
    from strands_slime.config import ConfigError

    args = make_args(server.url)
    args.strands_slime = {"tools": [], "fanout": {"enabled": True}}
    args.partial_rollout = True
    with pytest.raises(ConfigError, match="partial-rollout"):
        await generate(args, Sample(prompt="hi"), {"max_new_tokens": 8})
    args.partial_rollout = False
    args.rollout_function_path = "slime.rollout.fully_async_rollout.generate_rollout_fully_async"
    with pytest.raises(ConfigError, match="fully-async"):
        await generate(args, Sample(prompt="hi"), {"max_new_tokens": 8})
    args.rollout_function_path = "slime.rollout.sglang_rollout.generate_rollout"
    result = await generate(args, Sample(prompt="hi", index=3), {"max_new_tokens": 8})
    assert isinstance(result, list) and len(result) == 1 and result[0].rollout_id == 3


async def test_missing_replay_data_is_a_deployment_error(server: DevServer) -> None:
    from strands_slime.config import ConfigError

    args = make_args(server.url)  # this dev server was started without --routed-experts
    args.use_rollout_routing_replay, args.num_layers, args.moe_router_topk = True, 2, 2
    with pytest.raises(ConfigError, match="enable-return-routed-experts"):
        await generate(args, Sample(prompt="hi"), {"max_new_tokens": 8})


def test_top_p_replay_must_come_back_when_asked() -> None:
    from strands_slime.config import ConfigError
    from strands_slime.provider.trajectory import TokenTrajectory
    from strands_slime.rollout.sample_fill import replay_trajectory as _replay_trajectory

    trajectory = TokenTrajectory()
    trajectory.add_prompt([1, 2])
    trajectory.add_output([3], [-0.5], {"finish_reason": {"type": "stop"}})
    with pytest.raises(ConfigError, match="top_p_token_ids"):
        _replay_trajectory(ARGS, Sample(), trajectory, want_top_p=True)
    trajectory = TokenTrajectory()
    trajectory.add_prompt([1, 2])
    trajectory.add_output([3], [-0.5], {"finish_reason": {"type": "stop"}, "top_p_token_ids": [3, 4]})
    trajectory.segment_info[-1].meta_info["top_p_token_offsets"] = [0, 2]
    sample = Sample()
    _replay_trajectory(type("A", (), {})(), sample, trajectory, want_top_p=True)
    assert sample.rollout_top_p_token_ids == [3, 4] and sample.rollout_top_p_token_offsets == [0, 2]


async def test_evaluation_never_fans_out(server: DevServer) -> None:
    args = make_args(server.url)
    args.strands_slime = {"tools": [], "fanout": {"enabled": True}}
    args.partial_rollout = True  # would be refused in training
    result = await generate(args, Sample(prompt="hi", index=3), {"max_new_tokens": 8}, evaluation=True)
    assert isinstance(result, Sample) and result.rollout_id is None
