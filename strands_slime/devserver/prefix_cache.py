"""Token-exact longest-prefix lookup over finished sequences, like SGLang's radix cache.

Sequences are indexed by chained hashes of fixed-size blocks, so a lookup costs one hash per block of
the query plus a short token-by-token comparison inside the last block; that stays cheap with
thousands of long multi-turn trajectories. Capacity is counted in tokens and evicted LRU.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

_ROOT_KEY = 0x5EED


@dataclass(slots=True, eq=False)
class _Entry:
    tokens: tuple[int, ...]
    payload: Any
    keys: list[int] = field(default_factory=list)


class PrefixCache:
    """Finished sequences (with an optional payload such as KV tensors), looked up by prefix."""

    def __init__(self, capacity_tokens: int, *, block_size: int = 64, candidates_per_block: int = 16) -> None:
        if capacity_tokens < 0:
            raise ValueError(f"capacity_tokens must be >= 0, got {capacity_tokens}")
        self.capacity_tokens = capacity_tokens
        self.block_size = block_size
        self.candidates_per_block = candidates_per_block
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._index: dict[int, list[int]] = {}
        self._ids = itertools.count()
        self.total_tokens = 0
        self.hit_tokens = 0
        self.queried_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _block_keys(self, tokens: Sequence[int], limit: int) -> list[int]:
        """Chained hash after each full block of ``tokens[:limit]``."""
        size = self.block_size
        keys = []
        key = _ROOT_KEY
        for start in range(0, limit - size + 1, size):
            key = hash((key, tuple(tokens[start : start + size])))
            keys.append(key)
        return keys

    def lookup(self, tokens: Sequence[int], max_len: int, *, record: bool = True) -> tuple[int, Any]:
        """Length of the longest cached prefix of ``tokens`` (at most ``max_len``) and its payload.

        The payload belongs to a sequence that starts with the returned number of tokens. With
        ``record=False`` the lookup neither counts in the hit statistics nor refreshes the LRU order.
        """
        if record:
            self.queried_tokens += len(tokens)
        limit = min(len(tokens), max_len)
        if limit <= 0 or not self._entries:
            return 0, None
        size = self.block_size
        boundary = 0
        candidates = self._index.get(_ROOT_KEY, [])
        key = _ROOT_KEY
        while boundary + size <= limit:
            next_key = hash((key, tuple(tokens[boundary : boundary + size])))
            found = self._index.get(next_key)
            if not found:
                break
            key, boundary, candidates = next_key, boundary + size, found
        best_len, best_id = 0, None
        window = tokens[boundary : min(limit, boundary + size)]
        for entry_id in reversed(candidates):
            stored = self._entries[entry_id].tokens
            extra = 0
            for mine, theirs in zip(window, stored[boundary : boundary + len(window)], strict=False):
                if mine != theirs:
                    break
                extra += 1
            if best_id is None or boundary + extra > best_len:
                best_len, best_id = boundary + extra, entry_id
            if extra == len(window):
                break
        if best_id is None or best_len == 0:
            return 0, None
        if boundary and self._entries[best_id].tokens[:boundary] != tuple(tokens[:boundary]):
            return 0, None  # a hash collision, not a shared prefix
        if record:
            self._entries.move_to_end(best_id)
            self.hit_tokens += best_len
        return best_len, self._entries[best_id].payload

    def insert(self, tokens: Sequence[int], payload: Any = None) -> None:
        """Remember a finished sequence; evicts least recently used sequences past capacity."""
        length = len(tokens)
        if length == 0 or length > self.capacity_tokens:
            return
        stored = tuple(tokens)
        keys = self._block_keys(stored, length)
        final_candidates = self._index.get(keys[-1] if keys else _ROOT_KEY, [])
        for entry_id in final_candidates:
            entry = self._entries[entry_id]
            if entry.tokens == stored:  # same sequence again: refresh it
                entry.payload = payload
                self._entries.move_to_end(entry_id)
                return
        entry_id = next(self._ids)
        entry = _Entry(tokens=stored, payload=payload, keys=[_ROOT_KEY, *keys])
        for key in entry.keys:
            bucket = self._index.setdefault(key, [])
            bucket.append(entry_id)
            if len(bucket) > self.candidates_per_block:
                del bucket[0]
        self._entries[entry_id] = entry
        self.total_tokens += length
        while self.total_tokens > self.capacity_tokens and self._entries:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        entry_id, entry = self._entries.popitem(last=False)
        self.total_tokens -= len(entry.tokens)
        for key in entry.keys:
            bucket = self._index.get(key)
            if bucket is None:
                continue
            try:
                bucket.remove(entry_id)
            except ValueError:
                pass
            if not bucket:
                del self._index[key]

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()
        self._index.clear()
        self.total_tokens = 0

    def stats(self) -> dict[str, Any]:
        """Counters for ``/server_info`` and ``/v1/loads`` (entries, tokens, hit rate)."""
        hit_rate = self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0
        return {
            "cached_sequences": len(self._entries),
            "cached_tokens": self.total_tokens,
            "capacity_tokens": self.capacity_tokens,
            "cache_hit_rate": hit_rate,
        }
