"""Tokenizer access for the dev server, kept off the event loop.

Hugging Face fast tokenizers are not safe to call from several threads at once, and tokenizing or
decoding a long prompt takes milliseconds, so every call of one server goes through one dedicated
worker thread.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

ENDOFTEXT = "<|endoftext|>"


class RustTokenizer:
    """The few tokenizer calls the dev server needs, straight on a ``tokenizers.Tokenizer``.

    Loading ``tokenizer.json`` this way skips importing transformers (which imports torch when it
    is installed), so a scripted server starts in about a second instead of several. Encoding and
    decoding equal the transformers fast tokenizer built from the same files (tested).
    """

    def __init__(self, directory: str | Path) -> None:
        from tokenizers import Tokenizer

        directory = Path(directory)
        self.name_or_path = str(directory)
        self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.exists() else {}
        self.eos_token_id = self._special_id(config.get("eos_token"))
        self.unk_token_id = self._special_id(config.get("unk_token"))
        self.added_tokens_decoder = self._tokenizer.get_added_tokens_decoder()

    def _special_id(self, token: Any) -> int | None:
        if isinstance(token, dict):
            token = token.get("content")
        return self._tokenizer.token_to_id(token) if isinstance(token, str) else None

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``."""
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(
        self,
        ids: Sequence[int],
        skip_special_tokens: bool = False,
        spaces_between_special_tokens: bool = True,
    ) -> str:
        """Text of ``ids`` (``spaces_between_special_tokens`` is accepted for the transformers signature)."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, token_id: int) -> str | None:
        """The vocabulary entry of ``token_id``."""
        return self._tokenizer.id_to_token(token_id)

    def convert_tokens_to_ids(self, token: str) -> int | None:
        """The id of a vocabulary entry, or None."""
        return self._tokenizer.token_to_id(token)

    def get_vocab(self) -> dict[str, int]:
        """Every vocabulary entry with its id, added tokens included."""
        return self._tokenizer.get_vocab(with_added_tokens=True)


def load_devserver_tokenizer(name_or_path: str | None = None) -> Any:
    """The bundled Qwen3 tokenizer (None/"qwen3") or a local directory, loaded once per process (the
    runtime keeps it).

    Directories with a ``tokenizer.json`` use :class:`RustTokenizer`; others go through transformers.
    """
    from strands_slime.provider.tokenizer import load_tokenizer, resolve_tokenizer_path
    from strands_slime.runtime import get_runtime

    path = Path(resolve_tokenizer_path(name_or_path))
    if not (path / "tokenizer.json").exists():
        return load_tokenizer(str(path))
    runtime = get_runtime()
    return runtime.cached(runtime.tokenizers, ("devserver", str(path)), lambda: RustTokenizer(path))


class TokenizerWorker:
    """A tokenizer plus the single thread that runs it."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="devserver-tokenizer")

    @property
    def name_or_path(self) -> str:
        """Where the tokenizer came from (``/model_info``'s ``tokenizer_path``)."""
        return str(getattr(self.tokenizer, "name_or_path", "") or "")

    def decodes_by_concatenation(self) -> bool:
        """True for byte-level tokenizers: decode(a + b) == decode(a) + decode(b) at a character
        boundary. Others (SentencePiece strips a leading space) must decode whole sequences."""
        # transformers' public backend_tokenizer, else our RustTokenizer's own attribute
        backend = getattr(self.tokenizer, "backend_tokenizer", None) or getattr(
            self.tokenizer, "_tokenizer", None
        )
        decoder = getattr(backend, "decoder", None)
        return type(decoder).__name__ == "ByteLevel" and not getattr(
            self.tokenizer, "clean_up_tokenization_spaces", False
        )

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
        """Token ids of ``text`` (on the tokenizer thread)."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode_sync(
        self,
        ids: Sequence[int],
        *,
        skip_special_tokens: bool = False,
        spaces_between_special_tokens: bool = True,
    ) -> str:
        """Text of ``ids`` (on the tokenizer thread)."""
        if not ids:
            return ""
        return self.tokenizer.decode(
            list(ids),
            skip_special_tokens=skip_special_tokens,
            spaces_between_special_tokens=spaces_between_special_tokens,
        )

    async def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``, computed on the tokenizer thread."""
        return await self.run(self.encode_sync, text, add_special_tokens=add_special_tokens)

    async def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens, decoded on the tokenizer thread."""
        return await self.run(self.decode_sync, ids)

    def close(self) -> None:
        """Stop the tokenizer thread."""
        self._executor.shutdown(wait=False, cancel_futures=True)
