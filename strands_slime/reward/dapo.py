"""DAPO-math reward for slime's ``--custom-rm-path`` (``strands_slime.reward_func``).

Scores only the model's final assistant text, accepts an answer when slime's Minerva
("Answer: ...") or strict-boxed mode accepts it, checks equivalence beyond string equality
(numbers, fractions, then math-verify in a worker process with a hard deadline), takes DAPO's soft
overlong punishment off training responses that run into the episode budget, and can apply the
strands example's tool-use shaping to wrong training answers (off by default).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from typing import Any

from strands_slime.config import ConfigError, RewardConfig, get_rollout_config
from strands_slime.episode_metadata import EpisodeMetadata, write_keys
from strands_slime.reward.math_answer import AnswerCheck, check_answer_async, get_math_verifier

__all__ = [
    "RewardConfig",
    "compute_reward",
    "overlong_penalty",
    "preset_reward",
    "reward_details",
    "reward_func",
    "scoring_text",
    "shape_reward",
]

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------
# What gets scored
# ----------------------------------------------------------------------------------------------

_ASSISTANT_TURN = "<|im_start|>assistant"
_TOOL_BLOCK = re.compile(
    r"<tool_response>.*?(?:</tool_response>|\Z)|<tool_call>.*?(?:</tool_call>|\Z)", re.DOTALL
)
_END_MARKERS = ("<|im_end|>", "<|endoftext|>")
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def _as_text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def scoring_text(sample: Any) -> str:
    """The text a sample's answer is read from: the model's final assistant message, reasoning removed.

    ``sample.metadata["final_text"]`` (set by ``strands_slime.generate``) when present; otherwise the
    part of ``sample.response`` after the last ``<|im_start|>assistant`` (the whole response when there
    is no such marker). Tool calls and ``<tool_response>`` blocks are removed, so an ``Answer:`` printed
    by a tool or written inside tool code never counts. Only the text after the last ``</think>`` is
    kept; a message whose ``<think>`` is never closed has no answer (empty string).
    """
    metadata = getattr(sample, "metadata", None)
    text = (
        _as_text(EpisodeMetadata.from_metadata(metadata).final_text) if isinstance(metadata, dict) else None
    )
    if text is None:
        response = _as_text(getattr(sample, "response", None)) or ""
        marker = response.rfind(_ASSISTANT_TURN)
        text = response[marker + len(_ASSISTANT_TURN) :] if marker >= 0 else response
    text = _TOOL_BLOCK.sub("", text)
    for end_marker in _END_MARKERS:
        text = text.replace(end_marker, "")
    close = text.rfind(_THINK_CLOSE)
    if close >= 0:
        return text[close + len(_THINK_CLOSE) :]
    if _THINK_OPEN in text:
        return ""
    return text


# ----------------------------------------------------------------------------------------------
# Shaping
# ----------------------------------------------------------------------------------------------

_MAX_COUNT = 100_000


def _tool_count(sample: Any, metadata: dict[str, Any], counter: str) -> int | None:
    value = getattr(EpisodeMetadata.from_metadata(metadata), counter) if counter in metadata else None
    if value is None and counter == "tool_iterations":
        value = getattr(sample, "tool_iters", None)  # slime's strands example sets this attribute
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(min(max(value, 0), _MAX_COUNT))


def shape_reward(raw_reward: float, correct: bool, tool_count: int | None, config: RewardConfig) -> float:
    """The training reward: correct answers keep theirs; wrong ones get the configured tool-use shaping.

    Without a tool count (a sample from another generate function) nothing is shaped.
    """
    if correct or tool_count is None or config.shaping == "none":
        return raw_reward
    if config.shaping == "strands_example":
        return min(-0.6, raw_reward + (tool_count - 2) / 2 * 0.1)
    shaped = raw_reward + config.linear_per_iteration * (tool_count - config.linear_baseline_iterations)
    return min(config.linear_cap, shaped)


def overlong_penalty(response_length: Any, max_response_len: Any, config: RewardConfig) -> float:
    """DAPO's soft overlong punishment (<= 0): nothing up to ``max_response_len - buffer`` tokens, then
    linearly down to ``-overlong_penalty`` at the budget (and beyond it).

    0.0 when it is off or a length is unknown (a sample of another generate function, no budget in args).
    """
    buffer = config.overlong_buffer_tokens
    if buffer is None or config.overlong_penalty == 0:
        return 0.0
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (response_length, max_response_len)):
        return 0.0
    if max_response_len <= 0:
        return 0.0
    excess = response_length - (max_response_len - buffer)
    if excess <= 0:
        return 0.0
    return -config.overlong_penalty * min(1.0, excess / buffer)


# ----------------------------------------------------------------------------------------------
# reward_func
# ----------------------------------------------------------------------------------------------


def _is_evaluation(metadata: object) -> bool:
    """``metadata["evaluation"]`` is True (set by our generate, or an eval config's metadata_overrides)."""
    if not isinstance(metadata, dict):
        return False
    value = EpisodeMetadata.from_metadata(metadata).evaluation
    try:
        return value is True or (not isinstance(value, str) and bool(value == 1))
    except Exception:  # exotic objects (arrays) whose comparison raises
        return False


def _reward_key(args: Any, evaluation: bool) -> str | None:
    key = getattr(args, "reward_key", None)
    if evaluation:
        key = getattr(args, "eval_reward_key", None) or key
    return key if isinstance(key, str) and key else None


def _package(
    details: dict[str, Any], args: Any, evaluation: bool, config: RewardConfig
) -> float | dict[str, Any]:
    key = _reward_key(args, evaluation)
    as_dict = config.output == "dict" or (config.output == "auto" and key is not None)
    if not as_dict:
        return details["score"]
    result = dict(details)
    if key is not None and key not in result:
        result[key] = result["score"]
    return result


def _infra_failure_reward(args: Any) -> float:
    return float(get_rollout_config(args).infra_failure_reward)


def _config_for(args: Any) -> RewardConfig:
    if args is None:
        return RewardConfig()
    return get_rollout_config(args).reward


async def compute_reward(
    sample: Any, config: RewardConfig, max_response_len: int | None = None
) -> dict[str, Any]:
    """Score one sample; returns ``{score, acc, pred, raw_score, shaped, overlong_penalty, reason, ...}``.

    ``score`` is the training reward (shaped, and less :func:`overlong_penalty` against
    ``max_response_len``, the episode budget), ``raw_score`` the bare verdict, ``acc`` DAPO accuracy.
    Evaluation samples get the bare verdict.
    """
    metadata = getattr(sample, "metadata", None)
    evaluation = _is_evaluation(metadata)
    metadata = metadata if isinstance(metadata, dict) else {}
    verifier = (
        get_math_verifier(config.math_verify_timeout_s, config.math_verify_workers)
        if config.math_verify
        else None
    )
    check: AnswerCheck = await check_answer_async(
        scoring_text(sample),
        getattr(sample, "label", None),
        answer_window=config.answer_window,
        strict_box_window=config.strict_box_window,
        reject_conflicting_answers=config.reject_conflicting_answers,
        verifier=verifier,
    )
    raw_score = config.correct_reward if check.correct else config.incorrect_reward
    tool_count = _tool_count(sample, metadata, config.shaping_count)
    penalty = 0.0
    score = raw_score
    if not evaluation:
        penalty = overlong_penalty(getattr(sample, "response_length", None), max_response_len, config)
        score = shape_reward(raw_score, check.correct, tool_count, config) + penalty
    return reward_details(
        config,
        score=score,
        acc=check.correct,
        pred=check.pred,
        raw_score=raw_score,
        reason=check.reason,
        source=check.source,
        method=check.method,
        math_verify=check.math_verify,
        tool_count=tool_count,
        evaluation=evaluation,
        overlong=penalty,
    )


def reward_details(
    config: RewardConfig,
    *,
    score: float,
    reason: str,
    evaluation: bool,
    acc: bool = False,
    pred: str | None = None,
    raw_score: float | None = None,
    source: str | None = None,
    method: str | None = None,
    math_verify: Any = None,
    tool_count: int | None = None,
    overlong: float = 0.0,
) -> dict[str, Any]:
    """The one place the reward dict is built: scored, failed-to-score and preset rewards share its keys
    (slime's ``--log-reward-category`` reads a key from every sample's dict)."""
    raw = score if raw_score is None else raw_score
    return {
        "score": float(score),
        "acc": acc,
        "pred": pred,
        "raw_score": float(raw),
        "shaped": score != raw,
        "overlong_penalty": float(overlong),
        "reason": reason,
        "source": source,
        "method": method,
        "math_verify": math_verify,
        config.shaping_count: tool_count,
        "evaluation": evaluation,
    }


INFRA_FAILURE_REASON = "infra_failure"
"""``reason`` of the reward preset on samples lost to infrastructure failures."""


def preset_reward(
    args: Any, value: float, *, evaluation: bool = False, config: RewardConfig | None = None
) -> float | dict[str, Any]:
    """The reward generate presets on a removed sample: same type and keys as :func:`reward_func`'s."""
    config = config if config is not None else _config_for(args)
    details = reward_details(config, score=value, reason=INFRA_FAILURE_REASON, evaluation=evaluation)
    return _package(details, args, evaluation, config)


def _is_removed_infra_failure(sample: Any) -> bool:
    """A sample generate removed for an infrastructure failure (never raises: see reward_func)."""
    try:
        metadata = getattr(sample, "metadata", None)
        removed = getattr(sample, "remove_sample", False) is True
        return (
            removed
            and isinstance(metadata, dict)
            and bool(EpisodeMetadata.from_metadata(metadata).infra_error)
        )
    except Exception:
        return False


def _record(sample: Any, details: dict[str, Any]) -> None:
    """Leave the verdict on the sample: slime logs ``metadata["raw_reward"]``; our CLI reads ``acc``."""
    metadata = getattr(sample, "metadata", None)
    if metadata is None:
        metadata = {}
        try:
            sample.metadata = metadata
        except (AttributeError, TypeError):
            return
    if isinstance(metadata, dict):
        write_keys(metadata, raw_reward=details["raw_score"], reward_details=dict(details))


async def _reward_one(args: Any, sample: Any, config: RewardConfig) -> float | dict[str, Any]:
    if _is_removed_infra_failure(sample):
        # --group-rm scores whole groups, removed samples included: give them the very reward generate
        # preset, so both reward paths agree and a lost episode is never graded on partial output.
        evaluation = _is_evaluation(sample.metadata)
        return preset_reward(args, _infra_failure_reward(args), evaluation=evaluation, config=config)
    try:
        details = await compute_reward(sample, config, getattr(args, "rollout_max_response_len", None))
    except Exception:  # one malformed sample must never kill a rollout
        logger.exception("reward: scoring failed; the sample gets incorrect_reward")
        try:
            evaluation = _is_evaluation(getattr(sample, "metadata", None))
        except Exception:
            evaluation = False
        details = reward_details(config, score=config.incorrect_reward, reason="error", evaluation=evaluation)
    try:
        _record(sample, details)
    except Exception:
        logger.exception("reward: could not record details on the sample")
    return _package(details, args, details["evaluation"], config)


async def reward_func(
    args: Any, sample: Any, *, config: RewardConfig | None = None, **kwargs: Any
) -> float | dict[str, Any] | list[float | dict[str, Any]]:
    """slime's ``--custom-rm-path strands_slime.reward_func``: DAPO reward for one sample or a list.

    Returns a float, or a dict (``score``, ``acc``, ``pred``, ...) when ``config.output`` asks for it
    (``auto``: when ``--reward-key`` is set). Never raises for any sample; an invalid rollout config
    raises (from ``strands_slime.config``), since training on a misread config is worse than stopping.
    """
    del kwargs  # slime passes none today; accepted for forward compatibility
    if config is None:
        config = _config_for(args)
    budget = getattr(args, "rollout_max_response_len", None)
    if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
        problem = config.budget_problem(budget)
        if problem:  # every sample would be punished: stopping beats training on it
            raise ConfigError(problem)
    if isinstance(sample, (list, tuple)):
        return list(await asyncio.gather(*(_reward_one(args, item, config) for item in sample)))
    return await _reward_one(args, sample, config)
