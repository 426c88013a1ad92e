"""strands_slime.reward_func: what is scored, DAPO semantics and fixes, shaping, outputs, robustness."""

from __future__ import annotations

import importlib
import math
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import strands_slime
from strands_slime.config import ConfigError
from strands_slime.reward.dapo import RewardConfig, reward_func, scoring_text, shape_reward
from strands_slime.reward.math_answer import math_verify_available

pytestmark = pytest.mark.unit

NO_SHAPING = RewardConfig(shaping="none")
STRANDS_SHAPING = RewardConfig(shaping="strands_example")
needs_math_verify = pytest.mark.skipif(not math_verify_available(), reason="math-verify not installed")


def make_sample(
    final_text: str | None = None, label: object = "34", response: object = "", **metadata: Any
) -> SimpleNamespace:
    if final_text is not None:
        metadata["final_text"] = final_text
    return SimpleNamespace(response=response, label=label, metadata=metadata, status="completed", reward=None)


def turn(role: str, content: str) -> str:
    return f"<|im_start|>{role}\n{content}<|im_end|>\n"


# The tricky-answer table (label "34" unless given). Each row goes through reward_func end to end.
TRICKY_ANSWERS: list[tuple[str, str, str, bool]] = [
    # name, final text, label, correct
    ("plain answer line", "So the total is 34.\n\nAnswer: 34", "34", True),
    ("boxed only (slime Minerva: [INVALID])", "The result is \\boxed{34}.", "34", True),
    ("answer line with box", "Answer: \\boxed{34}", "34", True),
    ("bold answer with box (slime Minerva: **34)", "**Answer:** \\boxed{34}", "34", True),
    ("box then period (slime Minerva: 34.)", "Answer: \\boxed{34}.", "34", True),
    ("bold answer, no box", "**Answer: 34**", "34", True),
    ("dollar math", "Answer: $34$", "34", True),
    ("equation", "Answer: $x = 34$", "34", True),
    ("nested braces fraction", "Answer: \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", True),
    ("nested braces set", "\\boxed{\\{1, 2\\}}", "\\{1,2\\}", True),
    ("text wrapper", "Answer: \\text{34}", "34", True),
    ("text unit", "Answer: 34 \\text{ cm}", "34", True),
    ("word unit", "Answer: 34 degrees", "34", True),
    ("degree sign", "Answer: $34^\\circ$", "34", True),
    ("dollar amount", "Answer: \\$34", "34", True),
    ("thousands comma", "Answer: 1,000", "1000", True),
    ("thousands braces", "Answer: 1{,}000", "1000", True),
    ("thousands thin space", "Answer: 1\\,000", "1000", True),
    ("negative", "Answer: -34", "-34", True),
    ("unicode minus", "Answer: \u221234", "-34", True),
    ("wrong sign", "Answer: 34", "-34", False),
    ("fraction vs decimal", "Answer: \\frac{1}{2}", "0.5", True),
    ("decimal vs fraction label", "Answer: 0.5", "\\frac{1}{2}", True),
    ("slash fraction", "Answer: 3/4", "\\frac{3}{4}", True),
    ("trailing zero decimal", "Answer: 34.0", "34", True),
    ("near miss decimal", "Answer: 34.01", "34", False),
    ("wrong answer", "Answer: 35", "34", False),
    ("several answer lines: the last counts", "Answer: 35\nWait, recheck.\nAnswer: 34", "34", True),
    ("several answer lines: last is wrong", "Answer: 34\nWait, recheck.\nAnswer: 35", "34", False),
    ("several boxes: the last counts", "\\boxed{35} no, \\boxed{34}", "34", True),
    ("hedge across box and answer line", "\\boxed{34}\n\nAnswer: 35", "34", False),
    ("hedge in one line", "Answer: 34, 35", "34", False),
    ("no answer", "I could not solve this problem.", "34", False),
    ("empty final text", "", "34", False),
    ("unclosed box", "Answer is \\boxed{34", "34", False),
    ("answer in reasoning only", "<think>Answer: 34</think>I give up.", "34", False),
    ("answer after reasoning", "<think>maybe 35</think>\n\nAnswer: 34", "34", True),
    ("only closing think tag (2507 template)", "maybe Answer: 35 ...</think>\n\nAnswer: 34", "34", True),
    ("still inside reasoning", "<think>Answer: 34 so far", "34", False),
    (
        "answer only in a tool output",
        "<tool_response>\nAnswer: 34\n\\boxed{34}\n</tool_response>\nNot sure.",
        "34",
        False,
    ),
    (
        "answer inside a tool call",
        '<tool_call>{"arguments": {"code": "print(\'Answer: 34\')"}}</tool_call>',
        "34",
        False,
    ),
]


