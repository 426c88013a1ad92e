"""Writing an episode into slime's ``Sample``: the one place that knows slime's sample fields.

Every sample ``generate`` returns satisfies slime's invariants (``len(loss_mask) ==
len(rollout_log_probs) == response_length >= 1``). The response is rebuilt call by call through
slime's own ``Sample.append_response_tokens`` (our stand-in has the same method), so top-p replay,
routed experts, weight versions, speculative and prefix-cache counters come out as in slime's own
rollouts. An attempt first clears what an earlier one left (:func:`reset_attempt`), or keeps the
finished part of an aborted one that resumes (:func:`prepare_resume`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from strands_slime.config import ConfigError, RolloutConfig
from strands_slime.episode_metadata import (
    EPISODE_METADATA_KEYS,
    RESTARTS_KEY,
    RESUMES_KEY,
    EpisodeMetadata,
    write_keys,
)
from strands_slime.provider.trajectory import TokenTrajectory
from strands_slime.reward.dapo import preset_reward
from strands_slime.rollout import slime_compat
from strands_slime.runtime import get_runtime

logger = logging.getLogger(__name__)

SAMPLE_INPUT_FIELDS: tuple[str, ...] = (
    "group_index",
    "index",
    "prompt",
    "label",
    "metadata",
    "session_id",
    "rollout_id",
)
"""What an episode needs of the sample to run (after the attempt was reset): what the episode
executor sends a worker process."""

_ATTEMPT_FIELDS: dict[str, Any] = {
    "response": "",
    "response_length": 0,
    "loss_mask": None,
    "rollout_log_probs": None,
    "rollout_top_p_token_ids": None,
    "rollout_top_p_token_offsets": None,
    "rollout_routed_experts": None,
    "teacher_log_probs": None,
    "reward": None,
    "remove_sample": False,
    "non_generation_time": 0.0,
}
"""Sample fields an attempt writes, with their fresh values (lists and info objects are added below)."""

SAMPLE_RESULT_FIELDS: tuple[str, ...] = (
    "tokens",
    *_ATTEMPT_FIELDS,
    "weight_versions",
    "spec_info",
    "prefix_cache_info",
    "status",
    "metadata",
    "session_id",
    "rollout_id",
)
"""Every Sample attribute ``generate`` writes: what a worker process of the episode executor ships
back onto slime's own sample."""

RESUME_FIELDS: tuple[str, ...] = tuple(
    name for name in SAMPLE_RESULT_FIELDS if name not in SAMPLE_INPUT_FIELDS
)
"""What the episode executor also ships of an ABORTED sample that resumes (``--partial-rollout``): the
kept part of its response, as the in-process path finds it on the sample (``metadata``, an input,
carries the saved state)."""


# ---------------------------------------------------------------------- before an attempt


def reset_attempt(sample: Any) -> None:
    """Undo whatever an earlier attempt (ours or another generate's) left on the sample."""
    previous = bool(getattr(sample, "tokens", None)) or slime_compat.status_name(sample) != "pending"
    clear_attempt_fields(sample)
    metadata = dict(getattr(sample, "metadata", None) or {})
    for key in EPISODE_METADATA_KEYS:  # the saved episode state (resume.STATE_KEY) included
        metadata.pop(key, None)
    if previous:
        metadata[RESTARTS_KEY] = int(EpisodeMetadata.from_metadata(metadata).restarts or 0) + 1
    sample.metadata = metadata
    sample.status = slime_compat.status(sample, "PENDING")


def prepare_resume(args: Any, sample: Any) -> None:
    """Ready an ABORTED sample whose episode resumes: the finished part of its response stays (tokens,
    logprobs, top-p arrays, routed experts, weight versions, cache and speculative counters, sandbox
    time), the rest of the attempt's outcome goes. Under ``--mask-offpolicy-in-partial-rollout`` the
    kept response gets loss mask 0, as slime's ``generate_and_rm`` does before calling ``generate``."""
    metadata = dict(getattr(sample, "metadata", None) or {})
    for key in EPISODE_METADATA_KEYS:  # the saved episode state (resume.STATE_KEY) included
        metadata.pop(key, None)
    metadata[RESUMES_KEY] = int(EpisodeMetadata.from_metadata(metadata).resumes or 0) + 1
    sample.metadata = metadata
    sample.reward = None
    sample.remove_sample = False
    if getattr(sample, "teacher_log_probs", None) is not None:
        sample.teacher_log_probs = None
    if getattr(args, "mask_offpolicy_in_partial_rollout", False) and sample.response_length > 0:
        sample.loss_mask = [0] * sample.response_length
    sample.status = slime_compat.status(sample, "PENDING")


