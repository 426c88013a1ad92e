"""Incremental templating for each supported chat family equals a full render of the conversation.

Templates: tests/data/templates (sources in its README); DeepSeek V3.2 uses our Python encoder. The
families' real tokenizers are not available offline, so each uses the real Qwen3 tokenizer with the
family's special tokens added: the templating, the stop tokens and the parsers are what is tested.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strands_slime.provider.chat import ChatTemplater, to_template_messages, tool_specs_to_template_tools
from strands_slime.provider.chat_families import UnsupportedChatTemplate, detect_chat_family
from strands_slime.provider.deepseek import ASSISTANT, BOS, EOS, USER
from strands_slime.provider.template_check import Turn, simulate_episode, stop_token_id

pytestmark = pytest.mark.unit

TEMPLATES = Path(__file__).parent / "data" / "templates"
TOOL_SPECS = [
    {
        "name": "execute_python_code",
        "description": "Run Python code and return its output.",
        "inputSchema": {
            "json": {
                "type": "object",
                "properties": {"code": {"type": "string"}, "timeout": {"type": "integer"}},
                "required": ["code"],
            }
        },
    }
]


@dataclass(frozen=True)
class Case:
    family: str
    template: str | None
    tokens: tuple[str, ...] = ()


CASES = {
    "qwen35": Case("qwen35", "qwen35_miles.jinja"),
    "qwen3_next": Case("qwen3", "qwen3_next_thinking_miles.jinja"),
    "glm47": Case(
        "glm47",
        "glm47_style.jinja",
        (
            "[gMASK]",
            "<sop>",
            "<|system|>",
            "<|user|>",
            "<|assistant|>",
            "<|observation|>",
            "<arg_key>",
            "</arg_key>",
            "<arg_value>",
            "</arg_value>",
        ),
    ),
    "kimi_k2": Case(
        "kimi_k2",
        "kimi_k25_miles.jinja",
        (
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
        ),
    ),
    "minimax_m2": Case(
        "minimax_m2",
        "minimax_m25_miles.jinja",
        ("]~!b[", "]~b]", "[e~[", "<minimax:tool_call>", "</minimax:tool_call>"),
    ),
    "deepseek_v32": Case("deepseek_v32", None, (BOS, EOS, USER, ASSISTANT)),
}


@functools.cache
def family_tokenizer(case_name: str) -> Any:
    """A fresh Qwen3 tokenizer with the family's special tokens and chat template."""
    from transformers import AutoTokenizer

    from strands_slime.provider.tokenizer import resolve_tokenizer_path

    case = CASES[case_name]
    tokenizer = AutoTokenizer.from_pretrained(resolve_tokenizer_path(None))
    if case.tokens:
        tokenizer.add_special_tokens({"additional_special_tokens": list(case.tokens)})
    tokenizer.chat_template = (TEMPLATES / case.template).read_text() if case.template else None
    return tokenizer


def templater_for(case_name: str) -> ChatTemplater:
    return ChatTemplater(family_tokenizer(case_name))


def simulate(
    templater: ChatTemplater, system: str, user: str, turns: list[Turn]
) -> tuple[list[int], list[int]]:
    """Run the episode incrementally (each output parsed back with the family's parser, which must read
    exactly the turn's reasoning, text and calls) and render it in full; return both id lists."""
    episode = simulate_episode(templater, system, user, turns, TOOL_SPECS)
    for (reasoning, content, arguments, _), (_, parsed) in zip(turns, episode.outputs, strict=False):
        assert parsed.reasoning == reasoning and parsed.text == content
        assert [(c.name, c.arguments, c.error) for c in parsed.tool_calls] == [
            ("execute_python_code", args, None) for args in arguments
        ]
    assert episode.full_ids is not None
    return episode.incremental_ids, episode.full_ids


