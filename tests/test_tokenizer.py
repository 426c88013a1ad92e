import time

import pytest
from huggingface_hub import constants

from strands_slime.provider.tokenizer import bundled_qwen3_tokenizer_dir, hub_unreachable, load_tokenizer

pytestmark = pytest.mark.unit


def test_bundled_files_present():
    path = bundled_qwen3_tokenizer_dir()
    assert path is not None and (path / "tokenizer_config.json").exists()


def test_qwen3_test_vectors(qwen3_tokenizer):
    tok = qwen3_tokenizer
    assert len(tok) == 151669
    vectors = {
        "Hello world": [9707, 1879],
        "Hello, world! 123": [9707, 11, 1879, 0, 220, 16, 17, 18],
        "   leading spaces": [256, 6388, 12621],
        "café": [924, 58858],
        "你好世界": [108386, 99489],
        "<think>": [151667],
    }
    for text, ids in vectors.items():
        assert tok.encode(text, add_special_tokens=False) == ids, text
    assert tok.convert_tokens_to_ids("<|im_end|>") == 151645


def test_reference_prompt_thinking_off(qwen3_tokenizer):
    ids = qwen3_tokenizer.apply_chat_template(
        [{"role": "user", "content": "a cat on a skateboard"}],
        add_generation_prompt=True,
        enable_thinking=False,
        tokenize=False,
    )
    assert qwen3_tokenizer.encode(ids, add_special_tokens=False) == [
        151644, 872, 198, 64, 8251, 389, 264, 97982, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271,
    ]  # fmt: skip


def test_a_hub_name_fails_at_once_when_the_hub_is_out_of_reach(monkeypatch):
    """transformers retries an unreachable hub for about 50 s: the name is refused at once instead."""
    assert hub_unreachable() == "HF_HUB_OFFLINE is set"  # the tests' environment (conftest.py)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    assert hub_unreachable().startswith("http://127.0.0.1:9: ")
    started = time.monotonic()
    with pytest.raises(
        OSError,
        match=r"'strands-slime-tests/no-such-tokenizer' is not a local directory, "
        r"it is not in the Hugging Face cache and the hub is out of reach \(http://127\.0\.0\.1:9",
    ):
        load_tokenizer("strands-slime-tests/no-such-tokenizer")
    assert time.monotonic() - started < 5
