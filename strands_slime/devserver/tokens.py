"""Tokenizer access for the dev server, kept off the event loop.

Hugging Face fast tokenizers are not safe to call from several threads at once, and tokenizing or
decoding a long prompt takes milliseconds, so every call of one server goes through one dedicated
worker thread.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

T = TypeVar("T")

ENDOFTEXT = "<|endoftext|>"


class TokenizerWorker:
    """A tokenizer plus the single thread that runs it."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="devserver-tokenizer")

    @property
    def name_or_path(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "") or "")

    def default_eos_ids(self) -> set[int]:
        """``eos_token_id`` plus ``<|endoftext|>`` when the vocabulary has it (Qwen stops on both)."""
        ids: set[int] = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        endoftext = self.tokenizer.convert_tokens_to_ids(ENDOFTEXT)
        if isinstance(endoftext, int) and endoftext != self.tokenizer.unk_token_id:
            ids.add(endoftext)
        return ids

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` on the tokenizer thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    # Synchronous forms, for code already running on the tokenizer thread.
    def encode_sync(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode_sync(
        self,
        ids: Sequence[int],
        *,
        skip_special_tokens: bool = False,
        spaces_between_special_tokens: bool = True,
    ) -> str:
        if not ids:
            return ""
        return self.tokenizer.decode(
            list(ids),
            skip_special_tokens=skip_special_tokens,
            spaces_between_special_tokens=spaces_between_special_tokens,
        )

    def token_texts_sync(self, ids: Sequence[int]) -> list[str]:
        """Each id decoded on its own (SGLang's ``return_text_in_logprobs`` texts)."""
        return [self.tokenizer.decode([tok]) for tok in ids]

    async def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return await self.run(self.encode_sync, text, add_special_tokens=add_special_tokens)

    async def decode(
        self,
        ids: Sequence[int],
        *,
        skip_special_tokens: bool = False,
        spaces_between_special_tokens: bool = True,
    ) -> str:
        if not ids:
            return ""
        return await self.run(
            self.decode_sync,
            ids,
            skip_special_tokens=skip_special_tokens,
            spaces_between_special_tokens=spaces_between_special_tokens,
        )

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
