"""Kimi K2/K2.5, proven by construction: no Kimi tokenizer is available offline, so these tests use the
real Qwen3 tokenizer with Kimi's special tokens added and Kimi K2.5's chat template
(tests/data/templates/kimi_k25_miles.jinja). The templating, the stop tokens and the parser are what
is tested; Kimi's own vocabulary splits text into other ids (tests/test_chat_families.py proves the
other families with their real files).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
from family_files import conversation
from hypothesis import HealthCheck, given, settings

from strands_slime.provider.chat import ChatTemplater, to_template_messages
from strands_slime.provider.template_check import CHECK_TOOL_SPECS, Turn, simulate_episode, stop_token_id

pytestmark = pytest.mark.unit

TEMPLATE = Path(__file__).parent / "data" / "templates" / "kimi_k25_miles.jinja"
KIMI_TOKENS = [
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "[EOS]",
]


@functools.cache
def kimi_tokenizer() -> Any:
    """A fresh Qwen3 tokenizer with Kimi's special tokens and chat template."""
    from transformers import AutoTokenizer

    from strands_slime.provider.tokenizer import resolve_tokenizer_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_tokenizer_path(None))
    tokenizer.add_special_tokens({"additional_special_tokens": KIMI_TOKENS})
    tokenizer.chat_template = TEMPLATE.read_text()
    return tokenizer


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conv=conversation())
def test_incremental_equals_full_render(conv: tuple[str, str, list[Turn]]) -> None:
    """Against Kimi K2.5's template rendered by apply_chat_template; every output parses back."""
    episode = simulate_episode(ChatTemplater(kimi_tokenizer()), *conv, CHECK_TOOL_SPECS)
    for (reasoning, content, calls, _), (_, parsed) in zip(conv[2], episode.outputs, strict=False):
        assert (parsed.reasoning, parsed.text) == (reasoning, content)
        assert [(c.name, c.arguments, c.error) for c in parsed.tool_calls] == [
            ("execute_python_code", args, None) for args in calls
        ]
    assert episode.full_ids is not None and episode.incremental_ids == episode.full_ids


def test_family_is_detected_and_its_turn_ends_stop() -> None:
    templater = ChatTemplater(kimi_tokenizer())
    assert templater.family.name == "kimi_k2" and templater.family.thinking_kwarg == "thinking"
    tokenizer = templater.tokenizer
    assert {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "[EOS]")} <= templater.stop_token_ids


def test_truncated_output_gets_the_turn_closed() -> None:
    """After an output cut by the length limit (no stop token) the tail closes the assistant turn."""
    templater = ChatTemplater(kimi_tokenizer())
    new = to_template_messages([{"role": "user", "content": [{"text": "go on"}]}])
    closed = templater.continuation_text(new, templater.encode("partial")[-1])
    assert closed == "<|im_end|>" + templater.continuation_text(new, stop_token_id(templater))


def test_enable_thinking_reaches_the_template_as_thinking() -> None:
    templater = ChatTemplater(kimi_tokenizer(), enable_thinking=False)
    prompt = templater.render([{"role": "user", "content": "q"}])
    assert prompt.endswith("<|im_middle|><think></think>") and not templater.prompt_opens_reasoning(prompt)


def test_tool_results_name_the_models_call_id() -> None:
    templater = ChatTemplater(kimi_tokenizer())
    blocks = [{"toolResult": {"toolUseId": "call_0", "status": "success", "content": [{"text": "42"}]}}]
    new = to_template_messages([{"role": "user", "content": blocks}], None, {"call_0": "functions.f:7"}.get)
    tail = templater.continuation_text(new, templater.tokenizer.convert_tokens_to_ids("<|im_end|>"))
    assert (
        tail
        == "<|im_system|>tool<|im_middle|>## Return of functions.f:7\n42<|im_end|><|im_assistant|>assistant<|im_middle|><think>"
    )


async def test_agent_episode_over_http(tmp_path: Path) -> None:
    """A Strands agent on SGLangModel against the dev server: the family and its parser are picked from
    the tokenizer, the tool runs, its result refers to the model's own call id."""
    from family_files import assert_episode_extends_each_request, run_tool_episode

    tokenizer = kimi_tokenizer()
    directory = tmp_path / "tokenizer"
    tokenizer.save_pretrained(directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|im_end|>"}))
    first_reply = (
        "Compute it.</think>Running.<|tool_calls_section_begin|><|tool_call_begin|>"
        'functions.execute_python_code:0<|tool_call_argument_begin|>{"code": "print(6)"}<|tool_call_end|>'
        "<|tool_calls_section_end|>"
    )
    ran, model, log = await run_tool_episode(tokenizer, directory, first_reply)
    assert model.templater.family.name == "kimi_k2" and model.tool_parser.name == "kimi_k2"
    assert ran == ["print(6)"]
    appended = assert_episode_extends_each_request(tokenizer, model, log)
    assert "## Return of functions.execute_python_code:0\nRESULT-6<|im_end|>" in appended
