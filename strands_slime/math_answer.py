"""Extract and judge final answers to math problems (DAPO-math / AIME style).

Two extraction modes, with slime's DAPO semantics:

* Minerva: the last ``Answer: ...`` line in the last ``answer_window`` characters, normalized the
  way slime's ``math_dapo_utils.normalize_final_answer`` does (same substitutions and removals).
* strict: the content of the last ``\\boxed{...}`` in the last ``strict_box_window`` characters.

An answer is correct when either mode's answer is equivalent to the label, where equivalence is tried
cheapest first: normalized string equality, exact rational equality (``34.0`` = ``34``, ``0.5`` =
``\\frac{1}{2}``, ``1,000`` = ``1000``), then math-verify in a separate worker process with a hard
deadline (math-verify's own timeouts use ``signal.alarm``, which only works on a main thread, and
sympy can hang on inputs like ``10^{10^{10}}``).

Run as ``python -m strands_slime.math_answer --worker`` it is that worker: JSON lines on stdin/stdout.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Literal

from strands_slime.runtime import get_runtime

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

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------
# slime-compatible normalization (Minerva / lm-eval-harness rules, as used by slime's DAPO scorer)
# ----------------------------------------------------------------------------------------------

# Plain-text replacements applied in order, then fragments deleted in order. These lists are the
# normalization contract of slime's DAPO reward; keep them in this order so our "pred" matches.
_REPLACEMENTS: tuple[tuple[str, str], ...] = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_DELETIONS: tuple[str, ...] = (
    *("square ways integers dollars mph inches hours km units \\ldots sue points feet minutes".split()),
    *("digits cents degrees cm gm pounds meters meals edges students childrentickets multiples".split()),
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
    "<|im_end|>",
    "<|endoftext|>",
)
_NORMALIZE_CACHE_SIZE = 16384
_DOLLAR_PAIR_LINE = re.compile(r"(.*?)(\$)(.*?)(\$)(.*)")
_TEXT_WRAPPERS = tuple(re.compile(rf"(\\{name}\{{)(.*?)(\}})") for name in ("text", "textbf", "overline"))
_BOXED_GREEDY = re.compile(r"(\\boxed\{)(.*)(\})")
_FRAC_SHORTHAND = re.compile(r"(frac)([^{])(.)")
_SQRT_SHORTHAND = re.compile(r"(sqrt)([^{])")


def normalize_final_answer(answer: str) -> str:
    """Normalize an answer string exactly as slime's DAPO scorer does (so our ``pred`` matches its logs)."""
    return _normalize_cached(str(answer))


