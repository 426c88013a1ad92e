"""DAPO-math reward for slime's ``--custom-rm-path`` (``strands_slime.reward_func``).

Scores only the model's final assistant text, accepts an answer when slime's Minerva
("Answer: ...") or strict-boxed mode accepts it, checks equivalence beyond string equality
(numbers, fractions, then math-verify in a worker process with a hard deadline), and applies
the strands example's tool-use shaping to wrong training answers only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["RewardConfig"]

_LINEAR_FIELDS = ("linear_per_iteration", "linear_baseline_iterations", "linear_cap")


class RewardConfig(BaseModel):
    """The ``reward:`` section of the rollout YAML; every field has a working default."""

    model_config = ConfigDict(extra="forbid")

    shaping: Literal["strands_example", "linear", "none"] = Field(
        "strands_example",
        description=(
            "How wrong training answers are shaped. strands_example: min(-0.6, incorrect_reward + "
            "(n - 2) / 2 * 0.1) as in slime's strands example; linear: min(linear_cap, "
            "incorrect_reward + linear_per_iteration * (n - linear_baseline_iterations)); none: no "
            "shaping. n counts tool use (see shaping_count). Evaluation samples are never shaped."
        ),
    )
    shaping_count: Literal["tool_iterations", "tool_calls"] = Field(
        "tool_iterations", description="Which metadata counter shaping reads as n."
    )
    linear_per_iteration: float = Field(0.05, description="linear shaping: reward per tool-use unit.")
    linear_baseline_iterations: float = Field(2.0, description="linear shaping: n at which nothing is added.")
    linear_cap: float = Field(-0.6, description="linear shaping: a shaped wrong answer never exceeds this.")
    correct_reward: float = Field(1.0, description="Reward of a correct answer (slime's DAPO uses 1.0).")
    incorrect_reward: float = Field(-1.0, description="Reward of a wrong or missing answer before shaping.")
    output: Literal["auto", "float", "dict"] = Field(
        "auto",
        description=(
            "float: return the reward; dict: return {score, acc, pred, ...} for --reward-key; auto: "
            "dict exactly when slime's --reward-key (--eval-reward-key for evaluation) is set."
        ),
    )
    answer_window: int = Field(300, ge=1, description="Characters at the end of the final text searched.")
    strict_box_window: int = Field(
        100, ge=1, description="Characters at the end of the final text searched for \\boxed{} (strict mode)."
    )
    reject_conflicting_answers: bool = Field(
        True,
        description=(
            "Score as wrong when the 'Answer:' line and the last \\boxed{} give different answers, "
            "so that hedging across both forms is never rewarded."
        ),
    )
    math_verify: bool = Field(
        True,
        description="Use math-verify (when installed) for answers that string/number checks can't decide.",
    )
    math_verify_timeout_s: float = Field(
        2.0,
        gt=0,
        le=600,
        description="Hard deadline for one math-verify check; the worker is killed past it.",
    )
    math_verify_workers: int = Field(
        1, ge=1, le=64, description="math-verify worker processes (started lazily, kept warm)."
    )

    @model_validator(mode="after")
    def _linear_fields_need_linear_shaping(self) -> RewardConfig:
        stray = [name for name in _LINEAR_FIELDS if name in self.model_fields_set]
        if stray and self.shaping != "linear":
            raise ValueError(
                f"{', '.join(stray)} only apply with shaping: linear (shaping is {self.shaping!r})"
            )
        return self