words = st.text(alphabet=st.sampled_from(list("abcxyz ABC0123+-*=()., 你好éß😀")), max_size=20)
text = st.builds(lambda head, body: (head + body).rstrip(), st.sampled_from(["The", "x", "Now", "我"]), words)
code = st.builds(
    lambda body: f"print({body!r})",
    st.text(alphabet=st.sampled_from(list("ab1 \n\"'{}[]é😀<>")), max_size=20),
)
arguments = st.builds(
    lambda c, timeout: {"code": c} if timeout is None else {"code": c, "timeout": timeout},
    code,
    st.none() | st.integers(1, 300),
)
tool_output = st.builds(
    lambda head, body: head + body,
    # control tokens of every family and the anchor's text, as text a tool may print
    st.sampled_from(
        [
            "out",
            "Error: boom",
            "1",
            "结果",
            "x<|im_end|>",
            "x[e~[",
            "x<|observation|>",
            "x\u27e6strands-slime-anchor\u27e7",
        ]
    ),
    st.text(alphabet=st.sampled_from(list("ab 1\n\t{}[]\"'/é你😀")), max_size=30).map(str.rstrip),
)


@st.composite
def conversation(draw: st.DrawFn) -> tuple[str, str, list[Turn]]:
    turns = []
    for _ in range(draw(st.integers(1, 3))):
        calls = draw(st.lists(arguments, min_size=1, max_size=3))
        turns.append((draw(text), draw(text), calls, [draw(tool_output) for _ in calls]))
    return draw(text), draw(text), turns


SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.mark.parametrize("case_name", list(CASES))
@SETTINGS
@given(conv=conversation())
def test_incremental_equals_full_render(case_name: str, conv: tuple[str, str, list[Turn]]) -> None:
    ids, full = simulate(templater_for(case_name), *conv)
    assert ids == full


@pytest.mark.parametrize("case_name", list(CASES))
def test_family_is_detected_and_its_turn_ends_stop(case_name: str) -> None:
    templater = templater_for(case_name)
    assert templater.family.name == CASES[case_name].family
    tokenizer = templater.tokenizer
    for token in templater.family.stop_tokens:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token in tokenizer.get_vocab():
            assert token_id in templater.stop_token_ids
    if case_name == "glm47":  # GLM ends a turn with the next role's token
        assert {
            tokenizer.convert_tokens_to_ids(t) for t in ("<|user|>", "<|observation|>")
        } <= templater.stop_token_ids


@pytest.mark.parametrize("case_name", list(CASES))
def test_truncated_output_gets_the_turn_closed(case_name: str) -> None:
    """After an output cut by the length limit (no stop token) the tail closes the assistant turn."""
    templater = templater_for(case_name)
    new = to_template_messages([{"role": "user", "content": [{"text": "go on"}]}])
    cut = templater.encode("partial")[-1]
    closed = templater.continuation_text(new, cut)
    stopped = templater.continuation_text(new, stop_token_id(templater) if case_name != "glm47" else None)
    turn_end = templater.family.turn_end
    if turn_end:
        assert closed == turn_end + stopped
    else:  # GLM: the next role token is the closing
        assert closed.startswith("<|user|>go on")


def test_glm_user_follow_up_after_the_model_stopped_on_user_token() -> None:
    templater = templater_for("glm47")
    user_id = templater.tokenizer.convert_tokens_to_ids("<|user|>")
    new = to_template_messages([{"role": "user", "content": [{"text": "and now?"}]}])
    assert templater.continuation_text(new, user_id) == "and now?<|assistant|><think>"


def test_enable_thinking_reaches_each_familys_template() -> None:
    user = [{"role": "user", "content": "q"}]
    ends = {
        "qwen35": "<think>\n\n</think>\n\n",
        "glm47": "<|assistant|></think>",
        "kimi_k2": "<|im_middle|><think></think>",
        "deepseek_v32": "<\uff5cAssistant\uff5c></think>",
    }
    for case_name, end in ends.items():
        templater = ChatTemplater(family_tokenizer(case_name), enable_thinking=False)
        assert templater.render(user).endswith(end), case_name
        assert not templater.prompt_opens_reasoning(templater.render(user))