@pytest.mark.parametrize(
    ("final_text", "label", "correct"),
    [row[1:] for row in TRICKY_ANSWERS],
    ids=[row[0] for row in TRICKY_ANSWERS],
)
async def test_tricky_answers(final_text: str, label: str, correct: bool) -> None:
    sample = make_sample(final_text, label=label)
    reward = await reward_func(None, sample, config=NO_SHAPING)
    assert reward == (1.0 if correct else -1.0)
    assert sample.metadata["reward_details"]["acc"] is correct


async def test_answer_only_in_a_tool_output_scores_wrong() -> None:
    response = (
        turn("assistant", '<tool_call>\n{"name": "python", "arguments": {"code": "print(34)"}}\n</tool_call>')
        + turn("user", "<tool_response>\nAnswer: 34\n\\boxed{34}\n</tool_response>")
        + "<|im_start|>assistant\n<think>done</think>\nI am not sure."
    )
    sample = make_sample(response=response)  # no final_text: the fallback reads the last assistant turn
    assert await reward_func(None, sample, config=NO_SHAPING) == -1.0
    assert sample.metadata["reward_details"]["reason"] == "no_answer"
    # And the same answer in the final assistant turn does count.
    sample = make_sample(response=response.replace("I am not sure.", "Answer: 34<|im_end|>"))
    assert await reward_func(None, sample, config=NO_SHAPING) == 1.0


async def test_final_text_wins_over_the_response() -> None:
    sample = make_sample("Answer: 35", response="<|im_start|>assistant\nAnswer: 34")
    assert await reward_func(None, sample, config=NO_SHAPING) == -1.0


def test_scoring_text_fallbacks() -> None:
    assert scoring_text(make_sample("<think>a</think>b")) == "b"
    assert scoring_text(make_sample("<think>unfinished")) == ""
    assert scoring_text(make_sample("x</think>y</think>z")) == "z"
    no_markers = "Step one.<tool_response>Answer: 1</tool_response> Answer: 2"
    assert scoring_text(make_sample(response=no_markers)) == "Step one. Answer: 2"
    truncated_tool_output = "Answer: 2 <tool_response>Answer: 1 and the output was cut"
    assert scoring_text(make_sample(response=truncated_tool_output)) == "Answer: 2 "
    assert scoring_text(SimpleNamespace()) == ""
    assert scoring_text(make_sample(response=None)) == ""


@pytest.mark.parametrize(
    ("tool_iterations", "expected"), [(0, -1.1), (1, -1.05), (2, -1.0), (5, -0.85), (10, -0.6), (25, -0.6)]
)
async def test_strands_example_shaping_of_wrong_answers(tool_iterations: int, expected: float) -> None:
    sample = make_sample("Answer: 35", tool_iterations=tool_iterations)
    assert await reward_func(None, sample, config=STRANDS_SHAPING) == pytest.approx(expected)
    assert sample.metadata["raw_reward"] == -1.0  # what slime logs stays the unshaped DAPO score


