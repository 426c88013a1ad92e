"""DeepSeek V3.2's and V4's chat formats, rendered in Python (the models ship Python encoders, not Jinja
templates).

Written from the formats' facts; DeepSeek's own encoders are what ``strands-slime drift
--template-check`` compares these with (:mod:`strands_slime.provider.reference_encoders`). The two
formats and how they differ (where tool results go, which reasoning is kept): docs/provider.md, the
chat families' notes on DeepSeek.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
USER = "<\uff5cUser\uff5c>"
ASSISTANT = "<\uff5cAssistant\uff5c>"
LATEST_REMINDER = "<\uff5clatest_reminder\uff5c>"
"""A V4 token (id 128828) that V3.2's vocabulary lacks."""
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
DSML = "\uff5cDSML\uff5c"
TOOL_SCHEMAS = "{tool_schemas}"
"""Where a tools prompt puts the tools' JSON schemas (one per line)."""


def _call_format(block: str) -> str:
    return (
        f"<{DSML}{block}>\n"
        f'<{DSML}invoke name="TOOL_NAME">\n'
        f'<{DSML}parameter name="ARGUMENT" string="true|false">VALUE</{DSML}parameter>\n'
        f"</{DSML}invoke>\n"
        f"</{DSML}{block}>\n"
    )


V32_TOOLS_PROMPT = (
    "## Tools\n"
    "Call a tool by writing a block in this format (several invokes may follow each other):\n"
    + _call_format("function_calls")
    + 'Write strings as they are with string="true"; write numbers, booleans, arrays and objects as JSON '
    'with string="false".\n'
    "The tools, as JSON schemas:\n"
    f"<functions>\n{TOOL_SCHEMAS}\n</functions>\n"
)
"""Our wording of V3.2's tool instructions (DeepSeek's are the reference encoder's ``render_tools``);
pass ``tools_prompt=`` (a template kwarg, with ``{tool_schemas}``) to use other text."""

V4_TOOLS_PROMPT = (
    "## Tools\n\n"
    "Call tools by writing a block in this format (several invokes may follow each other):\n\n"
    + _call_format("tool_calls")
    + '\nWrite strings as they are with string="true"; write numbers, booleans, arrays and objects as '
    'JSON with string="false". When thinking, finish the reasoning with </think> before any call.\n\n'
    "### The tools, as JSON schemas\n\n"
    f"{TOOL_SCHEMAS}\n"
)
"""Our wording of V4's tool instructions; ``tools_prompt=`` replaces it as for V3.2."""


class DeepSeekEncodingError(ValueError):
    """The messages cannot be written in the DeepSeek format."""


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _tools_text(tools: Sequence[Mapping[str, Any]], tools_prompt: str) -> str:
    schemas = "\n".join(_json(tool.get("function", tool)) for tool in tools)
    return tools_prompt.replace(TOOL_SCHEMAS, schemas)


def _tool_calls_text(tool_calls: Sequence[Mapping[str, Any]], block: str) -> str:
    invokes = []
    for call in tool_calls:
        function = call.get("function", call)
        arguments = function.get("arguments") or {}
        if isinstance(arguments, str):
            arguments = json.loads(arguments) if arguments.strip() else {}
        parameters = "\n".join(
            f'<{DSML}parameter name="{key}" string="{"true" if isinstance(value, str) else "false"}">'
            f"{value if isinstance(value, str) else _json(value)}</{DSML}parameter>"
            for key, value in arguments.items()
        )
        invokes.append(f'<{DSML}invoke name="{function["name"]}">\n{parameters}\n</{DSML}invoke>')
    return f"\n\n<{DSML}{block}>\n" + "\n".join(invokes) + f"\n</{DSML}{block}>"


def _system_prompt(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None, tools_prompt: str
) -> tuple[str, int]:
    """The text after BOS (system content, then the tools after a blank line, as DeepSeek's encoders
    write them into a system message, an empty one when there is none) and where the turns start."""
    has_system = bool(messages) and messages[0].get("role") == "system"
    text = (messages[0].get("content") or "") if has_system else ""
    if tools:
        text += "\n\n" + _tools_text(tools, tools_prompt)
    return text, 1 if has_system else 0