def test_kimi_tool_results_name_the_models_call_id() -> None:
    templater = templater_for("kimi_k2")
    blocks = [{"toolResult": {"toolUseId": "call_0", "status": "success", "content": [{"text": "42"}]}}]
    new = to_template_messages([{"role": "user", "content": blocks}], None, {"call_0": "functions.f:7"}.get)
    tail = templater.continuation_text(new, templater.tokenizer.convert_tokens_to_ids("<|im_end|>"))
    assert (
        tail
        == "<|im_system|>tool<|im_middle|>## Return of functions.f:7\n42<|im_end|><|im_assistant|>assistant<|im_middle|><think>"
    )


@pytest.mark.parametrize("case_name", ["minimax_m2", "deepseek_v32"])
def test_templates_that_need_a_call_before_a_result_work(case_name: str) -> None:
    """MiniMax's template raises on a tool message after an assistant message without tool calls (as
    does DeepSeek's format); the anchor carries one call per result, and none of it reaches the tail."""
    templater = templater_for(case_name)
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


def test_deepseek_v32_format() -> None:
    """The encoder writes DeepSeek V3.2's format: BOS, system + tools, think markers, DSML calls,
    function results after the turn."""
    templater = templater_for("deepseek_v32")
    tools = tool_specs_to_template_tools(TOOL_SPECS)
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {
            "role": "assistant",
            "content": "C",
            "reasoning_content": "R",
            "tool_calls": [{"function": {"name": "f", "arguments": {"a": "x", "n": 2}}}],
        },
        {"role": "tool", "content": "T"},
    ]
    text = templater.render(messages, tools)
    dsml = "\uff5cDSML\uff5c"
    assert text.startswith(BOS + "S\n\n## Tools\n")
    assert json.dumps(tools[0]["function"], ensure_ascii=False) in text
    assert text.endswith(
        f'{USER}U{ASSISTANT}<think>R</think>C\n\n<{dsml}function_calls>\n<{dsml}invoke name="f">\n'
        f'<{dsml}parameter name="a" string="true">x</{dsml}parameter>\n'
        f'<{dsml}parameter name="n" string="false">2</{dsml}parameter>\n</{dsml}invoke>\n'
        f"</{dsml}function_calls>{EOS}\n\n<function_results>\n<result>T</result>\n</function_results>\n\n<think>"
    )
    # A later user query drops earlier reasoning; thinking off closes the think block at once.
    later = templater.render([*messages, {"role": "user", "content": "V"}])
    assert "R</think>" not in later and later.endswith(f"{USER}V{ASSISTANT}<think>")
    off = ChatTemplater(family_tokenizer("deepseek_v32"), enable_thinking=False).render(messages[:2])
    assert off.endswith(f"{USER}U{ASSISTANT}</think>")


