"""What a dev-server backend provides: token steps for one request at a time.

Backends only produce tokens and logprobs. Everything SGLang defines on top (stop strings, stop ids,
``max_new_tokens`` clipping, aborts, text trimming, response shapes) lives in the engine, so both
backends follow the protocol identically.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any

from strands_slime.devserver.request import GenerationRequest, PrefillResult, TokenStep

if TYPE_CHECKING:
    from strands_slime.devserver.prefix_cache import PrefixCache
    from strands_slime.devserver.tokens import TokenizerWorker


class Generation(abc.ABC):
    """The backend side of one running request."""

    @abc.abstractmethod
    async def prefill(self) -> PrefillResult:
        """Process the prompt (reusing cached prefixes) before the first token is asked for."""

    @abc.abstractmethod
    async def next_tokens(self, limit: int) -> list[TokenStep]:
        """Return between 1 and ``limit`` next tokens, or ``[]`` when the backend has nothing more.

        The engine accepts tokens in order up to the one that finishes the request; tokens after it
        are dropped, exactly as SGLang drops tokens after a stop.
        """

    @abc.abstractmethod
    async def close(self, output_ids: list[int]) -> None:
        """Release the request; ``output_ids`` are the tokens the engine accepted (for the cache)."""


class Backend(abc.ABC):
    """A token source shared by every request of one server."""

    name: str
    tokens: TokenizerWorker
    vocab_size: int
    eos_token_ids: frozenset[int]
    default_context_length: int
    default_max_running_requests: int
    json_any_whitespace: bool = True
    """False under ``--constrained-json-disable-any-whitespace``."""
    prefix_cache: PrefixCache | None = None

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Called once on the server's loop before the first request."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release threads and memory."""

    async def prepare(self, request: GenerationRequest) -> None:
        """Accept a request before it queues (raise ProtocolError to refuse): compile its
        ``json_schema``/``regex``/``ebnf`` into ``request.grammar`` (a 400 if invalid)."""
        from strands_slime.devserver.grammar import GrammarEngine, requested_grammar

        wanted = requested_grammar(request.params)
        if wanted is None:
            return
        engine: GrammarEngine | None = getattr(self, "_grammar_engine", None)
        if engine is None:
            engine = GrammarEngine(
                self.tokens, self.vocab_size, self.eos_token_ids, json_any_whitespace=self.json_any_whitespace
            )
            self._grammar_engine = engine
        request.grammar = (engine, await engine.compile(*wanted))

    @abc.abstractmethod
    def open(self, request: GenerationRequest) -> Generation:
        """Start generating for an admitted request."""

    @abc.abstractmethod
    def model_info(self) -> dict[str, Any]:
        """Backend-specific fields of ``/model_info`` (model_path, model_type, architectures, ...)."""

    def flush_cache(self) -> None:
        """Drop every cached prefix (``POST /flush_cache``)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def cache_stats(self) -> dict[str, Any]:
        """Prefix-cache counters for ``/server_info``."""
        return {} if self.prefix_cache is None else self.prefix_cache.stats()