def render_deepseek_v32(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = True,
    enable_thinking: bool = True,
    tools_prompt: str = V32_TOOLS_PROMPT,
    tools_preamble: str | None = None,
    **_unused: Any,
) -> str:
    """Render chat messages (OpenAI-style, like a chat template receives them) as DeepSeek V3.2 text.

    A user or tool-result turn always ends ready for the model (``<｜Assistant｜>`` and the think
    marker), so ``add_generation_prompt`` changes nothing.

    Args:
        messages: the conversation; a system message may only come first.
        tools: OpenAI-style tool definitions, listed in the system turn.
        add_generation_prompt: accepted for the chat-template call signature; no effect (see above).
        enable_thinking: open a think block for the model after the last user turn.
        tools_prompt: the tool instructions, with ``{tool_schemas}`` where the schemas go.
        tools_preamble: the earlier option: the text before ``<functions>`` (replaces ``tools_prompt``).

    Raises:
        DeepSeekEncodingError: a message out of order (a late system message, a user or assistant
            message before every tool call has its result, a result without a call) or an unknown role.
    """
    if tools_preamble is not None:
        tools_prompt = f"{tools_preamble}\n<functions>\n{TOOL_SCHEMAS}\n</functions>\n"
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    system, start = _system_prompt(messages, tools, tools_prompt)
    parts = [BOS, system]
    pending_results = total_results = 0
    for index in range(start, len(messages)):
        message = messages[index]
        role = message.get("role")
        content = message.get("content") or ""
        thinking_here = enable_thinking and index >= last_user
        if role == "user":
            if pending_results:
                raise DeepSeekEncodingError("a user message came before every tool call had its result")
            marker = THINK_OPEN if enable_thinking and index == last_user else THINK_CLOSE
            parts.append(f"{USER}{content}{ASSISTANT}{marker}")
        elif role == "assistant":
            if pending_results:
                raise DeepSeekEncodingError("an assistant message came before every tool call had its result")
            if enable_thinking and index > last_user:
                parts.append((message.get("reasoning_content") or "") + THINK_CLOSE)
            parts.append(content)
            calls = message.get("tool_calls") or []
            if calls:
                parts.append(_tool_calls_text(calls, "function_calls"))
            parts.append(EOS)
            pending_results = len(calls)
            total_results = pending_results
        elif role == "tool":
            if not pending_results:
                raise DeepSeekEncodingError(
                    "a tool result needs an assistant message with a tool call before it (one result per call)"
                )
            if pending_results == total_results:
                parts.append("\n\n<function_results>")
            parts.append(f"\n<result>{content}</result>")
            pending_results -= 1
            if not pending_results:
                parts.append("\n</function_results>\n\n" + (THINK_OPEN if thinking_here else THINK_CLOSE))
        elif role == "system":
            raise DeepSeekEncodingError("a system message is only allowed first")
        else:
            raise DeepSeekEncodingError(f"unknown role {role!r}")
    return "".join(parts)


def _v4_turns(messages: Sequence[Mapping[str, Any]]) -> list[tuple[str, Any]]:
    """``("user", text)`` and ``("assistant", message)`` turns: consecutive tool and user messages
    make one user turn, their blocks (tool results as ``<tool_result>…</tool_result>``) joined by a
    blank line."""
    turns: list[tuple[str, Any]] = []
    for message in messages:
        role = message.get("role")
        content = message.get("content") or ""
        if role in ("user", "tool"):
            block = f"<tool_result>{content}</tool_result>" if role == "tool" else content
            if turns and turns[-1][0] == "user":
                turns[-1][1].append(block)
            else:
                turns.append(("user", [block]))
        elif role == "assistant":
            turns.append(("assistant", message))
        elif role == "system":
            raise DeepSeekEncodingError("a system message is only allowed first")
        else:
            raise DeepSeekEncodingError(f"unknown role {role!r}")
    return [(kind, "\n\n".join(value) if kind == "user" else value) for kind, value in turns]


def render_deepseek_v4(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = True,
    enable_thinking: bool = True,
    tools_prompt: str = V4_TOOLS_PROMPT,
    **_unused: Any,
) -> str:
    """Render chat messages (OpenAI-style, like a chat template receives them) as DeepSeek V4 text.

    A user turn that ends the conversation or precedes an assistant turn ends ready for the model, so
    ``add_generation_prompt`` changes nothing.

    Args:
        messages: the conversation; a system message may only come first.
        tools: OpenAI-style tool definitions, listed in the system turn. With tools, every turn
            keeps its reasoning (DeepSeek's encoder drops earlier reasoning only without tools).
        add_generation_prompt: accepted for the chat-template call signature; no effect (see above).
        enable_thinking: thinking mode (``<think>`` after user turns, reasoning before ``</think>``).
        tools_prompt: the tool instructions, with ``{tool_schemas}`` where the schemas go.

    Raises:
        DeepSeekEncodingError: a late system message or an unknown role.
    """
    system, start = _system_prompt(messages, tools, tools_prompt)
    turns = _v4_turns(messages[start:])
    keep_reasoning = bool(tools)
    last_user = max((i for i, (kind, _) in enumerate(turns) if kind == "user"), default=-1)
    parts = [BOS, system]
    for index, (kind, value) in enumerate(turns):
        if kind == "user":
            parts.append(USER + value)
            if index + 1 == len(turns) or turns[index + 1][0] == "assistant":
                thinking = enable_thinking and (keep_reasoning or index >= last_user)
                parts.append(ASSISTANT + (THINK_OPEN if thinking else THINK_CLOSE))
            continue
        if enable_thinking and (keep_reasoning or index > last_user):
            parts.append((value.get("reasoning_content") or "") + THINK_CLOSE)
        parts.append(value.get("content") or "")
        calls = value.get("tool_calls") or []
        if calls:
            parts.append(_tool_calls_text(calls, "tool_calls"))
        parts.append(EOS)
    return "".join(parts)