async def test_correct_answers_are_never_shaped() -> None:
    sample = make_sample("Answer: 34", tool_iterations=0)
    assert await reward_func(None, sample, config=STRANDS_SHAPING) == 1.0


async def test_evaluation_samples_are_never_shaped() -> None:
    sample = make_sample("Answer: 35", tool_iterations=0, evaluation=True)
    assert await reward_func(None, sample, config=STRANDS_SHAPING) == -1.0
    assert sample.metadata["reward_details"]["evaluation"] is True


async def test_shaping_needs_a_tool_count() -> None:
    assert await reward_func(None, make_sample("Answer: 35"), config=STRANDS_SHAPING) == -1.0
    for junk in (None, "3", True, float("nan"), [1]):
        sample = make_sample("Answer: 35", tool_iterations=junk)
        assert await reward_func(None, sample, config=STRANDS_SHAPING) == -1.0


async def test_slime_example_tool_iters_attribute_is_a_fallback() -> None:
    sample = make_sample("Answer: 35")
    sample.tool_iters = 5
    assert await reward_func(None, sample, config=STRANDS_SHAPING) == pytest.approx(-0.85)


async def test_linear_shaping_and_tool_calls_counter() -> None:
    config = RewardConfig(
        shaping="linear",
        shaping_count="tool_calls",
        linear_per_iteration=0.1,
        linear_baseline_iterations=1,
        linear_cap=-0.5,
    )
    assert await reward_func(
        None, make_sample("Answer: 35", tool_calls=3, tool_iterations=0), config=config
    ) == (pytest.approx(-0.8))
    assert await reward_func(None, make_sample("Answer: 35", tool_calls=99), config=config) == -0.5


def test_shape_reward_clamps_huge_counts() -> None:
    assert shape_reward(-1.0, False, 10**6, STRANDS_SHAPING) == -0.6
    assert shape_reward(-1.0, False, 3, NO_SHAPING) == -1.0


async def test_custom_reward_values() -> None:
    config = RewardConfig(correct_reward=1.0, incorrect_reward=0.0, shaping="none")
    assert await reward_func(None, make_sample("Answer: 35"), config=config) == 0.0


async def test_dict_output_for_reward_key() -> None:
    sample = make_sample("Answer: \\boxed{34}", tool_iterations=3)
    result = await reward_func(SimpleNamespace(reward_key="score"), sample, config=STRANDS_SHAPING)
    assert isinstance(result, dict)
    assert result["score"] == 1.0 and result["acc"] is True and result["pred"] == "34"
    assert result["reason"] == "correct" and result["tool_iterations"] == 3


async def test_dict_output_adds_an_unknown_reward_key() -> None:
    args = SimpleNamespace(reward_key=None, eval_reward_key="reward")
    result = await reward_func(args, make_sample("Answer: 35", evaluation=True), config=STRANDS_SHAPING)
    assert isinstance(result, dict) and result["reward"] == result["score"] == -1.0
    # A training sample under the same args: no --reward-key, so a float.
    assert await reward_func(args, make_sample("Answer: 35"), config=NO_SHAPING) == -1.0


async def test_output_can_be_forced() -> None:
    as_dict = await reward_func(None, make_sample("Answer: 34"), config=RewardConfig(output="dict"))
    assert isinstance(as_dict, dict) and as_dict["score"] == 1.0
    as_float = await reward_func(
        SimpleNamespace(reward_key="score"), make_sample("Answer: 34"), config=RewardConfig(output="float")
    )
    assert as_float == 1.0


async def test_a_list_of_samples_gets_a_list_in_order() -> None:
    samples = [make_sample("Answer: 34"), make_sample("Answer: 35", tool_iterations=5), make_sample("")]
    assert await reward_func(None, samples, config=STRANDS_SHAPING) == [1.0, pytest.approx(-0.85), -1.0]
    assert await reward_func(None, [], config=STRANDS_SHAPING) == []


