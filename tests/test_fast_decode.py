"""The byte-level decoder against Hugging Face, with the real Qwen3 tokenizer and every chat family's:
the same text for any ids, or no answer (and Hugging Face decodes). Needs no extra."""

from __future__ import annotations

from typing import Any

import family_files
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strands_slime.provider.chat import ChatTemplater
from strands_slime.provider.fast_tokenizer import CHECK_CORPUS, byte_level_decoder

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer: Any) -> Any:
    return qwen3_tokenizer


@pytest.fixture(scope="module")
def templater(tokenizer: Any) -> ChatTemplater:
    return ChatTemplater(tokenizer)


def hf_ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def hf_text(tokenizer: Any, ids: list[int]) -> str:
    return str(tokenizer.backend_tokenizer.decode_batch([ids], skip_special_tokens=False)[0])


def test_the_qwen3_vocabulary_gets_the_byte_level_decoder(tokenizer: Any, templater: ChatTemplater) -> None:
    """Every install (no extra needed): the decoder is built from the Hugging Face tokenizer itself."""
    decoder = byte_level_decoder(tokenizer)
    assert decoder is not None
    for text in CHECK_CORPUS:
        ids = hf_ids(tokenizer, text)
        assert decoder(ids) == hf_text(tokenizer, ids) == templater.decode(ids)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.one_of(
            st.integers(0, 151_668),  # any id, added tokens included
            st.integers(151_643, 151_668),  # added tokens
            st.integers(0, 255),  # single bytes: pieces of multi-byte characters
            st.integers(-3, 151_700),  # negative and unknown ids
        ),
        max_size=40,
    )
)
def test_decoded_text_equals_hugging_face_for_any_ids(
    tokenizer: Any, templater: ChatTemplater, ids: list[int]
) -> None:
    """The decoder answers exactly Hugging Face's text or None (bytes that are not UTF-8, a negative or
    unknown id), and the templater's decode is Hugging Face's either way."""
    decoder = byte_level_decoder(tokenizer)
    assert decoder is not None
    text = decoder(ids)
    if text is not None:
        assert text == hf_text(tokenizer, ids)
    if min(ids, default=0) >= 0:  # Hugging Face's own answer for ids it can take
        assert templater.decode(ids) == hf_text(tokenizer, ids)


@given(st.text(max_size=200))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_encoded_text_decodes_back_through_the_table(tokenizer: Any, text: str) -> None:
    decoder = byte_level_decoder(tokenizer)
    assert decoder is not None
    ids = hf_ids(tokenizer, text)
    assert decoder(ids) == hf_text(tokenizer, ids)


@pytest.mark.parametrize("name", family_files.SUPPORTED)
def test_each_family_decodes_as_hugging_face_or_not_at_all(name: str) -> None:
    """A family whose decoder is not byte-level, or whose added tokens are not ASCII, gets no decoder;
    every other decodes the corpus and its chat markers as Hugging Face does."""
    if family_files.package_data() is None:
        pytest.skip(family_files.MISSING)
    real = family_files.tokenizer(name)
    decoder = byte_level_decoder(real)
    backend = real.backend_tokenizer
    added = [str(token.content) for token in backend.get_added_tokens_decoder().values()]
    if type(backend.decoder).__name__ != "ByteLevel" or not all(content.isascii() for content in added):
        assert decoder is None
        return
    assert decoder is not None
    for text in (*CHECK_CORPUS, *added[:50]):
        ids = hf_ids(real, text)
        assert decoder(ids) == hf_text(real, ids), text


def test_a_token_outside_the_byte_alphabet_decodes_as_its_own_text() -> None:
    """Hugging Face's byte-level decoder keeps a token with a character outside GPT-2's alphabet as the
    token's own UTF-8; so does the table."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"a": 0, "\u20ac5": 1, "\u0120b": 2, "\u00e2\u0124\u00ac": 3}  # "€5", " b", and "€" in bytes
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    decoder = byte_level_decoder(tokenizer)
    assert decoder is not None
    for ids in ([0, 1, 2], [3, 1], [2, 2, 0]):
        assert decoder(ids) == hf_text(tokenizer, ids)
    assert decoder([0, 1, 2]) == "a€5 b"