@functools.lru_cache(maxsize=_NORMALIZE_CACHE_SIZE)
def _normalize_cached(text: str) -> str:
    """About 17 µs uncached; a GRPO group repeats its label and usually its answers, so cache it."""
    text = text.split("=")[-1]
    for before, after in _REPLACEMENTS:
        text = text.replace(before, after)
    for fragment in _DELETIONS:
        text = text.replace(fragment, "")
    text = _DOLLAR_PAIR_LINE.sub(r"$\3$", text)
    for wrapper in _TEXT_WRAPPERS:
        text = wrapper.sub(r"\2", text)
    text = _BOXED_GREEDY.sub(r"\2", text)
    text = _FRAC_SHORTHAND.sub(r"frac{\2}{\3}", text)
    text = _SQRT_SHORTHAND.sub(r"sqrt{\2}", text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


# ----------------------------------------------------------------------------------------------
# Extraction
# ----------------------------------------------------------------------------------------------

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


# Markdown emphasis and sentence punctuation around an otherwise valid answer ("**34**", "34.").
_DECORATION = "*_ \t."
_UNICODE_MINUS = str.maketrans({"\u2212": "-", "\u2013": "-", "\ufe63": "-", "\uff0d": "-"})


def _clean(normalized: str) -> str:
    cleaned = normalized.translate(_UNICODE_MINUS).strip(_DECORATION)
    # Keep a leading "." of ".5" and a decimal point inside numbers; only trailing dots were stripped.
    if normalized.lstrip("*_ \t").startswith(".") and not cleaned.startswith("."):
        cleaned = "." + cleaned
    return cleaned


# ----------------------------------------------------------------------------------------------
# Numbers
# ----------------------------------------------------------------------------------------------

_MAX_NUMBER_CHARS = 64
_NUMBER_SEPARATORS = re.compile(r"\\[,!;: ]|~|\{,\}|\\thinspace|\u2009|\u202f")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_THOUSANDS_NUMBER = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_LATEX_FRACTION = re.compile(r"([+-]?)\\[dt]?frac\{([+-]?[\d.]+)\}\{([+-]?[\d.]+)\}")
_SLASH_FRACTION = re.compile(r"([+-]?[\d.]+)/([+-]?[\d.]+)")


def parse_number(text: str) -> Fraction | None:
    """The exact rational value of a plain number, thousands-separated number or simple fraction.

    ``"34.0"``, ``"1,000"``, ``"-\\frac{3}{4}"``, ``"3/4"`` and ``"0.75"`` parse; anything else (an
    expression, a list, text, a zero denominator, more than 64 characters) gives None.
    """
    return _parse_number_cached(str(text))


@functools.lru_cache(maxsize=_NORMALIZE_CACHE_SIZE)
def _parse_number_cached(text: str) -> Fraction | None:
    if text.isascii() and text.isdigit() and len(text) <= _MAX_NUMBER_CHARS:
        return Fraction(int(text))  # the common case (AIME/DAPO integers), 5x faster than parsing a string
    text = _NUMBER_SEPARATORS.sub("", text.translate(_UNICODE_MINUS)).strip()
    if not text or len(text) > _MAX_NUMBER_CHARS:
        return None
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1].strip()
    try:
        if _PLAIN_NUMBER.fullmatch(text):
            return Fraction(text)
        if _THOUSANDS_NUMBER.fullmatch(text):
            return Fraction(text.replace(",", ""))
        match = _LATEX_FRACTION.fullmatch(text) or _SLASH_FRACTION.fullmatch(text)
        if match is None:
            return None
        groups = match.groups()
        sign = -1 if len(groups) == 3 and groups[0] == "-" else 1
        numerator, denominator = (Fraction(part) for part in groups[-2:])
        if denominator == 0:
            return None
        return sign * numerator / denominator
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def normalize_label(label: object) -> str:
    """The label in the form answers are compared against: normalized, integers as ``str(int)``.

    slime's scorer does ``str(int(float(normalize(gt))))`` and raises on non-integer labels; here an
    integer-valued label becomes its integer string and any other label stays normalized.
    """
    if label is None:
        return ""
    return _normalize_label_cached(str(label))


@functools.lru_cache(maxsize=_NORMALIZE_CACHE_SIZE)
def _normalize_label_cached(label: str) -> str:
    normalized = _clean(normalize_final_answer(label))
    value = parse_number(normalized)
    if value is not None and value.denominator == 1:
        return str(value.numerator)
    return normalized


# ----------------------------------------------------------------------------------------------
# math-verify in a worker process with a hard deadline
# ----------------------------------------------------------------------------------------------

VerifyOutcome = Literal["equal", "different", "timeout", "error", "unavailable"]
_STARTUP_TIMEOUT_S = 120.0
_CACHE_SIZE = 8192
_RETRY_START_AFTER_S = 60.0


@functools.cache
def math_verify_available() -> bool:
    """Whether the optional ``math-verify`` package is importable (``pip install 'strands-slime[verify]'``).

    Cached: ``find_spec`` costs ~75 µs, more than scoring an answer.
    """
    return importlib.util.find_spec("math_verify") is not None


def _as_latex(text: str) -> str:
    """Wrap bare answers in ``$...$`` so math-verify reads ``34 or 35`` as a set, not as ``34``."""
    stripped = text.strip()
    if "$" in stripped or "\\(" in stripped or "\\[" in stripped:
        return stripped
    return f"${stripped}$"


