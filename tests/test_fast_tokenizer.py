"""The fast-tokenizer extra (quicktok) against Hugging Face tokenizers, with the real Qwen3 tokenizer: the
same ids for random strings, used only for the vocabulary it encodes, Hugging Face above the size bound.

Skipped when the extra is not installed (it is in the test and dev extras, so CI runs it).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strands_slime.provider.chat import ChatTemplater
from strands_slime.provider.fast_tokenizer import CHECK_CORPUS, FAST_ENCODE_MAX_CHARS, fast_encoder
from strands_slime.provider.tokenizer import load_tokenizer, resolve_tokenizer_path

pytestmark = pytest.mark.unit

quicktok = pytest.importorskip("quicktok", reason="the fast-tokenizer extra (quicktok-v1) is not installed")

SPECIALS = sorted(load_tokenizer().get_added_vocab())
PIECES = [
    *SPECIALS,
    *(special[:-1] for special in SPECIALS),  # special-token-like text that is not one
    "<|",
    "|>",
    "\n",
    "\n\n\n",
    "    ",
    "\t",
    " \n ",
    "\r\n",
    "0",
    "12345678901234",
    "3.14",
    "日本語",
    "中文，",
    "한국어",
    "🚀",
    "👩‍👧",
    "🏽",
    "e\u0301",
    "\u1100\u1161",
    "ﬁ",
    "'s",
    "'LL",
    "Traceback (most recent call last):\n",
    '  File "x.py", line 3\n',
    "def f(x):\n    return x\n",
    "{'a': [1, 2]}",
    "==>",
    "\u00a0",
    "\u200b",
    "\x00",
]
"""The strings that stress byte-level BPE: specials and near-specials, whitespace runs, digits, CJK,
emoji with modifiers, decomposed text that NFC changes, contractions, code."""

adversarial = st.lists(st.sampled_from(PIECES) | st.text(max_size=12), max_size=24).map("".join)
"""Random pieces glued together, with random Unicode text (every category but surrogates) between them."""


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer()


@pytest.fixture(scope="module")
def templater(tokenizer: Any) -> ChatTemplater:
    return ChatTemplater(tokenizer)


def hf_ids(tokenizer: Any, text: str) -> list[int]:
    """What SGLang's tokenizer makes of rendered text: special tokens recognised, none added."""
    return list(tokenizer.backend_tokenizer.encode_batch([text], add_special_tokens=False)[0].ids)


def test_the_bundled_qwen3_vocabulary_gets_the_fast_encoder(templater: ChatTemplater) -> None:
    assert templater.fast_encode is not None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=adversarial)
def test_fast_ids_equal_hugging_face_ids(templater: ChatTemplater, tokenizer: Any, text: str) -> None:
    assert templater.fast_encode is not None
    assert templater.fast_encode(text) == hf_ids(tokenizer, text)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(min_size=1, max_size=200))
def test_fast_ids_equal_hugging_face_ids_on_any_unicode(
    templater: ChatTemplater, tokenizer: Any, text: str
) -> None:
    assert templater.fast_encode is not None
    assert templater.fast_encode(text) == hf_ids(tokenizer, text)


async def test_the_templater_encodes_every_size_as_hugging_face_does(
    templater: ChatTemplater, tokenizer: Any
) -> None:
    """Short texts through the fast encoder on the loop, texts over the bound through Hugging Face in
    the worker thread: the same ids either way."""
    line = "x = [1, 2, 3]  # 日本 🚀 </tool_response>\n"
    for text in (
        line,
        line * (FAST_ENCODE_MAX_CHARS // len(line)),
        line * (FAST_ENCODE_MAX_CHARS // len(line) + 1),
    ):
        expected = hf_ids(tokenizer, text)
        assert templater.encode(text) == expected
        assert await templater.encode_async(text) == expected


def test_another_vocabulary_falls_back_to_hugging_face_with_one_info_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The Qwen3 files with one more added token are no longer quicktok's vocabulary: Hugging Face
    encodes (the added token is recognised), and the reason is logged once."""
    from transformers import AutoTokenizer

    from strands_slime.runtime import get_runtime

    other = AutoTokenizer.from_pretrained(resolve_tokenizer_path(None))
    other.add_special_tokens({"additional_special_tokens": ["<|my_marker|>"]})
    get_runtime().logged.discard(f"fast tokenizer: not for {other.name_or_path}")
    with caplog.at_level(logging.INFO, logger="strands_slime.provider.fast_tokenizer"):
        first = ChatTemplater(other)
        second = ChatTemplater(other)
    assert first.fast_encode is None and second.fast_encode is None
    lines = [r for r in caplog.records if r.name == "strands_slime.provider.fast_tokenizer"]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert "does not encode the vocabulary" in lines[0].getMessage()
    text = "a<|my_marker|>b"
    assert first.encode(text) == hf_ids(other, text)
    assert other.convert_tokens_to_ids("<|my_marker|>") in first.encode(text)


def test_a_reference_that_disagrees_on_the_corpus_refuses_the_fast_encoder(tokenizer: Any) -> None:
    """The corpus check is not vacuous: a reference that splits one corpus string differently (a changed
    pre-tokenizer, say) makes the fast encoder unused."""
    changed = CHECK_CORPUS[2]

    def reference(text: str) -> list[int]:
        ids = hf_ids(tokenizer, text)
        return ids[::-1] if text == changed else ids

    assert fast_encoder(tokenizer, reference) is None
    assert fast_encoder(tokenizer, lambda text: hf_ids(tokenizer, text)) is not None
