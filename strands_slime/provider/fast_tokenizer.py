"""Exact, faster tokenization: an encoder for the vocabularies it knows (the optional ``fast-tokenizer``
extra) and a decoder for byte-level vocabularies (every install).

Tokenizing tool outputs is about an eighth of the provider's CPU per turn; ``quicktok`` encodes the
Qwen2.5/Qwen3 vocabulary with Hugging Face's very ids several times faster. It is used only where it
is exact: a vocabulary that matches quicktok's (size, added tokens, :data:`CHECK_CORPUS`), checked
once per templater, else Hugging Face with one INFO line; and texts of at most
:data:`FAST_ENCODE_MAX_CHARS`, since it runs on the event loop. Licences, caveats and measurements:
docs/provider.md, "Fast tokenization".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from strands_slime.runtime import get_runtime

logger = logging.getLogger(__name__)

__all__ = ["CHECK_CORPUS", "ENCODINGS", "FAST_ENCODE_MAX_CHARS", "byte_level_decoder", "fast_encoder"]

Encode = Callable[[str], list[int]]

ENCODINGS = ("qwen3",)
"""quicktok's encodings this package may use (Qwen2.5 / Qwen3 / Qwen3-Next share one vocabulary)."""

FAST_ENCODE_MAX_CHARS = 16_384
"""Longer texts are encoded by Hugging Face in the worker thread. quicktok takes ~0.07 µs per character
on this project's loaded 2-core machines, so the longest text it encodes on the loop holds it ~1 ms, the
bound a Hugging Face encode of 2 KB had there (``chat.OFFLOAD_CHARS``); a text twice as long already
costs more on the loop than the thread hand-off."""

CHECK_CORPUS = (
    "",
    "Hello, world! The answer is 42.",
    "def f(x):\n    return x ** 2  # square\n\n\nprint(f(12345678901234567890))\n",
    'Traceback (most recent call last):\n  File "<stdin>", line 1, in <module>\nZeroDivisionError: division by zero\n',
    "   leading and trailing spaces   \t\t\n\n\n    \n",
    "日本語のテキストと中文文本，还有한국어 문장。",
    "emoji 🚀🔥👍🏽 and flags 🇯🇵 and ZWJ 👩‍👩‍👧",
    "decomposed accents: e\u0301 A\u030a n\u0303 \u1100\u1161\u11a8 ﬁ Ⅻ",
    "digits 0 01 012 0123 01234 3.14159 -7e10 1,000,000",
    "don't you're we'll I'M THEY'VE it's",
    "<|im_start|>user\n<tool_response>\nx<|im_end|>\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    '<think>\nreasoning\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
    "<|endoftext|><|fim_prefix|>not<|im_end special|><|im_start",
    "\u00a0non-breaking\u2009thin\u3000ideographic\u200bzero-width",
    "\r\n windows \r line \x0b endings \x0c",
    "[[1, 2], {'a': None}] == ((3,),) -> True; x >>= 2; y //= 3 ~~~ ```python",
)
"""What the fast encoder must encode exactly as Hugging Face does before it is used (with the vocabulary
check, it tells a look-alike vocabulary or a changed pre-tokenizer from the one quicktok encodes)."""


def fast_encoder(tokenizer: Any, reference: Encode) -> Encode | None:
    """quicktok's encoder for ``tokenizer`` (special tokens recognised, none added: what ``reference``,
    the Hugging Face call the templater makes, does) when the extra is installed and it is exact for
    this vocabulary; None otherwise, with one INFO line per tokenizer saying why."""
    try:
        import quicktok
    except ImportError:
        logger.debug("quicktok (the fast-tokenizer extra) is not installed: Hugging Face encodes")
        return None
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    reasons = []
    for encoding_name in ENCODINGS:
        try:
            encoding = quicktok.get_encoding(encoding_name)
        except Exception as exc:  # a wheel without this encoding's data files
            reasons.append(f"{encoding_name}: {type(exc).__name__}: {exc}")
            continue
        mismatch = _mismatch(tokenizer, reference, encoding)
        if mismatch is None:
            return encoding.encode_with_special  # type: ignore[no-any-return]
        reasons.append(f"{encoding_name}: {mismatch}")
    if get_runtime().first_time(f"fast tokenizer: not for {name}"):
        logger.info(
            "quicktok does not encode the vocabulary of %s exactly (%s): Hugging Face tokenizes it",
            name,
            "; ".join(reasons),
        )
    return None


def _mismatch(tokenizer: Any, reference: Encode, encoding: Any) -> str | None:
    """Why ``encoding`` is not ``tokenizer``'s vocabulary, or None when it encodes it exactly."""
    try:
        size = len(tokenizer)
    except TypeError:
        return "the tokenizer has no length"
    if size != encoding.n_vocab:
        return f"{size} tokens, not {encoding.n_vocab}"
    added = dict(tokenizer.get_added_vocab()) if hasattr(tokenizer, "get_added_vocab") else {}
    specials = {token: encoding.encode_single_token(token) for token in encoding.special_tokens_set}
    if added != specials:
        differing = sorted(set(added.items()) ^ set(specials.items()))[:3]
        return f"other added tokens ({differing}...)"
    for text in (*CHECK_CORPUS, *specials):
        if encoding.encode_with_special(text) != list(reference(text)):
            return f"encodes {text[:40]!r} differently"
    return None


def byte_level_decoder(tokenizer: Any) -> Callable[[Sequence[int]], str | None] | None:
    """A decoder giving Hugging Face's text (special tokens kept) a few times faster, for a plain
    byte-level BPE decoder whose added tokens are ASCII (older ``tokenizers`` pass added tokens through
    the byte-level decoder, newer ones keep them: the same text only for ASCII); None otherwise. Each id's
    bytes come from a table filled on first sight (under the templater's lock); it answers None where
    Hugging Face's own rules matter (bytes that are not UTF-8, replaced run by run there; negative or
    unknown ids), and the caller asks Hugging Face."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or type(backend.decoder).__name__ != "ByteLevel":
        return None
    added = {int(i): str(token.content) for i, token in backend.get_added_tokens_decoder().items()}
    if not all(content.isascii() for content in added.values()):
        return None
    table: list[bytes | None] = [None] * backend.get_vocab_size(with_added_tokens=True)
    for token_id, content in added.items():
        table[token_id] = content.encode()
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = (byte for byte in range(256) if byte not in printable)  # GPT-2's byte-level alphabet
    byte_of = {chr(b): bytes([b]) for b in printable} | {
        chr(256 + n): bytes([b]) for n, b in enumerate(shifted)
    }

    def token_bytes(token: str | None) -> bytes:
        try:  # a character outside the alphabet: the token's own UTF-8, as Hugging Face does
            return b"".join(byte_of[char] for char in token) if token is not None else b""
        except KeyError:
            return str(token).encode()

    def decode(token_ids: Sequence[int]) -> str | None:
        if not len(token_ids):
            return ""
        if min(token_ids) < 0:
            return None
        try:
            raw = b"".join(map(table.__getitem__, token_ids))  # type: ignore[arg-type]
        except IndexError:
            return None
        except TypeError:  # ids not seen before
            for token_id in set(token_ids):
                if table[token_id] is None:
                    table[token_id] = token_bytes(backend.id_to_token(token_id))
            raw = b"".join(map(table.__getitem__, token_ids))  # type: ignore[arg-type]
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return None

    return decode