def clear_attempt_fields(sample: Any) -> None:
    """Every field an attempt writes back to its fresh value."""
    sample.tokens = []
    for name, value in _ATTEMPT_FIELDS.items():
        if hasattr(sample, name) or name not in ("teacher_log_probs", "rollout_routed_experts"):
            setattr(sample, name, value)
    sample.weight_versions = []
    for name in ("spec_info", "prefix_cache_info"):
        info = getattr(sample, name, None)
        if info is not None:
            setattr(sample, name, type(info)())


# ---------------------------------------------------------------------- the response


def wants_top_p(args: Any, sampling_params: Mapping[str, Any], evaluation: bool) -> bool:
    """slime replays the top-p nucleus (``--rollout-top-p < 1``): every trained sample needs the arrays."""
    custom = sampling_params.get("custom_params")
    if isinstance(custom, Mapping) and custom.get("return_top_p_token_ids"):
        return True
    return not evaluation and float(getattr(args, "rollout_top_p", 1.0) or 1.0) != 1.0


def start_response(sample: Any, prompt_ids: list[int], want_top_p: bool) -> None:
    """Prompt only, no response yet; top-p arrays start empty so every later span lines up."""
    sample.tokens = list(prompt_ids)
    sample.response = ""
    sample.response_length = 0
    sample.loss_mask = None
    sample.rollout_log_probs = None
    if want_top_p:
        sample.rollout_top_p_token_ids = []
        sample.rollout_top_p_token_offsets = [0]


def _append(sample: Any) -> Any:
    """``sample.append_response_tokens``: slime's own rules (our stand-in has the same method)."""
    method = getattr(sample, "append_response_tokens", None)
    if method is None:
        raise ConfigError(
            f"{type(sample).__module__}.{type(sample).__name__} has no append_response_tokens: this slime "
            "is older than the one strands_slime targets (THUDM/slime 624b824 or later)"
        )
    return method


def replay_trajectory(
    args: Any, sample: Any, trajectory: TokenTrajectory, want_top_p: bool, resumed_segments: int = 0
) -> int:
    """Rebuild the sample call by call from the trajectory; returns how many null logprobs were masked.

    A resumed episode (``resumed_segments`` > 0) keeps what the sample holds, the trajectory's first
    ``resumed_segments`` segments, and appends only the rest, as slime's own generate does."""
    if resumed_segments:
        kept = len(sample.tokens)
        if (
            len(trajectory.segment_info) < resumed_segments
            or len(trajectory) < kept
            or trajectory.token_ids[:kept].tolist() != list(sample.tokens)
        ):
            raise RuntimeError("the resumed episode no longer extends the response the sample holds")
        segments = trajectory.segment_info[resumed_segments:]
        first_new = sample.response_length
    else:
        prompt_len = trajectory.initial_prompt_length
        start_response(sample, trajectory.token_ids[:prompt_len].tolist(), want_top_p)
        segments = trajectory.segment_info[1:]
        first_new = 0
    append = _append(sample)
    replay_experts = bool(getattr(args, "use_rollout_routing_replay", False))
    for segment in segments:
        ids = trajectory.token_ids[segment.start : segment.start + segment.length].tolist()
        if segment.is_output:
            meta = segment.meta_info or {}
            check_replay_meta(meta, want_top_p, replay_experts)
            logprobs = trajectory.logprobs[segment.start : segment.start + segment.length].tolist()
            append(args, tokens=ids, log_probs=logprobs, trainable=True, meta_info=meta)
        else:
            append(args, tokens=ids, trainable=False)
    mask, logprobs = sample.loss_mask, sample.rollout_log_probs
    masked = 0
    for i in range(first_new, len(logprobs)):
        value = logprobs[i]
        if math.isinf(value) or math.isnan(value):  # the server sent no logprob: train nothing there
            mask[i], logprobs[i] = 0, 0.0
            masked += 1
    if masked:
        _warn_masked_logprobs_once(trajectory, masked)
    return masked


