"""Answer extraction, normalization, numbers and the math-verify worker (strands_slime.reward.math_answer)."""

from __future__ import annotations

import asyncio
import threading
import time
from fractions import Fraction

import pytest

from strands_slime.reward.math_answer import (
    MathVerifier,
    check_answer,
    check_answer_async,
    extract_answer_line,
    extract_last_boxed,
    get_math_verifier,
    math_verify_available,
    normalize_final_answer,
    normalize_label,
    parse_number,
)

pytestmark = pytest.mark.unit

needs_math_verify = pytest.mark.skipif(not math_verify_available(), reason="math-verify not installed")


@pytest.fixture(scope="module")
def verifier() -> MathVerifier:
    shared = get_math_verifier(timeout_s=5.0, workers=1)
    assert shared is not None
    return shared


# Expected values follow slime's math_dapo_utils.normalize_final_answer (checked against it).
@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("34", "34"),
        (" \\boxed{34}", "34"),
        ("x = 34", "34"),
        ("$34$", "34"),
        ("34 \\text{ cm}", "34"),
        ("34 degrees", "34"),
        ("1,000", "1000"),
        ("1{,}000", "1000"),
        ("\\frac12", "\\frac{1}{2}"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("\\text{(B)}", "(B)"),
        ("**34", "**34"),
        ("34.", "34."),
        ("34<|im_end|>", "34"),
        ("[INVALID]", "[INVALID]"),
    ],
)
def test_normalize_final_answer_matches_slime_rules(raw: str, normalized: str) -> None:
    assert normalize_final_answer(raw) == normalized


def test_extract_answer_line_takes_the_last_line_case_insensitively() -> None:
    assert extract_answer_line("Answer: 1\nanswer : 2 \nmore") == "2 "
    assert extract_answer_line("ANSWER:\n7") == "7"
    assert extract_answer_line("no marker") is None


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("\\boxed{34}", "34"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed{unclosed", None),
        ("nothing", None),
    ],
)
def test_extract_last_boxed_balances_braces(text: str, content: str | None) -> None:
    assert extract_last_boxed(text) == content


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("34", Fraction(34)),
        ("34.0", Fraction(34)),
        ("34.", Fraction(34)),
        (".5", Fraction(1, 2)),
        ("-7", Fraction(-7)),
        ("\u221234", Fraction(-34)),
        ("1,000,000", Fraction(1_000_000)),
        ("1\\,000", Fraction(1000)),
        ("\\frac{3}{4}", Fraction(3, 4)),
        ("-\\dfrac{3}{4}", Fraction(-3, 4)),
        ("3/4", Fraction(3, 4)),
        ("(5)", Fraction(5)),
        ("1,2", None),
        ("1/0", None),
        ("\\frac{1}{0}", None),
        ("2\\sqrt{3}", None),
        ("x", None),
        ("", None),
        ("9" * 65, None),
    ],
)
def test_parse_number(text: str, value: Fraction | None) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize(
    ("label", "normalized"),
    [
        ("34", "34"),
        (34, "34"),
        ("34.0", "34"),
        ("\\boxed{34}", "34"),
        ("-3", "-3"),
        ("\\frac{1}{2}", "\\frac{1}{2}"),
    ],
)
def test_normalize_label(label: object, normalized: str) -> None:
    assert normalize_label(label) == normalized


def test_non_integer_label_does_not_raise_unlike_slime() -> None:
    check = check_answer("Answer: 0.5", "\\frac{1}{2}")
    assert check.correct and check.method == "number"


@pytest.mark.parametrize(
    ("text", "reason", "source"),
    [
        ("Answer: 34", "correct", "answer_line"),
        ("\\boxed{34}", "correct", "boxed"),
        ("**Answer:** \\boxed{34}", "correct", "answer_line"),
        ("Answer: 35", "wrong", "answer_line"),
        ("Answer: \\boxed{34}\n\\boxed{35}", "conflict", "answer_line"),
        ("Answer: 35\n\\boxed{34}", "conflict", "answer_line"),
        ("I am not sure.", "no_answer", None),
    ],
)
def test_check_answer_reasons(text: str, reason: str, source: str | None) -> None:
    check = check_answer(text, "34")
    assert (check.reason, check.source) == (reason, source)
    assert check.correct is (reason == "correct")


def test_conflicts_can_be_allowed() -> None:
    assert check_answer("Answer: 35\n\\boxed{34}", "34", reject_conflicting_answers=False).correct


def test_windows_limit_where_answers_are_read() -> None:
    far = "Answer: 34\n" + "x" * 400
    assert check_answer(far, "34").reason == "no_answer"
    assert check_answer(far, "34", answer_window=1000).correct
    box_then_text = "\\boxed{34}" + " filler" * 20
    assert not check_answer(box_then_text, "34").correct
    assert check_answer(box_then_text, "34", strict_box_window=300).correct


def test_missing_label_is_never_correct() -> None:
    for label in (None, "", "   "):
        check = check_answer("Answer: 34", label)
        assert not check.correct and check.reason == "no_label"


@pytest.mark.integration
@needs_math_verify
def test_math_verify_decides_what_strings_and_numbers_cannot(verifier: MathVerifier) -> None:
    sqrt = check_answer("Answer: \\sqrt{1156}", "34", verifier=verifier)
    assert sqrt.correct and sqrt.method == "math_verify" and sqrt.math_verify == "equal"
    hedge = check_answer("Answer: 34 or 35", "34", verifier=verifier)
    assert not hedge.correct and hedge.math_verify == "different"
    assert not check_answer("Answer: 2\\sqrt{3}", "34", verifier=verifier).correct
    # Without a verifier the same answer is simply not accepted.
    assert check_answer("Answer: \\sqrt{1156}", "34").reason == "wrong"


@pytest.mark.integration
@needs_math_verify
async def test_async_check_runs_math_verify_off_the_event_loop(verifier: MathVerifier) -> None:
    verifier.warm_up()
    loop_thread = threading.get_ident()
    threads: list[int] = []
    original = verifier._check

    def spy(gold: str, pred: str):
        threads.append(threading.get_ident())
        return original(gold, pred)

    verifier._check = spy  # type: ignore[method-assign]
    try:
        check = await check_answer_async("Answer: 17+17", "34", verifier=verifier)
    finally:
        del verifier._check
    assert check.correct and check.method == "math_verify"
    assert threads and loop_thread not in threads


@pytest.mark.integration
@needs_math_verify
async def test_hung_sympy_is_killed_at_the_deadline_and_the_loop_stays_live() -> None:
    verifier = MathVerifier(timeout_s=0.5, workers=1)
    try:
        assert verifier.warm_up()
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticking = asyncio.create_task(ticker())
        started = time.monotonic()
        check = await check_answer_async("Answer: 10^{10^{10}}", "34", verifier=verifier)
        elapsed = time.monotonic() - started
        ticking.cancel()
        assert not check.correct and check.math_verify == "timeout"
        assert 0.45 < elapsed < 3.0
        assert ticks >= 20  # the loop kept running while the worker was stuck
        assert verifier.stats["timeouts"] == 1
        # The killed worker is replaced on the next check, and the timeout verdict is cached.
        assert verifier.verify_blocking("34", "\\sqrt{1156}") == "equal"
        assert verifier.verify_blocking("34", "10^{10^{10}}") == "timeout"
        assert verifier.stats["worker_starts"] == 2
    finally:
        verifier.close()
    assert verifier.verify_blocking("1", "1") == "unavailable"


def test_verifier_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        MathVerifier(timeout_s=0)
    with pytest.raises(ValueError, match="workers"):
        MathVerifier(workers=0)