class _WorkerProcess:
    """One ``python -m strands_slime.math_answer --worker`` child speaking JSON lines."""

    def __init__(self) -> None:
        package_root = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "strands_slime.math_answer", "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        self._buffer = b""
        try:
            line = self._read_line(time.monotonic() + _STARTUP_TIMEOUT_S)
            hello = (
                json.loads(line) if line is not None else {"error": "no answer before the start-up timeout"}
            )
            if not hello.get("ready"):
                raise RuntimeError(f"math-verify worker failed to start: {hello.get('error')}")
        except BaseException:
            self.kill()
            raise

    def _read_line(self, deadline: float) -> str | None:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError("math-verify worker exited")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def request(self, gold: str, pred: str, timeout_s: float) -> VerifyOutcome:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"gold": gold, "pred": pred}).encode() + b"\n")
        self.process.stdin.flush()
        line = self._read_line(time.monotonic() + timeout_s)
        if line is None:
            return "timeout"
        reply = json.loads(line)
        if "error" in reply:
            return "error"
        return "equal" if reply["equal"] else "different"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


class MathVerifier:
    """math-verify equivalence checks in warm worker processes, each with a hard deadline.

    At most ``workers`` child processes exist; each serves one check at a time from this verifier's
    own threads. A check that exceeds ``timeout_s`` kills its worker (the next check starts a fresh
    one) and counts as not equivalent. Results are cached: a GRPO group often repeats an answer.
    ``verify`` is async and never blocks the event loop; ``verify_blocking`` is for threads/scripts.
    """

    def __init__(self, timeout_s: float = 2.0, workers: int = 1) -> None:
        if not timeout_s > 0 or workers < 1:
            raise ValueError(f"need timeout_s > 0 and workers >= 1, got {timeout_s=} {workers=}")
        self.timeout_s = timeout_s
        self.workers = workers
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="math-verify")
        self._local = threading.local()
        self._lock = threading.Lock()
        self._live: set[_WorkerProcess] = set()
        self._cache: OrderedDict[tuple[str, str], VerifyOutcome] = OrderedDict()
        self._disabled_until = 0.0
        self._closed = False
        self.stats = {"checks": 0, "cache_hits": 0, "timeouts": 0, "errors": 0, "worker_starts": 0}

    def _cached(self, key: tuple[str, str]) -> VerifyOutcome | None:
        with self._lock:
            self.stats["checks"] += 1
            if self._closed or time.monotonic() < self._disabled_until:
                return "unavailable"
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self.stats["cache_hits"] += 1
            return cached

    def verify_blocking(self, gold: str, pred: str) -> VerifyOutcome:
        """Whether ``pred`` is mathematically equivalent to ``gold``; blocks for at most ~timeout_s."""
        cached = self._cached((gold, pred))
        if cached is not None:
            return cached
        try:
            return self._executor.submit(self._check, gold, pred).result()
        except RuntimeError:  # closed concurrently
            return "unavailable"

    async def verify(self, gold: str, pred: str) -> VerifyOutcome:
        """Async ``verify_blocking``: runs on this verifier's own threads, never on the event loop."""
        cached = self._cached((gold, pred))
        if cached is not None:
            return cached
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._check, gold, pred)
        except RuntimeError:  # closed concurrently
            return "unavailable"

    def warm_up(self) -> bool:
        """Start a worker now (otherwise the first check pays ~1 s); True when math-verify works."""
        return self.verify_blocking("1", "1") == "equal"

    def _check(self, gold: str, pred: str) -> VerifyOutcome:
        outcome = self._run_in_worker(_as_latex(gold), _as_latex(pred))
        with self._lock:
            if outcome in ("timeout", "error"):
                self.stats["timeouts" if outcome == "timeout" else "errors"] += 1
            if outcome != "unavailable":
                self._cache[(gold, pred)] = outcome
                if len(self._cache) > _CACHE_SIZE:
                    self._cache.popitem(last=False)
        return outcome

    def _run_in_worker(self, gold: str, pred: str) -> VerifyOutcome:
        worker: _WorkerProcess | None = getattr(self._local, "worker", None)
        if worker is None or worker.process.poll() is not None:
            if worker is not None:
                self._retire(worker)
            worker = self._start_worker()
            if worker is None:
                return "unavailable"
        try:
            outcome = worker.request(gold, pred, self.timeout_s)
        except (OSError, EOFError, ValueError, KeyError) as error:
            logger.warning("math-verify worker failed (%s); it will be restarted", error)
            self._retire(worker)
            return "error"
        if outcome == "timeout":
            self._retire(worker)
        return outcome

    def _start_worker(self) -> _WorkerProcess | None:
        try:
            worker = _WorkerProcess()
        except (OSError, RuntimeError, EOFError, ValueError) as error:
            with self._lock:
                self._disabled_until = time.monotonic() + _RETRY_START_AFTER_S
            logger.warning("math-verify unavailable for %.0f s: %s", _RETRY_START_AFTER_S, error)
            return None
        with self._lock:
            self.stats["worker_starts"] += 1
            if self._closed:
                worker.kill()
                return None
            self._live.add(worker)
        self._local.worker = worker
        return worker

    def _retire(self, worker: _WorkerProcess) -> None:
        worker.kill()
        with self._lock:
            self._live.discard(worker)
        self._local.worker = None

    def close(self) -> None:
        """Kill the workers; later checks answer ``unavailable``."""
        with self._lock:
            self._closed = True
            workers, self._live = list(self._live), set()
        for worker in workers:
            worker.kill()
        self._executor.shutdown(wait=False, cancel_futures=True)