async def test_details_are_left_on_the_sample() -> None:
    sample = make_sample("Answer: 35", tool_iterations=2)
    await reward_func(None, sample, config=STRANDS_SHAPING)
    assert sample.metadata["raw_reward"] == -1.0
    assert sample.metadata["tool_iterations"] == 2  # the dataset's and generate's keys are kept
    details = sample.metadata["reward_details"]
    assert (details["acc"], details["pred"], details["score"], details["shaped"]) == (
        False,
        "35",
        -1.0,
        False,
    )
    # A sample without metadata gets a fresh dict.
    bare = SimpleNamespace(response="Answer: 34", label="34", metadata=None)
    assert await reward_func(None, bare, config=NO_SHAPING) == 1.0
    assert bare.metadata["reward_details"]["acc"] is True


async def test_default_config_when_args_are_none() -> None:
    # No shaping by default: a wrong answer is -1 whatever the tool use.
    assert await reward_func(None, make_sample("Answer: 35", tool_iterations=5)) == -1.0


def test_reward_config_rejects_bad_input() -> None:
    with pytest.raises(ValidationError, match="extra"):
        RewardConfig(shapping="none")  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="only apply with shaping: linear"):
        RewardConfig(linear_cap=-0.5)
    with pytest.raises(ValidationError):
        RewardConfig(shaping="exponential")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        RewardConfig(math_verify_timeout_s=0)
    with pytest.raises(ValidationError):
        RewardConfig(answer_window=0)
    assert RewardConfig.model_validate({"shaping": "linear", "linear_cap": -0.7}).linear_cap == -0.7


def test_slime_loads_it_by_dotted_path() -> None:
    for path in ("strands_slime.reward_func", "strands_slime.reward.dapo.reward_func"):
        module_name, _, attr = path.rpartition(".")
        assert getattr(importlib.import_module(module_name), attr) is reward_func
    assert strands_slime.reward_func is reward_func


class ExplodingSample:
    """A sample whose every attribute access fails: the reward must still answer."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"boom: {name}")


async def test_a_broken_sample_gets_incorrect_reward_instead_of_an_exception(caplog) -> None:
    assert await reward_func(None, ExplodingSample(), config=STRANDS_SHAPING) == -1.0
    assert "scoring failed" in caplog.text


def _weird_values() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.text(max_size=300),
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
        st.lists(st.text(max_size=5), max_size=3),
        st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
    )


_answer_like = st.lists(
    st.sampled_from(
        [
            "Answer:",
            " 34",
            "\\boxed{",
            "}",
            "{",
            "$",
            "<think>",
            "</think>",
            "<tool_response>",
            "\\frac",
            "1,0",
            "\n",
        ]
    )
    | st.text(max_size=8),
    max_size=25,
).map("".join)


@pytest.mark.slow  # 8 s
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    final_text=st.one_of(_answer_like, _weird_values()),
    response=st.one_of(_answer_like, _weird_values()),
    label=_weird_values(),
    metadata_extra=st.dictionaries(
        st.sampled_from(["tool_iterations", "tool_calls", "evaluation", "final_text"]),
        _weird_values(),
        max_size=4,
    ),
    reward_key=st.sampled_from([None, "score", "acc", "other"]),
)
async def test_never_raises_on_any_input(
    final_text: Any, response: Any, label: Any, metadata_extra: dict[str, Any], reward_key: str | None
) -> None:
    sample = SimpleNamespace(
        response=response, label=label, metadata={"final_text": final_text, **metadata_extra}
    )
    config = RewardConfig(math_verify=False)
    result = await reward_func(SimpleNamespace(reward_key=reward_key), sample, config=config)
    score = result[reward_key] if reward_key is not None else result
    if reward_key in (None, "score", "other"):
        assert isinstance(score, float) and math.isfinite(score)
        assert -1.1 <= score <= 1.0


@pytest.mark.integration
@needs_math_verify
@settings(max_examples=40, deadline=None)
@given(final_text=_answer_like, label=st.sampled_from(["34", "\\frac{1}{2}", "x+1", "", "\\sqrt{2}"]))
async def test_never_raises_with_math_verify(final_text: str, label: str) -> None:
    result = await reward_func(
        None, make_sample(final_text, label=label), config=RewardConfig(shaping="none")
    )
    assert result in (1.0, -1.0)


@pytest.mark.integration
@needs_math_verify
async def test_math_verify_equivalence_through_reward_func() -> None:
    sample = make_sample("Answer: \\sqrt{1156}")
    assert await reward_func(None, sample, config=NO_SHAPING) == 1.0
    assert sample.metadata["reward_details"]["method"] == "math_verify"
    disabled = RewardConfig(shaping="none", math_verify=False)
    assert await reward_func(None, make_sample("Answer: \\sqrt{1156}"), config=disabled) == -1.0


async def test_config_comes_from_the_rollout_config() -> None:
    """Without ``config=``, reward_func reads the ``reward:`` section through strands_slime.config."""
    config_module = pytest.importorskip("strands_slime.config")
    args = SimpleNamespace(
        **{config_module.CONFIG_KEY: {"reward": {"shaping": "strands_example", "output": "dict"}}}
    )
    result = await reward_func(args, make_sample("Answer: 35", tool_iterations=0))
    assert isinstance(result, dict) and result["score"] == pytest.approx(-1.1) and result["shaped"] is True
    assert await reward_func(SimpleNamespace(), make_sample("Answer: 35", tool_iterations=0)) == -1.0


def _grpo_advantages(rewards: list[float]) -> list[float]:
    """slime's GRPO group normalisation (slime/ray/rollout.py, _post_process_rewards): (r - mean) / (std + 1e-6)."""
    import statistics

    mean = statistics.fmean(rewards)
    std = statistics.stdev(rewards)  # torch's Tensor.std is the unbiased estimate too
    return [(r - mean) / (std + 1e-6) for r in rewards]