def _warn_masked_logprobs_once(trajectory: TokenTrajectory, masked: int) -> None:
    """One WARNING per process and cause: model tokens without a logprob are silently untrained."""
    whole_replies = sum(
        1
        for segment in trajectory.segment_info
        if segment.is_output
        and all(math.isinf(v) for v in trajectory.logprobs[segment.start : segment.start + segment.length])
    )
    if whole_replies:
        cause = "a /generate reply had no logprob for any of its output tokens (return_logprob ignored?)"
    else:
        cause = "the server returned null logprobs for some output tokens"
    if get_runtime().first_time(f"masked_null_logprobs: {cause}"):
        logger.warning(
            "masked %d model token(s) out of training because %s; counted per sample in "
            "metadata.masked_null_logprobs (rollout/strands/masked_null_logprobs/*); logged once per process",
            masked,
            cause,
        )


def check_replay_meta(meta: Mapping[str, Any], want_top_p: bool, replay_experts: bool) -> None:
    """A server that ignores what slime asked for would make every sample fail or, for routed
    experts, train on made-up routing: that is a deployment error, not a sample's."""
    if want_top_p and not any(key in meta for key in ("top_p_token_ids", "top_p_kept_token_ids")):
        raise ConfigError(
            "--rollout-top-p < 1 needs top-p replay from SGLang (slime's patched SGLang), but a reply "
            "had no top_p_token_ids"
        )
    if replay_experts and "routed_experts" not in meta:
        raise ConfigError(
            "--use-rollout-routing-replay needs routed experts from SGLang (--enable-return-routed-experts "
            "on an MoE model), but a reply had no routed_experts"
        )


def append_inert_token(args: Any, sample: Any, tokenizer: Any) -> None:
    """slime needs ``response_length >= 1``: one untrained token when the episode produced nothing."""
    pad = getattr(tokenizer, "eos_token_id", None) or 0
    _append(sample)(args, tokens=[int(pad)], trainable=False)


def fill_missing_routed_experts(args: Any, sample: Any) -> None:
    """Under ``--use-rollout-routing-replay`` every sample needs ``[len(tokens) - 1, layers, topk]``
    routed experts; one with no model output (removed from training) gets experts ``0..topk-1`` in
    every row (slime rejects an all-zero capture as a broken one)."""
    if not getattr(args, "use_rollout_routing_replay", False):
        return
    if getattr(sample, "rollout_routed_experts", None) is not None:
        return
    layers, topk = int(args.num_layers), int(args.moe_router_topk)
    sample.rollout_routed_experts = [
        [list(range(topk)) for _ in range(layers)] for _ in range(len(sample.tokens) - 1)
    ]


def decode_response(sample: Any, tokenizer: Any) -> None:
    """``sample.response``: the response ids as text (special tokens kept, as slime's generate does)."""
    prompt_len = len(sample.tokens) - sample.response_length
    sample.response = (
        tokenizer.decode(sample.tokens[prompt_len:], skip_special_tokens=False) if tokenizer else ""
    )


# ---------------------------------------------------------------------- failures


def remove(args: Any, sample: Any, config: RolloutConfig, evaluation: bool) -> None:
    """An infrastructure failure: FAILED, out of training, and the preset reward (same keys as a real one)."""
    sample.status = slime_compat.status(sample, "FAILED")
    sample.remove_sample = True
    sample.reward = preset_reward(
        args, config.infra_failure_reward, evaluation=evaluation, config=config.reward
    )
    # slime logs raw_reward when any sample has it; keep it numeric on every sample
    write_keys(sample.metadata, raw_reward=config.infra_failure_reward)


def fill_dead(
    args: Any, sample: Any, config: RolloutConfig, reason: str, evaluation: bool, want_top_p: bool
) -> None:
    """The last line of defence: a valid, removed sample carrying the reason filling it failed (the
    caller writes ``abort_detection``)."""
    clear_attempt_fields(sample)
    start_response(sample, [0], want_top_p)
    append_inert_token(args, sample, None)
    fill_missing_routed_experts(args, sample)
    metadata = dict(getattr(sample, "metadata", None) or {})
    write_keys(metadata, infra_error=reason, evaluation=evaluation)
    sample.metadata = metadata
    remove(args, sample, config, evaluation)


def mark_aborted_by_slime(sample: Any) -> None:
    """What an episode that ends while slime's flag is set becomes: ABORTED by slime, whatever the
    worker saw (a server abort, or an end just before the flag reached it)."""
    metadata = sample.metadata
    if slime_compat.status_name(sample) == "aborted" and metadata.get("abort_source") == "slime":
        return
    sample.status = slime_compat.status(sample, "ABORTED")
    sample.remove_sample = False
    sample.reward = None
    metadata.pop("truncation", None)
    metadata.pop("raw_reward", None)
    write_keys(metadata, finish_reason="abort", abort_source="slime", infra_error=None)
