"""Shared test helpers: scripted transcripts in Qwen3's tool-call format."""

from __future__ import annotations

import json
import os
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


SUMMARY = "Summary: the agent printed the numbers one by one."
"""What :func:`counting_script` answers a conversation manager's summary request with."""


def counting_script(count_to: int = 4) -> list[dict[str, Any]]:
    """Print 1, 2, ... ``count_to`` with one Python call each ("Count to four"), then answer; each reply
    is chosen by the latest tool result, so a compacted history goes on where it was. Strands'
    summary request gets :data:`SUMMARY`; "Say hi" gets "hi"."""
    rules: list[dict[str, Any]] = [{"match": "Please summarize this conversation.", "replies": [SUMMARY]}]
    for k in range(count_to, 0, -1):
        reply = tool_call(f"print({k + 1})") if k < count_to else f"Counted.\n\nAnswer: \\boxed{{{count_to}}}"
        rules.append({"match": f"<tool_response>\n{k}\n", "replies": [reply]})
    rules.append({"match": "Count to four", "replies": [tool_call("print(1)")]})
    rules.append({"match": "Say hi", "replies": ["hi"]})
    return rules


NAME_ITSELF = "import ctypes\nctypes.CDLL(None).prctl(15, b'{name}', 0, 0, 0)\n"
"""Python that sets the process's name (``PR_SET_NAME``): sandboxed code says it is running."""


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def processes_named(name: str) -> list[int]:
    """Live processes whose comm is ``name`` (code names itself with :data:`NAME_ITSELF`)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm", "rb") as comm:
                    if comm.read().strip() == name.encode() and pid_alive(int(entry)):
                        found.append(int(entry))
            except OSError:
                continue
    return found


IM_END = 151645


def noncanonical_reply(tokenizer: Any, text: str) -> dict[str, Any]:
    """A scripted ``{"token_ids": ...}`` reply that decodes to ``text`` (then ``<|im_end|>``) but is not
    what BPE would choose, as a model may sample: each multi-byte token split in two vocabulary pieces
    (longest valid prefix first), or into its byte-level characters.

    Raises:
        ValueError: ``text`` has nothing to split (every token a single byte or a special token).
    """
    canonical = tokenizer.encode(text, add_special_tokens=False)
    vocab = tokenizer.get_vocab()
    added = set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    ids: list[int] = []
    for tok in canonical:
        piece = tokenizer.convert_ids_to_tokens(tok)
        if tok in added or not isinstance(piece, str) or len(piece) < 2:
            ids.append(tok)
            continue
        cuts = [(piece[:cut], piece[cut:]) for cut in range(len(piece) - 1, 0, -1)]
        pair = next(([vocab[a], vocab[b]] for a, b in cuts if a in vocab and b in vocab), None)
        ids.extend(pair or ([vocab[char] for char in piece] if all(c in vocab for c in piece) else [tok]))
    if ids == canonical or tokenizer.decode(ids) != text:
        raise ValueError(f"{text[:40]!r} has no non-canonical tokenization")
    return {"token_ids": [*ids, IM_END]}
