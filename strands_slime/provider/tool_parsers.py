"""Parse tool calls out of the model's raw output text.

Reasoning is split off first: a call drafted inside ``<think>`` is never executed, also when the chat
template opened ``<think>`` itself and the output only contains ``</think>``. Malformed calls are kept
with an explanation (``ToolCall.error``) so the model can be told what was wrong, instead of running
the tool with ``{}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
_TOOL_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
INVALID_TOOL_NAME = "invalid_tool_call"
"""Name used for a call whose name is missing or unusable (the tool result explains the error)."""


@dataclass(slots=True)
class ToolCall:
    """One call: ``arguments`` is None and ``error`` says why when the call is malformed."""

    name: str
    arguments: dict[str, Any] | None
    raw: str
    error: str | None = None
    call_id: str | None = None
    """The id the model wrote for the call (Kimi K2's ``functions.NAME:IDX``); its result refers to it."""

    @property
    def ok(self) -> bool:
        """Whether the call parsed (no error to hand back to the model)."""
        return self.error is None


@dataclass(slots=True)
class ParsedOutput:
    """The model's output split into reasoning, visible text and tool calls."""

    reasoning: str | None
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    unclosed_reasoning: bool = False

    @property
    def parse_errors(self) -> int:
        """How many of this turn's tool calls failed to parse."""
        return sum(1 for call in self.tool_calls if call.error is not None)


def split_reasoning(text: str, *, prompt_opened_reasoning: bool = False) -> tuple[str | None, str, bool]:
    """Return ``(reasoning, content, unclosed)``.

    Everything up to the first ``</think>`` is reasoning when the prompt opened ``<think>``; otherwise
    ``<think>...</think>`` blocks anywhere are reasoning, and an unclosed ``<think>`` makes the rest of
    the output reasoning. ``unclosed`` is True when reasoning never ended.
    """
    parts: list[str] = []
    content_parts: list[str] = []
    rest = text
    if prompt_opened_reasoning:
        head, sep, tail = rest.partition(THINK_CLOSE)
        if not sep:
            return head, "", True
        parts.append(head)
        rest = tail
    while True:
        before, sep, after = rest.partition(THINK_OPEN)
        content_parts.append(before)
        if not sep:
            break
        inner, close, tail = after.partition(THINK_CLOSE)
        parts.append(inner)
        if not close:
            return _join_reasoning(parts), "".join(content_parts).strip(), True
        rest = tail
    reasoning = _join_reasoning(parts) if parts else None
    return reasoning, "".join(content_parts).strip(), False


def _join_reasoning(parts: list[str]) -> str:
    return "\n".join(part.strip("\n") for part in parts)


# --------------------------------------------------------------------------- argument validation

_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def tool_schemas(tool_specs: Sequence[Mapping[str, Any]] | None) -> dict[str, dict[str, Any]] | None:
    """Map tool name to its JSON schema from Strands ``ToolSpec``s (None means "accept any tool")."""
    if tool_specs is None:
        return None
    schemas: dict[str, dict[str, Any]] = {}
    for spec in tool_specs:
        schema = spec.get("inputSchema", {})
        schemas[spec["name"]] = dict(schema.get("json", schema) if isinstance(schema, Mapping) else {})
    return schemas


def _schema_types(schema: Mapping[str, Any]) -> list[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return [t for option in schema[key] if isinstance(option, Mapping) for t in _schema_types(option)]
    return []


def validate_arguments(name: str, arguments: dict[str, Any], schema: Mapping[str, Any]) -> str | None:
    """Check required keys, unknown keys (when ``additionalProperties`` is false) and JSON types."""
    properties = schema.get("properties") or {}
    missing = [key for key in schema.get("required") or [] if key not in arguments]
    if missing:
        return f"tool '{name}' is missing required argument(s): {', '.join(missing)}"
    if schema.get("additionalProperties") is False:
        unknown = [key for key in arguments if key not in properties]
        if unknown:
            allowed = ", ".join(properties) or "none"
            return f"tool '{name}' got unknown argument(s): {', '.join(unknown)} (allowed: {allowed})"
    for key, value in arguments.items():
        expected = _schema_types(properties.get(key) or {})
        if expected and not any(_JSON_TYPES.get(kind, lambda _v: True)(value) for kind in expected):
            got = type(value).__name__ if value is not None else "null"
            return f"argument '{key}' of tool '{name}' must be {' or '.join(expected)}, got {got}"
    return None


def _check_call(name: Any, arguments: Any, raw: str, schemas: dict[str, dict[str, Any]] | None) -> ToolCall:
    if not isinstance(name, str) or not name.strip():
        return ToolCall(INVALID_TOOL_NAME, None, raw, 'the tool call has no "name" string')
    name = name.strip()
    if not _TOOL_NAME_RE.match(name):
        return ToolCall(INVALID_TOOL_NAME, None, raw, f"invalid tool name {name!r}")
    if schemas is not None and name not in schemas:
        available = ", ".join(sorted(schemas)) or "none"
        return ToolCall(name, None, raw, f"unknown tool '{name}' (available: {available})")
    if not isinstance(arguments, dict):
        kind = "null" if arguments is None else type(arguments).__name__
        return ToolCall(name, None, raw, f"\"arguments\" of tool '{name}' must be a JSON object, got {kind}")
    if schemas is not None:
        problem = validate_arguments(name, arguments, schemas[name])
        if problem:
            return ToolCall(name, None, raw, problem)
    return ToolCall(name, arguments, raw)


# --------------------------------------------------------------------------- parsers


class ToolParser:
    """Base class: find the sections between ``open_tag`` and ``close_tag`` in (reasoning-free)
    content and parse the calls in each."""

    name = "base"
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"
    expected_format = ""
    """How a call must look, shown to the model after a malformed call."""
    shown_call_chars = 400
    """How much of a malformed call is quoted back to the model."""
    call_pattern: re.Pattern[str] | None = None
    """For a format whose section holds several calls: one call (each match goes to :meth:`parse_call`).
    Text between the calls, or no call at all, adds a call carrying :attr:`section_error`."""
    section_error = ""

    def explain_error(self, error: str, raw: str) -> str:
        """The tool result a malformed call gets: what was wrong, the call as written, and the format.

        Args:
            error: why the call was rejected (``ToolCall.error``).
            raw: the call's text as the model wrote it (quoted up to :attr:`shown_call_chars`).
        """
        shown = raw if len(raw) <= self.shown_call_chars else raw[: self.shown_call_chars] + "..."
        return (
            f"Error: invalid tool call: {error}.\nYour call: {shown}\nExpected format: {self.expected_format}"
        )

    def parse(
        self, content: str, tool_specs: Sequence[Mapping[str, Any]] | None = None
    ) -> tuple[str, list[ToolCall]]:
        """Return the content with tool-call markup removed, and the calls in order."""
        schemas = tool_schemas(tool_specs)
        calls: list[ToolCall] = []
        kept: list[str] = []
        rest = content
        while (start := rest.find(self.open_tag)) != -1:
            kept.append(rest[:start])
            body_start = start + len(self.open_tag)
            end = rest.find(self.close_tag, body_start)
            if end == -1:
                problem = f"unterminated {self.open_tag} (no {self.close_tag})"
                calls.append(ToolCall(INVALID_TOOL_NAME, None, rest[start:], problem))
                rest = ""
                break
            calls.extend(self.parse_section(rest[body_start:end], schemas))
            rest = rest[end + len(self.close_tag) :]
        kept.append(rest)
        return "".join(kept).strip(), calls

    def parse_section(self, body: str, schemas: dict[str, dict[str, Any]] | None) -> list[ToolCall]:
        """The calls in one section: each :attr:`call_pattern` match, or else the section as one call."""
        if self.call_pattern is None:
            return [self.parse_block(body, schemas)]
        calls = [self.parse_call(match, schemas) for match in self.call_pattern.finditer(body)]
        if self.call_pattern.sub("", body).strip() or not calls:
            calls.append(ToolCall(INVALID_TOOL_NAME, None, body.strip(), self.section_error))
        return calls

    def parse_call(self, match: re.Match[str], schemas: dict[str, dict[str, Any]] | None) -> ToolCall:
        """Parse one :attr:`call_pattern` match into a call, or a call carrying the parse error."""
        raise NotImplementedError

    def parse_block(self, body: str, schemas: dict[str, dict[str, Any]] | None) -> ToolCall:
        """Parse the body of one tool-call block into a call, or a call carrying the parse error."""
        raise NotImplementedError


class HermesToolParser(ToolParser):
    """Hermes / Qwen3 JSON: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

    name = "hermes"
    expected_format = '<tool_call>\n{"name": <tool name>, "arguments": {<argument>: <value>}}\n</tool_call>'

    def parse_block(self, body: str, schemas: dict[str, dict[str, Any]] | None) -> ToolCall:
        """Parse the body of one tool-call block into a call, or a call carrying the parse error."""
        raw = body.strip()
        try:
            payload = json.loads(raw)
        except ValueError as exc:
            return ToolCall(_salvage_name(raw), None, raw, f"invalid JSON in tool call: {exc}")
        if not isinstance(payload, dict):
            return ToolCall(INVALID_TOOL_NAME, None, raw, "a tool call must be a JSON object")
        arguments = payload.get("arguments", payload.get("parameters"))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError as exc:
                name = payload.get("name")
                label = name if isinstance(name, str) else INVALID_TOOL_NAME
                return ToolCall(label, None, raw, f'"arguments" is a string that is not JSON: {exc}')
        elif arguments is None and "arguments" not in payload and "parameters" not in payload:
            arguments = {}
        return _check_call(payload.get("name"), arguments, raw, schemas)


_FUNCTION_RE = re.compile(r"<function=([^>\n]*)>(.*?)(?:</function>|\Z)", re.DOTALL)
_PARAMETER_RE = re.compile(r"<parameter=([^>\n]*)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)


class Qwen3CoderToolParser(ToolParser):
    """Qwen3-Coder XML: ``<tool_call><function=NAME><parameter=P>value</parameter></function></tool_call>``.

    Values are typed by the tool's schema: a ``string`` parameter stays a string even when it looks
    like a number, an ``integer`` must parse as one, ``object``/``array`` are JSON."""

    name = "qwen3_coder"
    expected_format = (
        "<tool_call>\n<function=NAME>\n<parameter=NAME>\nvalue\n</parameter>\n</function>\n</tool_call>"
    )

    def parse_block(self, body: str, schemas: dict[str, dict[str, Any]] | None) -> ToolCall:
        """Parse the body of one tool-call block into a call, or a call carrying the parse error."""
        raw = body.strip()
        match = _FUNCTION_RE.search(raw)
        if match is None:
            return ToolCall(INVALID_TOOL_NAME, None, raw, "no <function=NAME> element in tool call")
        pairs = [
            (p.group(1).strip(), _strip_one_newline(p.group(2)))
            for p in _PARAMETER_RE.finditer(match.group(2))
        ]
        return _typed_arguments(match.group(1).strip(), pairs, schemas, raw)


def _strip_one_newline(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _convert_xml_value(value: str, types: list[str]) -> tuple[Any, str | None]:
    if not types or "string" in types:
        return value, None
    text = value.strip()
    for kind in types:
        if kind == "integer":
            try:
                return int(text), None
            except ValueError:
                continue
        if kind == "number":
            try:
                number = float(text)
            except ValueError:
                continue
            return (
                int(number) if number.is_integer() and "." not in text and "e" not in text.lower() else number
            ), None
        if kind == "boolean" and text.lower() in ("true", "false"):
            return text.lower() == "true", None
        if kind == "null" and text.lower() in ("null", "none", ""):
            return None, None
        if kind in ("object", "array"):
            try:
                parsed = json.loads(text)
            except ValueError:
                continue
            if isinstance(parsed, dict if kind == "object" else list):
                return parsed, None
    return None, f"must be {' or '.join(types)}, got {text[:80]!r}"


def _salvage_name(raw: str) -> str:
    match = re.search(r'"name"\s*:\s*"([a-zA-Z0-9_-]{1,64})"', raw)
    return match.group(1) if match else INVALID_TOOL_NAME


def _typed_arguments(
    name: str,
    pairs: Sequence[tuple[str, str]],
    schemas: dict[str, dict[str, Any]] | None,
    raw: str,
) -> ToolCall:
    """Arguments written as text values (XML-style formats), typed by the tool's schema."""
    properties = ((schemas or {}).get(name) or {}).get("properties") or {}
    arguments: dict[str, Any] = {}
    for key, value in pairs:
        converted, problem = _convert_xml_value(value, _schema_types(properties.get(key) or {}))
        if problem:
            return ToolCall(
                name or INVALID_TOOL_NAME, None, raw, f"argument '{key}' of tool '{name}' {problem}"
            )
        arguments[key] = converted
    return _check_call(name, arguments, raw, schemas)


_GLM_ARG_RE = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


class GLM4ToolParser(ToolParser):
    """GLM-4.5/4.6/4.7: ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>``.

    The template writes strings as they are and other values as JSON, so values are typed by the
    tool's schema."""

    name = "glm47"
    expected_format = "<tool_call>NAME<arg_key>ARGUMENT</arg_key><arg_value>value</arg_value></tool_call>"

    def parse_block(self, body: str, schemas: dict[str, dict[str, Any]] | None) -> ToolCall:
        """Parse the body of one tool-call block into a call, or a call carrying the parse error."""
        raw = body.strip()
        head, _, _ = raw.partition("<arg_key>")
        name = head.strip()
        if "</arg_key>" in head or "<arg_value>" in head:
            return ToolCall(INVALID_TOOL_NAME, None, raw, "no tool name before the first <arg_key>")
        arguments_text = raw[len(head) :]
        pairs = [(m.group(1).strip(), m.group(2)) for m in _GLM_ARG_RE.finditer(arguments_text)]
        if _GLM_ARG_RE.sub("", arguments_text).strip():
            return ToolCall(
                name or INVALID_TOOL_NAME,
                None,
                raw,
                "arguments must be <arg_key>K</arg_key><arg_value>V</arg_value> pairs",
            )
        return _typed_arguments(name, pairs, schemas, raw)


_INVOKE_RE = re.compile(r'<invoke name="([^"]*)">(.*?)</invoke>', re.DOTALL)
_MINIMAX_PARAMETER_RE = re.compile(r'<parameter name="([^"]*)">(.*?)</parameter>', re.DOTALL)


class MiniMaxM2ToolParser(ToolParser):
    """MiniMax M2/M2.x: ``<minimax:tool_call><invoke name="N"><parameter name="K">V</parameter>
    </invoke>...</minimax:tool_call>``; one section may hold several invokes. Values are typed by
    the tool's schema (the template writes non-strings as JSON)."""

    name = "minimax_m2"
    open_tag = "<minimax:tool_call>"
    close_tag = "</minimax:tool_call>"
    expected_format = (
        '<minimax:tool_call>\n<invoke name="NAME">\n<parameter name="ARGUMENT">value</parameter>\n'
        "</invoke>\n</minimax:tool_call>"
    )

    call_pattern = _INVOKE_RE
    section_error = 'expected <invoke name="NAME">...</invoke>'

    def parse_call(self, match: re.Match[str], schemas: dict[str, dict[str, Any]] | None) -> ToolCall:
        """Parse one ``<invoke>`` into a call, or a call carrying the parse error."""
        pairs = [(m.group(1), m.group(2)) for m in _MINIMAX_PARAMETER_RE.finditer(match.group(2))]
        return _typed_arguments(match.group(1).strip(), pairs, schemas, match.group(0))


_KIMI_CALL_RE = re.compile(
    r"<\|tool_call_begin\|>(.*?)<\|tool_call_argument_begin\|>(.*?)(?:<\|tool_call_end\|>|\Z)", re.DOTALL
)


class KimiK2ToolParser(ToolParser):
    """Kimi K2/K2.5: ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
    <|tool_call_argument_begin|>{JSON}<|tool_call_end|>...<|tool_calls_section_end|>``.

    The id the model wrote (``functions.NAME:IDX``) is kept: Kimi's tool results refer to it."""

    name = "kimi_k2"
    open_tag = "<|tool_calls_section_begin|>"
    close_tag = "<|tool_calls_section_end|>"
    expected_format = (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>"
        '{"ARGUMENT": value}<|tool_call_end|><|tool_calls_section_end|>'
    )

    def parse_section(self, body: str, schemas: dict[str, dict[str, Any]] | None) -> list[ToolCall]:
        """Parse one tool-call section into its calls; a malformed call carries its parse error."""
        calls = []
        for match in _KIMI_CALL_RE.finditer(body):
            call_id = match.group(1).strip()
            raw = match.group(0)
            name = call_id.split(":", 1)[0].removeprefix("functions.")
            if not match.group(0).endswith("<|tool_call_end|>"):
                calls.append(
                    ToolCall(
                        name or INVALID_TOOL_NAME,
                        None,
                        raw,
                        "unterminated call (no <|tool_call_end|>)",
                        call_id,
                    )
                )
                continue
            call = _json_arguments_call(name, match.group(2), raw, schemas)
            call.call_id = call_id
            calls.append(call)
        if not calls:
            calls.append(
                ToolCall(
                    INVALID_TOOL_NAME, None, body.strip(), "no <|tool_call_begin|> in the tool-call section"
                )
            )
        return calls


def _json_arguments_call(
    name: str, text: str, raw: str, schemas: dict[str, dict[str, Any]] | None
) -> ToolCall:
    try:
        arguments = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        return ToolCall(name or INVALID_TOOL_NAME, None, raw, f"arguments are not valid JSON: {exc}")
    return _check_call(name, arguments, raw, schemas)


_DSML = "\uff5cDSML\uff5c"
_DSML_INVOKE_RE = re.compile(rf'<{_DSML}invoke name="([^"]*)">(.*?)</{_DSML}invoke>', re.DOTALL)
_DSML_PARAMETER_RE = re.compile(
    rf'<{_DSML}parameter name="([^"]*)" string="(true|false)">(.*?)</{_DSML}parameter>', re.DOTALL
)


class DeepSeekV32ToolParser(ToolParser):
    """DeepSeek V3.2 DSML: ``<｜DSML｜function_calls><｜DSML｜invoke name="N"><｜DSML｜parameter
    name="K" string="true|false">V</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜function_calls>``;
    ``string="false"`` values are JSON."""

    name = "deepseek_v32"
    open_tag = f"<{_DSML}function_calls>"
    close_tag = f"</{_DSML}function_calls>"
    expected_format = (
        f'<{_DSML}function_calls>\n<{_DSML}invoke name="NAME">\n<{_DSML}parameter name="ARGUMENT" '
        f'string="true|false">value</{_DSML}parameter>\n</{_DSML}invoke>\n</{_DSML}function_calls>'
    )

    call_pattern = _DSML_INVOKE_RE
    section_error = f'expected <{_DSML}invoke name="NAME">'

    def parse_call(self, match: re.Match[str], schemas: dict[str, dict[str, Any]] | None) -> ToolCall:
        """Parse one DSML ``invoke`` into a call, or a call carrying the parse error."""
        name, body, raw = match.group(1).strip(), match.group(2), match.group(0)
        arguments: dict[str, Any] = {}
        for match in _DSML_PARAMETER_RE.finditer(body):
            key, is_string, value = match.groups()
            if is_string == "true":
                arguments[key] = value
                continue
            try:
                arguments[key] = json.loads(value)
            except ValueError as exc:
                return ToolCall(
                    name or INVALID_TOOL_NAME,
                    None,
                    raw,
                    f"argument '{key}' is marked string=\"false\" but is not JSON: {exc}",
                )
        if _DSML_PARAMETER_RE.sub("", body).strip():
            return ToolCall(
                name or INVALID_TOOL_NAME,
                None,
                raw,
                f'parameters must be <{_DSML}parameter name="K" string="true|false">',
            )
        return _check_call(name, arguments, raw, schemas)


class DeepSeekV4ToolParser(DeepSeekV32ToolParser):
    """DeepSeek V4 DSML: as V3.2, in a ``<｜DSML｜tool_calls>`` block instead of ``function_calls``."""

    name = "deepseek_v4"
    open_tag = f"<{_DSML}tool_calls>"
    close_tag = f"</{_DSML}tool_calls>"
    expected_format = (
        f'<{_DSML}tool_calls>\n<{_DSML}invoke name="NAME">\n<{_DSML}parameter name="ARGUMENT" '
        f'string="true|false">value</{_DSML}parameter>\n</{_DSML}invoke>\n</{_DSML}tool_calls>'
    )


_DEEPSEEK_V3_CALL_RE = re.compile(
    r"<\uff5ctool\u2581call\u2581begin\uff5c>(.*?)<\uff5ctool\u2581sep\uff5c>(.*?)<\uff5ctool\u2581call\u2581end\uff5c>",
    re.DOTALL,
)
_FENCED_JSON_RE = re.compile(r"^([^\n]*)\n```(?:json)?\n(.*?)\n```\s*$", re.DOTALL)


class DeepSeekV3ToolParser(ToolParser):
    """DeepSeek V3/V3.1: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{JSON}
    <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>`` (V3.1), or ``function<｜tool▁sep｜>NAME`` then a
    fenced JSON block (V3)."""

    name = "deepseek_v3"
    open_tag = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
    close_tag = "<\uff5ctool\u2581calls\u2581end\uff5c>"
    expected_format = (
        "<\uff5ctool\u2581calls\u2581begin\uff5c><\uff5ctool\u2581call\u2581begin\uff5c>NAME"
        '<\uff5ctool\u2581sep\uff5c>{"ARGUMENT": value}<\uff5ctool\u2581call\u2581end\uff5c>'
        "<\uff5ctool\u2581calls\u2581end\uff5c>"
    )

    call_pattern = _DEEPSEEK_V3_CALL_RE
    section_error = "expected <\uff5ctool\u2581call\u2581begin\uff5c>NAME<\uff5ctool\u2581sep\uff5c>{JSON}<\uff5ctool\u2581call\u2581end\uff5c>"

    def parse_call(self, match: re.Match[str], schemas: dict[str, dict[str, Any]] | None) -> ToolCall:
        """Parse one call (V3.1's, or V3's ``function`` with a fenced JSON block) into a call."""
        name, arguments = match.group(1).strip(), match.group(2)
        fenced = _FENCED_JSON_RE.match(arguments)
        if name == "function" and fenced:
            name, arguments = fenced.group(1).strip(), fenced.group(2)
        return _json_arguments_call(name, arguments, match.group(0), schemas)


_REGISTRY: dict[str, type[ToolParser]] = {}


def register_tool_parser(parser: type[ToolParser], *aliases: str) -> None:
    """Make a parser available to :func:`get_tool_parser` under its name and aliases."""
    for key in (parser.name, *aliases):
        _REGISTRY[key.lower()] = parser


register_tool_parser(HermesToolParser, "qwen", "qwen3", "qwen25", "json")
register_tool_parser(Qwen3CoderToolParser, "qwen3-coder", "qwen3_xml", "qwen_xml", "xml", "qwen35")
register_tool_parser(GLM4ToolParser, "glm45", "glm4", "glm4_moe")
register_tool_parser(KimiK2ToolParser, "kimi", "kimi_k25")
register_tool_parser(MiniMaxM2ToolParser, "minimax", "minimax_m25", "minimax_m27")
register_tool_parser(DeepSeekV32ToolParser, "deepseekv32", "dsml")
register_tool_parser(DeepSeekV4ToolParser, "deepseekv4")
register_tool_parser(DeepSeekV3ToolParser, "deepseekv3", "deepseek_v31", "deepseekv31")


def get_tool_parser(name: str | ToolParser | None = None) -> ToolParser:
    """A parser by name (``hermes`` by default); an instance is returned unchanged."""
    if isinstance(name, ToolParser):
        return name
    key = (name or "hermes").lower()
    if key not in _REGISTRY:
        raise ValueError(f"unknown tool parser {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[key]()


def available_tool_parsers() -> list[str]:
    """The names accepted by ``tool_parser`` in the provider config."""
    return sorted(_REGISTRY)


def parse_output(
    text: str,
    parser: ToolParser,
    tool_specs: Sequence[Mapping[str, Any]] | None = None,
    *,
    prompt_opened_reasoning: bool = False,
) -> ParsedOutput:
    """Split reasoning off, then parse tool calls from the visible content only."""
    reasoning, content, unclosed = split_reasoning(text, prompt_opened_reasoning=prompt_opened_reasoning)
    remaining, calls = parser.parse(content, tool_specs)
    return ParsedOutput(reasoning=reasoning, text=remaining, tool_calls=calls, unclosed_reasoning=unclosed)
