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
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
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

    @property
    def ok(self) -> bool:
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
    """Base class: find tool-call blocks in (reasoning-free) content."""

    name = "base"

    def parse(
        self, content: str, tool_specs: Sequence[Mapping[str, Any]] | None = None
    ) -> tuple[str, list[ToolCall]]:
        """Return the content with tool-call markup removed, and the calls in order."""
        schemas = tool_schemas(tool_specs)
        calls: list[ToolCall] = []
        for match in _TOOL_CALL_RE.finditer(content):
            calls.append(self.parse_block(match.group(1), schemas))
        remaining = _TOOL_CALL_RE.sub("", content)
        dangling = remaining.rfind("<tool_call>")
        if dangling != -1:
            raw = remaining[dangling:]
            calls.append(ToolCall(INVALID_TOOL_NAME, None, raw, "unterminated <tool_call> (no </tool_call>)"))
            remaining = remaining[:dangling]
        return remaining.strip(), calls

    def parse_block(self, body: str, schemas: dict[str, dict[str, Any]] | None) -> ToolCall:
        raise NotImplementedError


class HermesToolParser(ToolParser):
    """Hermes / Qwen3 JSON: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

    name = "hermes"

    def parse_block(self, body: str, schemas: dict[str, dict[str, Any]] | None) -> ToolCall:
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

    def parse_block(self, body: str, schemas: dict[str, dict[str, Any]] | None) -> ToolCall:
        raw = body.strip()
        match = _FUNCTION_RE.search(raw)
        if match is None:
            return ToolCall(INVALID_TOOL_NAME, None, raw, "no <function=NAME> element in tool call")
        name = match.group(1).strip()
        properties = ((schemas or {}).get(name) or {}).get("properties") or {}
        arguments: dict[str, Any] = {}
        for param in _PARAMETER_RE.finditer(match.group(2)):
            key = param.group(1).strip()
            value = _strip_one_newline(param.group(2))
            converted, problem = _convert_xml_value(value, _schema_types(properties.get(key) or {}))
            if problem:
                return ToolCall(
                    name or INVALID_TOOL_NAME, None, raw, f"argument '{key}' of tool '{name}' {problem}"
                )
            arguments[key] = converted
        return _check_call(name, arguments, raw, schemas)


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


_REGISTRY: dict[str, type[ToolParser]] = {}


def register_tool_parser(parser: type[ToolParser], *aliases: str) -> None:
    """Make a parser available to :func:`get_tool_parser` under its name and aliases."""
    for key in (parser.name, *aliases):
        _REGISTRY[key.lower()] = parser


register_tool_parser(HermesToolParser, "qwen", "qwen3", "qwen25", "json")
register_tool_parser(Qwen3CoderToolParser, "qwen3-coder", "qwen3_xml", "qwen_xml", "xml")


def get_tool_parser(name: str | ToolParser | None = None) -> ToolParser:
    """A parser by name (``hermes`` by default); an instance is returned unchanged."""
    if isinstance(name, ToolParser):
        return name
    key = (name or "hermes").lower()
    if key not in _REGISTRY:
        raise ValueError(f"unknown tool parser {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[key]()


def available_tool_parsers() -> list[str]:
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
