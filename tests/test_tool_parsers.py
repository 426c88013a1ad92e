"""Tool-call parsing: think-awareness, malformed calls with reasons, schema-aware XML values."""

from __future__ import annotations

import pytest

from strands_slime.provider.tool_parsers import (
    INVALID_TOOL_NAME,
    HermesToolParser,
    Qwen3CoderToolParser,
    available_tool_parsers,
    get_tool_parser,
    parse_output,
    split_reasoning,
)

pytestmark = pytest.mark.unit

PY_SPEC = {
    "name": "execute_python_code",
    "description": "run code",
    "inputSchema": {
        "json": {
            "type": "object",
            "properties": {"code": {"type": "string"}, "timeout": {"type": "integer"}},
            "required": ["code"],
        }
    },
}
SEARCH_SPEC = {
    "name": "search",
    "description": "search",
    "inputSchema": {
        "json": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer"},
                "score": {"type": "number"},
                "exact": {"type": "boolean"},
                "filters": {"type": "object"},
                "tags": {"type": "array"},
            },
            "required": ["query"],
            "additionalProperties": False,
        }
    },
}
SPECS = [PY_SPEC, SEARCH_SPEC]
hermes = HermesToolParser()


def call(name: str, args: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def test_hermes_single_and_parallel_calls_in_order() -> None:
    text = (
        "Let me compute.\n"
        + call("execute_python_code", '{"code": "print(1)"}')
        + "\n"
        + call("search", '{"query": "x", "limit": 3}')
    )
    parsed = parse_output(text, hermes, SPECS)
    assert [c.name for c in parsed.tool_calls] == ["execute_python_code", "search"]
    assert parsed.tool_calls[0].arguments == {"code": "print(1)"}
    assert parsed.tool_calls[1].arguments == {"query": "x", "limit": 3}
    assert parsed.text == "Let me compute." and parsed.parse_errors == 0


def test_arguments_given_as_json_string_are_accepted() -> None:
    parsed = parse_output(call("execute_python_code", '"{\\"code\\": \\"1+1\\"}"'), hermes, SPECS)
    assert parsed.tool_calls[0].arguments == {"code": "1+1"}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            '<tool_call>\n{"name": "execute_python_code", "arguments": {"code": "x}\n</tool_call>',
            "invalid JSON",
        ),
        ('<tool_call>\n{"arguments": {"code": "1"}}\n</tool_call>', 'no "name"'),
        (call("rm_rf", '{"path": "/"}'), "unknown tool 'rm_rf'"),
        (call("execute_python_code", '{"code": 5}'), "must be string, got int"),
        (call("execute_python_code", "{}"), "missing required argument(s): code"),
        (call("search", '{"query": "a", "bogus": 1}'), "unknown argument(s): bogus"),
        (call("execute_python_code", '["a"]'), "must be a JSON object, got list"),
        ('<tool_call>\n{"name": "execute_python_code", "arguments": {"code": "1"}', "unterminated"),
        ("<tool_call>[1, 2]</tool_call>", "must be a JSON object"),
        (call("bad name!", "{}"), "invalid tool name"),
    ],
)
def test_malformed_calls_explain_what_is_wrong(text: str, reason: str) -> None:
    parsed = parse_output(text, hermes, SPECS)
    assert len(parsed.tool_calls) == 1
    assert parsed.tool_calls[0].error is not None and reason in parsed.tool_calls[0].error
    assert parsed.tool_calls[0].arguments is None and parsed.parse_errors == 1


def test_invalid_json_keeps_salvaged_name_and_raw_text() -> None:
    parsed = parse_output('<tool_call>{"name": "search", "arguments": {query: 1}}</tool_call>', hermes, SPECS)
    assert parsed.tool_calls[0].name == "search"
    assert "{query: 1}" in parsed.tool_calls[0].raw


def test_without_specs_any_tool_is_accepted() -> None:
    parsed = parse_output(call("anything", '{"a": [1]}'), hermes, None)
    assert parsed.tool_calls[0].ok and parsed.tool_calls[0].arguments == {"a": [1]}


def test_calls_inside_reasoning_are_never_executed() -> None:
    draft = call("rm_rf", '{"path": "/"}')
    text = f"<think>\nmaybe {draft}\n</think>\n\nNo tools needed. Answer: 3"
    parsed = parse_output(text, hermes, SPECS)
    assert parsed.tool_calls == [] and parsed.text == "No tools needed. Answer: 3"
    assert "rm_rf" in (parsed.reasoning or "")


def test_calls_before_close_think_when_template_opened_it() -> None:
    """Thinking-only templates open <think> in the prompt: the output only has </think>."""
    draft = call("rm_rf", '{"path": "/"}')
    text = f"draft {draft}\n</think>\n\nanswer " + call("execute_python_code", '{"code": "1"}')
    parsed = parse_output(text, hermes, SPECS, prompt_opened_reasoning=True)
    assert [c.name for c in parsed.tool_calls] == ["execute_python_code"]
    assert parsed.reasoning is not None and "rm_rf" in parsed.reasoning
    # The peer's regex would run rm_rf: without the flag, the text before </think> looks like content.
    naive = parse_output(text, hermes, SPECS, prompt_opened_reasoning=False)
    assert "rm_rf" in [c.name for c in naive.tool_calls]


