"""Reading the final answer out of a model's text and judging it against the label.

Two extraction modes, with slime's DAPO semantics: Minerva (the last ``Answer: ...`` line in the last
``answer_window`` characters) and strict (the last ``\\boxed{...}`` in the last ``strict_box_window``
characters). An answer is correct when either mode's answer is equivalent to the label, tried cheapest
first: normalised string equality, exact rational equality, then math-verify (:mod:`.verify`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from strands_slime.reward.math_answer.normalize import (
    clean_answer,
    normalize_final_answer,
    normalize_label,
    parse_number,
)
from strands_slime.reward.math_answer.verify import MathVerifier, VerifyOutcome

__all__ = ["AnswerCheck", "check_answer", "check_answer_async", "extract_answer_line", "extract_last_boxed"]

# Extraction

_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_BOXED_OPEN = "\\boxed{"


def extract_answer_line(text: str) -> str | None:
    """The raw text after the last ``Answer:`` (case-insensitive) up to the end of its line, or None."""
    matches = _ANSWER_LINE.findall(text)
    return matches[-1] if matches else None


def extract_last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` with balanced braces, or None (absent or unclosed)."""
    start = text.rfind(_BOXED_OPEN)
    if start < 0:
        return None
    depth = 0
    for index in range(start + len(_BOXED_OPEN) - 1, len(text)):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start + len(_BOXED_OPEN) : index]
    return None


# Judging an answer

AnswerSource = Literal["answer_line", "boxed"]
MatchMethod = Literal["exact", "number", "math_verify"]


@dataclass(frozen=True)
class AnswerCheck:
    """Verdict on one final text: ``correct`` is DAPO accuracy (acc), ``pred`` the answer read."""

    correct: bool
    pred: str | None
    reason: Literal["correct", "wrong", "no_answer", "conflict", "no_label"]
    source: AnswerSource | None = None
    method: MatchMethod | None = None
    math_verify: VerifyOutcome | None = None


@dataclass(frozen=True)
class _Candidate:
    source: AnswerSource
    raw: str
    normalized: str
    number: Fraction | None


def _candidates(text: str, answer_window: int, strict_box_window: int) -> list[_Candidate]:
    tail = text[-answer_window:]
    found: list[_Candidate] = []
    line = extract_answer_line(tail)
    if line is not None:
        normalized = clean_answer(normalize_final_answer(line))
        found.append(_Candidate("answer_line", line.strip(), normalized, parse_number(normalized)))
    boxed = extract_last_boxed(tail[-strict_box_window:])
    if boxed is not None:
        normalized = clean_answer(normalize_final_answer(boxed))
        found.append(_Candidate("boxed", boxed.strip(), normalized, parse_number(normalized)))
    return [candidate for candidate in found if candidate.normalized]


class _Judgement:
    """Cheap checks now; lists the math-verify pairs still undecided; then the verdict."""

    def __init__(
        self, text: str, label: object, answer_window: int, strict_box_window: int, reject_conflicts: bool
    ) -> None:
        self.label_raw = "" if label is None else str(label).strip()
        self.label = normalize_label(label)
        self.label_number = parse_number(self.label)
        self.reject_conflicts = reject_conflicts
        self.candidates = _candidates(text, answer_window, strict_box_window)
        self.cheap: list[tuple[_Candidate, MatchMethod | None, bool | None]] = []
        for candidate in self.candidates:
            if not self.label:
                self.cheap.append((candidate, None, False))
            elif candidate.normalized == self.label:
                self.cheap.append((candidate, "exact", True))
            elif candidate.number is not None and self.label_number is not None:
                self.cheap.append((candidate, "number", candidate.number == self.label_number))
            else:
                self.cheap.append((candidate, None, None))

    def pending(self) -> list[tuple[str, str]]:
        """(gold, pred) pairs that need math-verify: neither string nor number could decide."""
        return [(self.label_raw, candidate.raw) for candidate, _, verdict in self.cheap if verdict is None]

    def verdict(self, verified: dict[tuple[str, str], VerifyOutcome]) -> AnswerCheck:
        if not self.candidates:
            return AnswerCheck(False, None, "no_answer" if self.label else "no_label")
        first = self.candidates[0]
        if not self.label:
            return AnswerCheck(False, first.normalized, "no_label", first.source)
        accepted: tuple[_Candidate, MatchMethod, VerifyOutcome | None] | None = None
        rejected_numbers: list[Fraction] = []
        last_outcome: VerifyOutcome | None = None
        for candidate, method, verdict in self.cheap:
            outcome: VerifyOutcome | None = None
            if verdict is None:
                outcome = verified.get((self.label_raw, candidate.raw), "unavailable")
                last_outcome = outcome
                verdict, method = outcome == "equal", "math_verify"
            if verdict and accepted is None:
                accepted = (candidate, method or "exact", outcome)
            elif not verdict and candidate.number is not None:
                rejected_numbers.append(candidate.number)
        if accepted is None:
            return AnswerCheck(False, first.normalized, "wrong", first.source, math_verify=last_outcome)
        candidate, method, outcome = accepted
        accepted_value = candidate.number if candidate.number is not None else self.label_number
        if self.reject_conflicts and any(number != accepted_value for number in rejected_numbers):
            # "Answer: 35" with "\boxed{34}": two different numbers; hedging must not pay.
            return AnswerCheck(False, first.normalized, "conflict", first.source, math_verify=last_outcome)
        return AnswerCheck(True, candidate.normalized, "correct", candidate.source, method, outcome)


def check_answer(
    text: str,
    label: object,
    *,
    answer_window: int = 300,
    strict_box_window: int = 100,
    reject_conflicting_answers: bool = True,
    verifier: MathVerifier | None = None,
) -> AnswerCheck:
    """Judge ``text`` (the model's final answer text) against ``label``; blocks on math-verify if needed.

    Args:
        text: the final text (reasoning and tool blocks already removed, see ``reward.scoring_text``).
        label: the reference answer; None or empty gives ``reason="no_label"``.
        answer_window: characters at the end of ``text`` searched for ``Answer: ...``.
        strict_box_window: characters at the end of ``text`` searched for ``\\boxed{...}``.
        reject_conflicting_answers: an ``Answer:`` line and a ``\\boxed{}`` giving different numbers
            score as wrong (``reason="conflict"``).
        verifier: math-verify for what strings and numbers cannot decide; None: not equivalent then.

    Returns:
        The verdict: ``correct`` (DAPO accuracy), the ``pred`` read, why, from where, and how.
    """
    judgement = _Judgement(text, label, answer_window, strict_box_window, reject_conflicting_answers)
    pending = judgement.pending() if verifier is not None else []
    return judgement.verdict({pair: verifier.verify_blocking(*pair) for pair in pending} if verifier else {})


async def check_answer_async(
    text: str,
    label: object,
    *,
    answer_window: int = 300,
    strict_box_window: int = 100,
    reject_conflicting_answers: bool = True,
    verifier: MathVerifier | None = None,
) -> AnswerCheck:
    """``check_answer`` for the event loop: cheap checks inline (µs), math-verify off the loop."""
    judgement = _Judgement(text, label, answer_window, strict_box_window, reject_conflicting_answers)
    pending: Sequence[tuple[str, str]] = judgement.pending() if verifier is not None else []
    verified: dict[tuple[str, str], VerifyOutcome] = {}
    if pending and verifier is not None:
        outcomes = await asyncio.gather(*(verifier.verify(gold, pred) for gold, pred in pending))
        verified = dict(zip(pending, outcomes, strict=True))
    return judgement.verdict(verified)
