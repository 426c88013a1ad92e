"""slime-compatible answer normalisation, exact numbers, and labels.

Minerva / lm-eval-harness rules, as used by slime's DAPO scorer (``math_dapo_utils``): the same
substitutions and removals in the same order, so our ``pred`` matches slime's logs. Numbers are read
exactly (``34.0`` = ``34``, ``0.5`` = ``\\frac{1}{2}``, ``1,000`` = ``1000``). Every function is pure and
memoised (a GRPO group repeats its label and usually its answers).
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

__all__ = ["clean_answer", "normalize_final_answer", "normalize_label", "parse_number"]

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


# Markdown emphasis and sentence punctuation around an otherwise valid answer ("**34**", "34.").
_DECORATION = "*_ \t."
_UNICODE_MINUS = str.maketrans({"\u2212": "-", "\u2013": "-", "\ufe63": "-", "\uff0d": "-"})


def clean_answer(normalized: str) -> str:
    """A normalised answer without Markdown emphasis, sentence punctuation and Unicode minus signs."""
    cleaned = normalized.translate(_UNICODE_MINUS).strip(_DECORATION)
    # Keep a leading "." of ".5" and a decimal point inside numbers; only trailing dots were stripped.
    if normalized.lstrip("*_ \t").startswith(".") and not cleaned.startswith("."):
        cleaned = "." + cleaned
    return cleaned


# Numbers

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
    normalized = clean_answer(normalize_final_answer(label))
    value = parse_number(normalized)
    if value is not None and value.denominator == 1:
        return str(value.numerator)
    return normalized
