"""Constrained decoding (``json_schema`` / ``regex`` / ``ebnf``) with xgrammar, SGLang's default engine.

One :class:`GrammarEngine` per server holds the tokenizer's xgrammar vocabulary and a compiled-grammar
cache. Compiling runs on a worker thread; a grammar that does not compile is refused the way SGLang
refuses it: a 400 ``{"error": {"message": "Failed to compile json grammar: ..."}}``. The ``hf``
backend masks the logits with the matcher at every step; the ``scripted`` backend checks its reply
against the same matcher and refuses a reply the grammar does not admit. Like SGLang, a schema using a
feature xgrammar would not enforce (``uniqueItems``, ...) is refused, with SGLang's message
(``strands_slime.provider.constraints.unsupported_json_schema``, which structured output checks too).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import json
import threading
from typing import TYPE_CHECKING, Any

from strands_slime.devserver.protocol import ProtocolError
from strands_slime.provider.constraints import unsupported_json_schema

if TYPE_CHECKING:
    from strands_slime.devserver.protocol import SamplingParams
    from strands_slime.devserver.tokens import TokenizerWorker

COMPILED_CACHE_SIZE = 256
"""Compiled grammars kept (LRU); SGLang keeps a similar per-server cache."""

GRAMMAR_KEY_TYPES = {"json_schema": "json", "regex": "regex", "ebnf": "ebnf"}
"""Sampling-param name to SGLang's grammar key type (used in its error messages); ``structural_tag``
is refused before (``SamplingParams.verify``)."""


def requested_grammar(params: SamplingParams) -> tuple[str, str] | None:
    """``(key_type, text)`` of the request's constraint, or None (``verify`` allows at most one)."""
    for name, key_type in GRAMMAR_KEY_TYPES.items():
        value = getattr(params, name)
        if value is not None:
            return key_type, value
    return None


ANY_JSON = "$$ANY$$"
"""``json_schema`` value SGLang maps to xgrammar's built-in grammar of any JSON value."""


def _import_xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError:
        raise ProtocolError.value(
            "Constrained decoding (json_schema, regex, ebnf) on the dev server needs xgrammar: "
            "pip install 'strands-slime[grammar]'"
        ) from None
    return xgrammar


class GrammarEngine:
    """xgrammar's vocabulary view of one tokenizer plus a compiled-grammar cache."""

    def __init__(
        self,
        tokens: TokenizerWorker,
        vocab_size: int,
        stop_token_ids: frozenset[int],
        *,
        json_any_whitespace: bool = True,
    ) -> None:
        self.tokens = tokens
        self.json_any_whitespace = json_any_whitespace
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(stop_token_ids)
        self._compiler: Any = None
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[tuple[str, str], Any] = collections.OrderedDict()

    def _compiler_sync(self) -> Any:
        with self._lock:
            if self._compiler is None:
                xgr = _import_xgrammar()
                vocab = self.tokens.tokenizer.get_vocab()
                encoded = [""] * self.vocab_size
                for piece, token_id in vocab.items():
                    if 0 <= token_id < self.vocab_size:
                        encoded[token_id] = piece
                info = xgr.TokenizerInfo(
                    encoded,
                    vocab_type=xgr.VocabType.BYTE_LEVEL,
                    vocab_size=self.vocab_size,
                    stop_token_ids=self.stop_token_ids,
                    add_prefix_space=False,
                )
                self._compiler = xgr.GrammarCompiler(info, max_threads=1)
            return self._compiler

    def _compile_sync(self, key_type: str, text: str) -> Any:
        compiler = self._compiler_sync()
        if "\x00" in text:  # as SGLang: refused before xgrammar sees it
            raise ValueError(f"Invalid {key_type}: NUL bytes (\\u0000) are not allowed")
        if key_type == "json":
            if text == ANY_JSON:
                return compiler.compile_builtin_json_grammar()
            # as SGLang: parsed first (a malformed schema gets json's message), then refused where
            # xgrammar would silently not enforce a keyword
            refused = unsupported_json_schema(json.loads(text))
            if refused is not None:
                raise ValueError(refused)
            return compiler.compile_json_schema(text, any_whitespace=self.json_any_whitespace)
        if key_type == "regex":
            return compiler.compile_regex(text)
        return compiler.compile_grammar(text)  # ebnf

    async def compile(self, key_type: str, text: str) -> Any:
        """The compiled grammar, or a 400 with SGLang's "Failed to compile ..." message."""
        key = (key_type, text)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        loop = asyncio.get_running_loop()
        try:
            compiled = await loop.run_in_executor(None, functools.partial(self._compile_sync, key_type, text))
        except ProtocolError:
            raise
        except (RuntimeError, ValueError, json.JSONDecodeError) as exc:
            raise ProtocolError.value(f"Failed to compile {key_type} grammar: {exc}") from None
        self._cache[key] = compiled
        if len(self._cache) > COMPILED_CACHE_SIZE:
            self._cache.popitem(last=False)
        return compiled

    def matcher(self, compiled: Any) -> GrammarState:
        """A fresh matcher for one request."""
        return GrammarState(self, compiled)


class GrammarState:
    """One request's grammar matcher: which tokens may come next, and what was accepted."""

    def __init__(self, engine: GrammarEngine, compiled: Any) -> None:
        xgr = _import_xgrammar()
        self._xgr = xgr
        self.engine = engine
        self.matcher = xgr.GrammarMatcher(compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, engine.vocab_size)

    def mask_logits(self, logits: Any) -> None:
        """Set every token the grammar forbids to -inf, in place (a 1-D float tensor)."""
        self.matcher.fill_next_token_bitmask(self.bitmask)
        self._xgr.apply_token_bitmask_inplace(logits, self.bitmask[0].to(logits.device))

    def accept(self, token_id: int) -> bool:
        """Advance past ``token_id``; False when the grammar rejects it."""
        return bool(self.matcher.accept_token(int(token_id)))

    @property
    def terminated(self) -> bool:
        """Whether the grammar is complete (only a stop token may follow)."""
        return bool(self.matcher.is_terminated())


def find_violation(state: GrammarState, token_ids: list[int], stop_token_ids: frozenset[int]) -> int | None:
    """Index of the first token the grammar rejects (a stop token before the grammar is complete
    counts), or None when every token is admitted."""
    for index, token_id in enumerate(token_ids):
        if not state.accept(token_id):
            return index
        if token_id in stop_token_ids:
            return None
    return None
