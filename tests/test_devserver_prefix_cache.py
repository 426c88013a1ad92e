"""The dev server's prefix cache against a brute-force longest-common-prefix oracle."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strands_slime.devserver.prefix_cache import PrefixCache

pytestmark = pytest.mark.unit

tokens = st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=90)


def common_prefix(a: list[int], b: tuple[int, ...] | list[int]) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


@settings(max_examples=200, deadline=None)
@given(
    stored=st.lists(tokens, min_size=1, max_size=8), query=tokens, cap=st.integers(min_value=0, max_value=100)
)
def test_lookup_is_the_exact_longest_prefix(stored, query, cap):
    cache = PrefixCache(capacity_tokens=10**6, block_size=4)
    for index, sequence in enumerate(stored):
        cache.insert(sequence, payload=index)
    length, payload = cache.lookup(query, cap)
    expected = min(cap, len(query), max(common_prefix(query, sequence) for sequence in stored))
    assert length == expected
    if length:
        assert common_prefix(query, stored[payload]) >= length  # the payload really has that prefix


def test_lru_eviction_by_tokens():
    cache = PrefixCache(capacity_tokens=10, block_size=2)
    cache.insert([1, 2, 3, 4], "a")
    cache.insert([5, 6, 7, 8], "b")
    assert cache.lookup([1, 2, 3, 9], 10) == (3, "a")  # touching "a" makes "b" the oldest
    cache.insert([9, 9, 9, 9], "c")
    assert cache.lookup([5, 6, 7], 10) == (0, None)
    assert cache.lookup([1, 2, 3, 4], 10) == (4, "a")
    assert cache.total_tokens == 8 and len(cache) == 2


def test_reinserting_a_sequence_refreshes_its_payload():
    cache = PrefixCache(capacity_tokens=100, block_size=2)
    cache.insert([1, 2, 3], "old")
    cache.insert([1, 2, 3], "new")
    assert len(cache) == 1 and cache.lookup([1, 2, 3], 3) == (3, "new")


def test_too_long_or_empty_sequences_are_not_stored():
    cache = PrefixCache(capacity_tokens=3)
    cache.insert([1, 2, 3, 4])
    cache.insert([])
    assert len(cache) == 0 and cache.lookup([1, 2], 2) == (0, None)
    cache.clear()
    assert cache.stats()["cached_tokens"] == 0