def test_unclosed_reasoning_has_no_calls() -> None:
    reasoning, content, unclosed = split_reasoning(
        "still thinking " + call("search", "{}"), prompt_opened_reasoning=True
    )
    assert unclosed and content == "" and "search" in (reasoning or "")
    parsed = parse_output("<think>hmm " + call("search", '{"query": "q"}'), hermes, SPECS)
    assert parsed.tool_calls == [] and parsed.unclosed_reasoning


QWEN_XML = """<tool_call>
<function=search>
<parameter=query>
2024
</parameter>
<parameter=limit>
5
</parameter>
<parameter=score>
0.5
</parameter>
<parameter=exact>
True
</parameter>
<parameter=filters>
{"year": 2024}
</parameter>
<parameter=tags>
["a", "b"]
</parameter>
</function>
</tool_call>"""


def test_qwen3_coder_values_follow_the_schema() -> None:
    parsed = parse_output(QWEN_XML, Qwen3CoderToolParser(), SPECS)
    call_ = parsed.tool_calls[0]
    assert call_.ok, call_.error
    assert call_.arguments == {
        "query": "2024",  # a string parameter stays a string even though it looks like a number
        "limit": 5,
        "score": 0.5,
        "exact": True,
        "filters": {"year": 2024},
        "tags": ["a", "b"],
    }


def test_qwen3_coder_multiline_code_and_bad_integer() -> None:
    code = "for i in range(3):\n    print(i)\n"
    text = f"<tool_call>\n<function=execute_python_code>\n<parameter=code>\n{code}\n</parameter>\n</function>\n</tool_call>"
    parsed = parse_output(text, Qwen3CoderToolParser(), SPECS)
    assert parsed.tool_calls[0].arguments == {"code": code}
    bad = "<tool_call><function=search><parameter=query>q</parameter><parameter=limit>many</parameter></function></tool_call>"
    parsed = parse_output(bad, Qwen3CoderToolParser(), SPECS)
    assert parsed.tool_calls[0].error is not None and "'limit'" in parsed.tool_calls[0].error


def test_qwen3_coder_missing_function_element() -> None:
    parsed = parse_output("<tool_call>oops</tool_call>", Qwen3CoderToolParser(), SPECS)
    assert parsed.tool_calls[0].name == INVALID_TOOL_NAME and "no <function=NAME>" in (
        parsed.tool_calls[0].error or ""
    )


def test_registry() -> None:
    assert isinstance(get_tool_parser(), HermesToolParser)
    assert isinstance(get_tool_parser("qwen25"), HermesToolParser)
    assert isinstance(get_tool_parser("qwen3_coder"), Qwen3CoderToolParser)
    parser = Qwen3CoderToolParser()
    assert get_tool_parser(parser) is parser
    with pytest.raises(ValueError, match="unknown tool parser"):
        get_tool_parser("nope")


def calls_of(text: str, parser: str, specs: list | None = SPECS) -> list[tuple[str, dict | None, str | None]]:
    parsed = parse_output(text, get_tool_parser(parser), specs)
    return [(c.name, c.arguments, c.error) for c in parsed.tool_calls]


def test_glm47_native_calls_typed_by_schema() -> None:
    text = (
        "Checking.<tool_call>search<arg_key>query</arg_key><arg_value>2024</arg_value>"
        "<arg_key>limit</arg_key><arg_value>3</arg_value><arg_key>filters</arg_key>"
        '<arg_value>{"lang": "en"}</arg_value></tool_call>'
        "<tool_call>execute_python_code\n<arg_key>code</arg_key>\n<arg_value>print(1)\nprint(2)</arg_value>\n</tool_call>"
    )
    parsed = parse_output(text, get_tool_parser("glm47"), SPECS)
    assert parsed.text == "Checking."
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("search", {"query": "2024", "limit": 3, "filters": {"lang": "en"}}),
        ("execute_python_code", {"code": "print(1)\nprint(2)"}),
    ]
    assert "must be integer" in (
        calls_of(
            "<tool_call>search<arg_key>query</arg_key><arg_value>x</arg_value><arg_key>limit</arg_key>"
            "<arg_value>many</arg_value></tool_call>",
            "glm47",
        )[0][2]
        or ""
    )
    assert 'no "name"' in (
        calls_of("<tool_call><arg_key>q</arg_key><arg_value>x</arg_value></tool_call>", "glm47")[0][2] or ""
    )
    assert "unterminated" in (calls_of("<tool_call>search<arg_key>query", "glm47")[0][2] or "")


