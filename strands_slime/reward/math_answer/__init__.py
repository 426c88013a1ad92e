"""Extract and judge final answers to math problems (DAPO-math / AIME style).

Three parts, along the way an answer is scored:

* :mod:`.normalize` — slime's DAPO normalisation (Minerva rules), exact numbers, labels;
* :mod:`.verify` — math-verify in warm worker processes with a hard deadline;
* :mod:`.judge` — reading ``Answer: ...`` / ``\\boxed{...}`` from the final text and the verdict
  (string, then number, then math-verify).

Every public name is importable from ``strands_slime.reward.math_answer``.
"""

from __future__ import annotations

from strands_slime.reward.math_answer.judge import (
    AnswerCheck,
    check_answer,
    check_answer_async,
    extract_answer_line,
    extract_last_boxed,
)
from strands_slime.reward.math_answer.normalize import normalize_final_answer, normalize_label, parse_number
from strands_slime.reward.math_answer.verify import (
    MathVerifier,
    VerifyOutcome,
    get_math_verifier,
    math_verify_available,
)

__all__ = [
    "AnswerCheck",
    "MathVerifier",
    "VerifyOutcome",
    "check_answer",
    "check_answer_async",
    "extract_answer_line",
    "extract_last_boxed",
    "get_math_verifier",
    "math_verify_available",
    "normalize_final_answer",
    "normalize_label",
    "parse_number",
]