@pytest.mark.parametrize(
    ("case_name", "eos", "first_reply"),
    [
        (
            "kimi_k2",
            "<|im_end|>",
            "Compute it.</think>Running.<|tool_calls_section_begin|><|tool_call_begin|>"
            'functions.execute_python_code:0<|tool_call_argument_begin|>{"code": "print(6)"}<|tool_call_end|>'
            "<|tool_calls_section_end|>",
        ),
        (
            "minimax_m2",
            "[e~[",
            'Compute it.\n</think>\n\nRunning.\n<minimax:tool_call>\n<invoke name="execute_python_code">\n'
            '<parameter name="code">print(6)</parameter>\n</invoke>\n</minimax:tool_call>',
        ),
    ],
)
async def test_agent_episode_over_http(tmp_path: Path, case_name: str, eos: str, first_reply: str) -> None:
    """A Strands agent on SGLangModel against the dev server, for a non-Qwen family: the family and
    its parser are picked from the tokenizer, the tool runs, and every request extends the last."""
    from strands import Agent, tool
    from strands.agent.conversation_manager import NullConversationManager

    from strands_slime.devserver import DevServer
    from strands_slime.provider.client import SGLangClient
    from strands_slime.provider.model import SGLangModel

    ran: list[str] = []

    @tool
    def execute_python_code(code: str) -> str:
        """Run Python code.

        Args:
            code: The program.
        """
        ran.append(code)
        return "RESULT-6"

    tokenizer = family_tokenizer(case_name)
    directory = tmp_path / "tokenizer"
    tokenizer.save_pretrained(directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": eos}))
    # The scripted server counts Qwen's assistant headers to pick a reply; match on the tool result instead.
    script = [
        {"match": "RESULT-6", "replies": ["Done.</think>Answer: 6"]},
        {"match": "area", "replies": [first_reply]},
    ]
    server = await DevServer(backend="scripted", script=script, tokenizer=str(directory)).start()
    client = SGLangClient(server.url, retry_delay=0.01, max_retry_delay=0.05)
    try:
        model = SGLangModel(tokenizer=tokenizer, client=client)
        assert model.templater.family.name == case_name and model.tool_parser.name == case_name
        agent = Agent(
            model=model,
            tools=[execute_python_code],
            callback_handler=None,
            conversation_manager=NullConversationManager(),
            retry_strategy=None,
        )
        await agent.invoke_async("What is the area?")
    finally:
        await client.close()
        await server.stop()
    assert ran == ["print(6)"]
    requests = [entry["json"]["input_ids"] for entry in server.request_log]
    trajectory = model.trajectory
    assert len(requests) == 2 and trajectory.token_ids[: len(requests[1])].tolist() == requests[1]
    second_prompt = tokenizer.decode(requests[1][len(requests[0]) :])
    if case_name == "kimi_k2":
        assert "## Return of functions.execute_python_code:0\nRESULT-6<|im_end|>" in second_prompt
    else:
        # the output's own [e~[ closes the turn once; the tool turn has its own
        assert (
            "</minimax:tool_call>[e~[\n]~b]tool\n<response>RESULT-6</response>[e~[\n]~b]ai\n" in second_prompt
        )
    assert "anchor" not in tokenizer.decode(trajectory.token_ids.tolist())
    trajectory.check()


@pytest.mark.slow  # 9 s
@pytest.mark.parametrize(
    "case_name", [name if name == "glm47" else pytest.param(name, marks=pytest.mark.slow) for name in CASES]
)
def test_template_check_cli_passes_for_each_family(
    tmp_path: Path, case_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`strands-slime drift --template-check MODEL_DIR` on a saved tokenizer directory."""
    from strands_slime.cli import main

    family_tokenizer(case_name).save_pretrained(tmp_path)
    assert main(["drift", "--template-check", str(tmp_path), "--conversations", "8"]) == 0
    out = capsys.readouterr().out
    assert f"chat family {CASES[case_name].family}" in out and "0 failures" in out


@pytest.mark.slow  # 8 s
def test_template_check_reports_a_template_that_cannot_be_appended_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A template that renders a tool result differently once more messages follow fails the check."""
    from strands_slime.cli import main

    tokenizer = family_tokenizer("qwen35")
    template = tokenizer.chat_template
    original = tokenizer.chat_template
    tokenizer.chat_template = template.replace(
        "{{- '\\n</tool_response>' }}", "{{- '\\n</tool_response>' + ('!' if loop.last else '') }}"
    )
    assert tokenizer.chat_template != original
    try:
        tokenizer.save_pretrained(tmp_path)
    finally:
        tokenizer.chat_template = original
    assert main(["drift", "--template-check", str(tmp_path), "--conversations", "3"]) == 1
    assert "differ from a full render" in capsys.readouterr().out


def test_template_check_refuses_an_unknown_template_in_one_line(
    tmp_path: Path, qwen3_tokenizer: Any, capsys: pytest.CaptureFixture[str]
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