def get_math_verifier(timeout_s: float = 2.0, workers: int = 1) -> MathVerifier | None:
    """The shared verifier for these settings (kept by the runtime), or None when math-verify isn't
    installed.

    Raises:
        ValueError: ``timeout_s`` is not positive or ``workers`` is below 1.
    """
    if not math_verify_available():
        return None
    key = ("math-verify", float(timeout_s), int(workers))
    runtime = get_runtime()
    with runtime.lock:  # creating one starts no process (workers start on the first check)
        verifier = runtime.verifiers.get(key)
        if verifier is None:
            verifier = runtime.verifiers[key] = MathVerifier(timeout_s=timeout_s, workers=workers)
        return verifier


def _worker_main() -> None:
    """Serve math-verify checks: one JSON request per stdin line, one JSON reply per stdout line."""
    logging.disable(logging.WARNING)  # math-verify warns on every call when its own timeouts are off
    out = sys.stdout
    try:
        from math_verify import parse, verify
    except Exception as error:  # report any import failure to the parent instead of dying silently
        out.write(json.dumps({"ready": False, "error": f"{type(error).__name__}: {error}"}) + "\n")
        out.flush()
        return
    verify(parse("$1$", parsing_timeout=None), parse("$1$", parsing_timeout=None), timeout_seconds=None)
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            gold = parse(request["gold"], parsing_timeout=None)
            pred = parse(request["pred"], parsing_timeout=None)
            reply: dict[str, object] = {
                "equal": bool(gold and pred and verify(gold, pred, timeout_seconds=None))
            }
        except Exception as error:  # a bad expression must not take the worker down
            reply = {"error": f"{type(error).__name__}: {error}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


# ----------------------------------------------------------------------------------------------
# Judging an answer
# ----------------------------------------------------------------------------------------------

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
        normalized = _clean(normalize_final_answer(line))
        found.append(_Candidate("answer_line", line.strip(), normalized, parse_number(normalized)))
    boxed = extract_last_boxed(tail[-strict_box_window:])
    if boxed is not None:
        normalized = _clean(normalize_final_answer(boxed))
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
    """Judge ``text`` (the model's final answer text) against ``label``; blocks on math-verify if needed."""
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


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        _worker_main()
    else:
        sys.exit("usage: python -m strands_slime.math_answer --worker  (internal math-verify worker)")
