"""Shared test helpers: scripted transcripts in Qwen3's tool-call format."""

from __future__ import annotations

import json
from typing import Any


def tool_call(code: str, name: str = "execute_python_code") -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": {"code": code}}) + "\n</tool_call>"


def think(text: str, content: str) -> str:
    return f"<think>\n{text}\n</think>\n\n{content}"


def solve_with_tool(match: str, code: str, answer: str) -> dict[str, Any]:
    """A two-turn transcript: one Python call, then the boxed answer."""
    return {
        "match": match,
        "replies": [
            think("I should compute this.", f"Let me run it.\n{tool_call(code)}"),
            think("The tool printed the result.", f"The result is {answer}.\n\nAnswer: \\boxed{{{answer}}}"),
        ],
    }
