"""DeepSeek V3.2's chat format, rendered in Python (the model ships an encoder, not a Jinja template).

Written from the format's facts: ``<｜begin▁of▁sentence｜>`` then the system prompt (tools appended
as JSON schemas in ``<functions>``), user turns ``<｜User｜>…<｜Assistant｜>`` followed by ``<think>``
(thinking, last user turn) or ``</think>``, assistant turns ``reasoning</think>content`` with DSML tool
calls, closed by ``<｜end▁of▁sentence｜>``, and tool results appended after the turn as
``<function_results><result>…</result></function_results>`` followed by ``<think>``/``</think>``.
Reasoning is only rendered for assistant turns after the last user message (earlier turns drop it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
USER = "<\uff5cUser\uff5c>"
ASSISTANT = "<\uff5cAssistant\uff5c>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
DSML = "\uff5cDSML\uff5c"

DEFAULT_TOOLS_PREAMBLE = (
    "## Tools\n"
    "Call a tool by writing a block in this format (several invokes may follow each other):\n"
    f"<{DSML}function_calls>\n"
    f'<{DSML}invoke name="TOOL_NAME">\n'
    f'<{DSML}parameter name="ARGUMENT" string="true|false">VALUE</{DSML}parameter>\n'
    f"</{DSML}invoke>\n"
    f"</{DSML}function_calls>\n"
    'Write strings as they are with string="true"; write numbers, booleans, arrays and objects as JSON '
    'with string="false".\n'
    "The tools, as JSON schemas:"
)
"""Our wording of the tool instructions; pass ``tools_preamble=`` (a template kwarg) to use DeepSeek's."""


class DeepSeekEncodingError(ValueError):
    """The messages cannot be written in DeepSeek V3.2's format."""


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _tool_calls_text(tool_calls: Sequence[Mapping[str, Any]]) -> str:
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
    return f"\n\n<{DSML}function_calls>\n" + "\n".join(invokes) + f"\n</{DSML}function_calls>"


def render_deepseek_v32(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = True,
    enable_thinking: bool = True,
    tools_preamble: str = DEFAULT_TOOLS_PREAMBLE,
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
        tools_preamble: the text introducing the tool list.

    Raises:
        DeepSeekEncodingError: a message out of order (a late system message, a user or assistant
            message before every tool call has its result, a result without a call) or an unknown role.
    """
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    parts = [BOS]
    start = 0
    system = (messages[0].get("content") or "") if messages and messages[0].get("role") == "system" else None
    if system is not None or tools:
        text = system or ""
        if tools:
            schemas = "\n".join(_json(tool.get("function", tool)) for tool in tools)
            text += ("\n\n" if text else "") + f"{tools_preamble}\n<functions>\n{schemas}\n</functions>\n"
        parts.append(text)
        start = 1 if system is not None else 0
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
                parts.append(_tool_calls_text(calls))
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