async def test_shaping_is_off_by_default_because_grpo_inflates_it() -> None:
    """The worked example of docs/reward.md: an all-wrong group with tool counts 0..5."""
    assert RewardConfig().shaping == "none"
    samples = []
    for tools_used in range(6):
        sample = make_sample("Answer: 35")
        sample.metadata["tool_iterations"] = tools_used
        samples.append(sample)
    shaped = [await reward_func(None, s, config=STRANDS_SHAPING) for s in samples]
    assert shaped == pytest.approx([-1.1, -1.05, -1.0, -0.95, -0.9, -0.85])
    advantages = _grpo_advantages(shaped)
    # Wrong answers get full-size advantages, the one with 5 tool calls a positive one larger than any
    # wrong answer gets in a group where one sample is right.
    assert advantages == pytest.approx([-1.336, -0.802, -0.267, 0.267, 0.802, 1.336], abs=1e-3)
    mixed = _grpo_advantages([1.0, -1.0, -1.0, -1.0, -1.0, -1.0])
    assert mixed == pytest.approx([2.041, -0.408, -0.408, -0.408, -0.408, -0.408], abs=1e-3)
    assert advantages[-1] > 0 > mixed[1]
    # Unshaped, the same group is all -1: zero spread, zero advantage (and dynamic sampling drops it).
    unshaped = [await reward_func(None, s, config=RewardConfig()) for s in samples]
    assert unshaped == [-1.0] * 6


# ----------------------------------------------------------------------------- overlong punishment

BUDGET = SimpleNamespace(rollout_max_response_len=32768)
DAPO_OVERLONG = RewardConfig(overlong_buffer_tokens=4096)


def long_sample(final_text: str, response_length: int, **metadata: Any) -> SimpleNamespace:
    sample = make_sample(final_text, **metadata)
    sample.response_length = response_length
    return sample