def test_kimi_k2_native_calls_keep_the_models_id() -> None:
    text = (
        "Let me run it.<|tool_calls_section_begin|>"
        '<|tool_call_begin|>functions.execute_python_code:0<|tool_call_argument_begin|>{"code": "print(1)"}<|tool_call_end|>'
        '<|tool_call_begin|>functions.search:1<|tool_call_argument_begin|>{"query": "x", "limit": 2}<|tool_call_end|>'
        "<|tool_calls_section_end|>"
    )
    parsed = parse_output(text, get_tool_parser("kimi_k2"), SPECS)
    assert parsed.text == "Let me run it."
    assert [(c.name, c.arguments, c.call_id) for c in parsed.tool_calls] == [
        ("execute_python_code", {"code": "print(1)"}, "functions.execute_python_code:0"),
        ("search", {"query": "x", "limit": 2}, "functions.search:1"),
    ]
    bad = calls_of(
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.search:0<|tool_call_argument_begin|>{oops"
        "<|tool_call_end|><|tool_calls_section_end|>",
        "kimi_k2",
    )
    assert bad[0][0] == "search" and "not valid JSON" in (bad[0][2] or "")
    assert "no <|tool_call_begin|>" in (
        calls_of("<|tool_calls_section_begin|>x<|tool_calls_section_end|>", "kimi_k2")[0][2] or ""
    )


def test_minimax_m2_native_calls_several_invokes_per_section() -> None:
    text = (
        'Plan.\n<minimax:tool_call>\n<invoke name="search">\n<parameter name="query">007</parameter>\n'
        '<parameter name="exact">true</parameter>\n<parameter name="tags">["a", 1]</parameter>\n</invoke>\n'
        '<invoke name="execute_python_code">\n<parameter name="code">x = \'<b>\'\nprint(x)</parameter>\n</invoke>\n'
        "</minimax:tool_call>"
    )
    parsed = parse_output(text, get_tool_parser("minimax_m2"), SPECS)
    assert parsed.text == "Plan."
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("search", {"query": "007", "exact": True, "tags": ["a", 1]}),
        ("execute_python_code", {"code": "x = '<b>'\nprint(x)"}),
    ]
    assert "expected <invoke" in (
        calls_of("<minimax:tool_call>junk</minimax:tool_call>", "minimax_m2")[0][2] or ""
    )
    assert "unknown tool" in (
        calls_of('<minimax:tool_call><invoke name="rm"></invoke></minimax:tool_call>', "minimax_m2")[0][2]
        or ""
    )


def test_deepseek_v32_dsml_calls() -> None:
    d = "\uff5cDSML\uff5c"
    text = (
        f'Sure.\n\n<{d}function_calls>\n<{d}invoke name="search">\n'
        f'<{d}parameter name="query" string="true">42</{d}parameter>\n'
        f'<{d}parameter name="limit" string="false">5</{d}parameter>\n'
        f'<{d}parameter name="filters" string="false">{{"a": [1, 2]}}</{d}parameter>\n</{d}invoke>\n'
        f"</{d}function_calls>"
    )
    parsed = parse_output(text, get_tool_parser("deepseek_v32"), SPECS)
    assert parsed.text == "Sure."
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("search", {"query": "42", "limit": 5, "filters": {"a": [1, 2]}})
    ]
    bad = calls_of(
        f'<{d}function_calls><{d}invoke name="search"><{d}parameter name="limit" string="false">five'
        f"</{d}parameter></{d}invoke></{d}function_calls>",
        "deepseek_v32",
    )
    assert bad[0][0] == "search" and "not JSON" in (bad[0][2] or "")


def test_deepseek_v3_and_v31_calls() -> None:
    begin, end = "<\uff5ctool\u2581calls\u2581begin\uff5c>", "<\uff5ctool\u2581calls\u2581end\uff5c>"
    call_begin, sep, call_end = (
        "<\uff5ctool\u2581call\u2581begin\uff5c>",
        "<\uff5ctool\u2581sep\uff5c>",
        "<\uff5ctool\u2581call\u2581end\uff5c>",
    )
    v31 = f'{begin}{call_begin}search{sep}{{"query": "x"}}{call_end}{end}'
    v3 = f'{begin}{call_begin}function{sep}search\n```json\n{{"query": "y"}}\n```{call_end}{end}'
    assert calls_of(v31, "deepseek_v3") == [("search", {"query": "x"}, None)]
    assert calls_of(v3, "deepseek_v3") == [("search", {"query": "y"}, None)]


def test_every_parser_explains_its_format() -> None:
    for name in available_tool_parsers():
        parser = get_tool_parser(name)
        assert parser.expected_format
        message = parser.explain_error("bad JSON", "x" * 1000)
        assert message.startswith("Error: invalid tool call: bad JSON.")
        assert message.endswith(f"Expected format: {parser.expected_format}")
        assert f"Your call: {'x' * parser.shown_call_chars}...\n" in message  # long calls are cut