@pytest.mark.parametrize(
    ("response_length", "penalty"),
    [
        (1_000, 0.0),
        (28_672, 0.0),  # the budget minus the 4,096-token buffer: not yet
        (28_673, -1 / 4096),
        (30_720, -0.5),  # halfway into the buffer
        (32_768, -1.0),  # at the budget (cut off)
        (40_000, -1.0),  # never more than the whole penalty
    ],
)
async def test_dapo_soft_overlong_punishment(response_length: int, penalty: float) -> None:
    right = await reward_func(BUDGET, long_sample("Answer: 34", response_length), config=DAPO_OVERLONG)
    wrong = await reward_func(BUDGET, long_sample("", response_length), config=DAPO_OVERLONG)
    assert right == pytest.approx(1.0 + penalty) and wrong == pytest.approx(-1.0 + penalty)


async def test_overlong_punishment_is_recorded_and_never_touches_accuracy_or_eval() -> None:
    sample = long_sample("Answer: 34", 30_720)
    await reward_func(BUDGET, sample, config=DAPO_OVERLONG)
    details = sample.metadata["reward_details"]
    assert details["overlong_penalty"] == pytest.approx(-0.5) and details["shaped"] is True
    # slime's raw_reward (passrate logs, the dynamic-sampling filter) stays the verdict
    assert sample.metadata["raw_reward"] == 1.0 and details["acc"] is True
    evaluated = long_sample("Answer: 34", 32_768, evaluation=True)
    assert await reward_func(BUDGET, evaluated, config=DAPO_OVERLONG) == 1.0
    assert evaluated.metadata["reward_details"]["overlong_penalty"] == 0.0


async def test_overlong_punishment_needs_a_length_and_a_budget_and_can_be_turned_off() -> None:
    assert await reward_func(None, long_sample("Answer: 34", 32_768), config=DAPO_OVERLONG) == 1.0
    assert await reward_func(BUDGET, make_sample("Answer: 34"), config=DAPO_OVERLONG) == 1.0
    assert RewardConfig().overlong_buffer_tokens is None, "off unless the rollout config asks"
    assert await reward_func(BUDGET, long_sample("Answer: 34", 32_768), config=NO_SHAPING) == 1.0
    milder = RewardConfig(overlong_buffer_tokens=8192, overlong_penalty=0.5)
    assert await reward_func(BUDGET, long_sample("Answer: 34", 28_672), config=milder) == pytest.approx(0.75)
    with pytest.raises(ValidationError):
        RewardConfig(overlong_buffer_tokens=0)
    with pytest.raises(ValidationError):
        RewardConfig(overlong_penalty=-1)


async def test_overlong_punishment_adds_to_shaping_of_wrong_answers() -> None:
    sample = long_sample("Answer: 35", 30_720, tool_iterations=5)
    both = RewardConfig(shaping="strands_example", overlong_buffer_tokens=4096)
    assert await reward_func(BUDGET, sample, config=both) == pytest.approx(-0.85 - 0.5)


@pytest.mark.parametrize(("budget", "every"), [(1_024, True), (6_000, False)])
async def test_a_buffer_that_punishes_every_sample_stops_the_reward_in_one_line(
    budget: int, every: bool
) -> None:
    # The recipe's 4,096-token buffer against a 1,024-token budget: a right answer scored 0.19, a wrong
    # one -1.77. Refused, never scored.
    args = SimpleNamespace(rollout_max_response_len=budget)
    with pytest.raises(ConfigError) as refused:
        await reward_func(args, long_sample("Answer: 34", 10), config=DAPO_OVERLONG)
    (line,) = str(refused.value).splitlines()
    assert "reward.overlong_buffer_tokens (4096) must be at most half" in line
    assert f"--rollout-max-response-len ({budget})" in line
    assert ("so every response" in line) is every
    assert (
        await reward_func(
            SimpleNamespace(rollout_max_response_len=8_192), make_sample("Answer: 34"), config=DAPO_OVERLONG
        )
        == 1.0
    )
