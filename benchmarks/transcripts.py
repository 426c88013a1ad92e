"""Deterministic multi-turn tool-use transcripts for the provider benchmark.

Every episode is a DAPO-style math problem solved with 1 to 8 tool-calling turns and then a final
answer. Tool outputs have exact token counts (100 to 4,000 Qwen3 tokens, log-uniform), and the texts
are fixed by the seed, so ours, the peer and the Strands floor do identical work. The same data
drives the dev server (its scripted replies) and the driver (tool outputs looked up by the code
the model "wrote").

Building needs a tokenizer (for exact tool-output sizes); reading a saved file does not, so the
driver can import this module in any interpreter.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

TOOL_NAME = "execute_python_code"
SYSTEM_PROMPT = (
    "You are a careful competition mathematician. Think step by step. When a computation is "
    "tedious, call the Python tool: the code you send is executed and everything it prints comes "
    "back to you. Check the printed output before you rely on it. End your reply with "
    "'Answer: \\boxed{N}' where N is the final integer answer."
)
MIN_TOOL_TOKENS = 100
MAX_TOOL_TOKENS = 4000
MAX_TOOL_TOKENS_PER_EPISODE = 24_000
"""Keeps the longest episode well inside the server's context (set to 64k by the benchmark)."""
PARALLEL_CALL_SHARE = 0.15
"""Share of tool turns that make two calls at once (Strands runs them concurrently)."""

_WORDS = (
    "the value of each term sum product modulo prime divisor remainder sequence integer count "
    "pairs triangle circle radius area angle polynomial root coefficient factor case check "
    "result total step answer bound lower upper even odd square cube digit base fraction"
).split()
_THINK_WORDS = (
    "so if we let n be the number then the condition means that we need to count how many "
    "cases work and I should verify this with a quick computation before answering because "
    "the arithmetic is easy to get wrong by hand"
).split()


def _tool_text_source(rng: random.Random, lines: int) -> str:
    """Text that looks like what Python prints: tables, floats, lists, words."""
    out = []
    for index in range(lines):
        kind = rng.randrange(4)
        if kind == 0:
            out.append(f"n={index:5d}  f(n)={rng.randrange(10**9)}  ratio={rng.random():.6f}")
        elif kind == 1:
            out.append(str([rng.randrange(1000) for _ in range(rng.randrange(4, 12))]))
        elif kind == 2:
            out.append(" ".join(rng.choice(_WORDS) for _ in range(rng.randrange(5, 14))))
        else:
            out.append(f"({rng.randrange(100)}, {rng.randrange(100)}) -> {rng.random() * 1e4:.3f}")
    return "\n".join(out)


def _tool_output(rng: random.Random, tokenizer: Any, tokens: int) -> str:
    """A printed output of exactly ``tokens`` tokens (encoded on its own)."""
    ids = tokenizer.encode(_tool_text_source(rng, tokens // 6 + 8), add_special_tokens=False)
    while len(ids) < tokens:
        ids += tokenizer.encode("\n" + _tool_text_source(rng, tokens // 6 + 8), add_special_tokens=False)
    text = tokenizer.decode(ids[:tokens])
    # Re-encoding a cut can merge differently at the seam; trim until it encodes to the target length.
    while len(tokenizer.encode(text, add_special_tokens=False)) > tokens:
        text = text[:-1]
    return text


def _reasoning(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(_THINK_WORDS) for _ in range(rng.randrange(low, high)))


def _code(tag: str, turn: int, call: int, rng: random.Random) -> str:
    """Python the model 'writes'; the first line makes it unique, which keys the tool output."""
    limit = rng.randrange(50, 5000)
    return (
        f"# cell {tag}.{turn}.{call}\n"
        f"total = 0\nfor n in range(1, {limit}):\n"
        f"    if n % {rng.randrange(2, 13)} == {rng.randrange(2)}:\n"
        "        total += n\n        print(n, total)\nprint('total', total)"
    )


def _tool_call_markup(code: str) -> str:
    return (
        "<tool_call>\n"
        + json.dumps({"name": TOOL_NAME, "arguments": {"code": code}}, ensure_ascii=False)
        + "\n</tool_call>"
    )


def build_transcripts(count: int, tokenizer: Any, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` episodes: ``{"tag", "prompt", "turns": [{"reply", "calls": [{"code", "output",
    "output_tokens"}]}]}``; the last turn has no calls (the final answer)."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    rng = random.Random(seed)
    transcripts = []
    for index in range(count):
        tag = f"[problem {seed:03d}-{index:05d}]"
        tool_turns = rng.randint(1, 8)
        sizes: list[list[int]] = []
        for _ in range(tool_turns):
            calls = 2 if rng.random() < PARALLEL_CALL_SHARE else 1
            sizes.append(
                [
                    round(math.exp(rng.uniform(math.log(MIN_TOOL_TOKENS), math.log(MAX_TOOL_TOKENS))))
                    for _ in range(calls)
                ]
            )
        total = sum(map(sum, sizes))
        if total > MAX_TOOL_TOKENS_PER_EPISODE:
            scale = MAX_TOOL_TOKENS_PER_EPISODE / total
            sizes = [[max(MIN_TOOL_TOKENS, int(size * scale)) for size in turn] for turn in sizes]
        turns = []
        for turn_index, turn_sizes in enumerate(sizes):
            calls = []
            for call_index, size in enumerate(turn_sizes):
                code = _code(tag, turn_index, call_index, rng)
                calls.append(
                    {"code": code, "output": _tool_output(rng, tokenizer, size), "output_tokens": size}
                )
            lead = (
                "Let me compute this with Python."
                if turn_index == 0
                else "The output looks right; next step."
            )
            reply = f"<think>\n{_reasoning(rng, 40, 400)}\n</think>\n\n{lead}\n" + "\n".join(
                _tool_call_markup(call["code"]) for call in calls
            )
            turns.append({"reply": reply, "calls": calls})
        answer = rng.randrange(1000)
        turns.append(
            {
                "reply": (
                    f"<think>\n{_reasoning(rng, 40, 300)}\n</think>\n\n"
                    f"The computation gives {answer}.\n\nAnswer: \\boxed{{{answer}}}"
                ),
                "calls": [],
            }
        )
        prompt = (
            f"{tag} Let $S$ be the set of positive integers $n < 5000$ such that $n$ leaves remainder "
            f"{rng.randrange(1, 7)} when divided by 7 and $n^2 + {rng.randrange(1, 50)}$ is divisible by "
            f"{rng.randrange(3, 30)}. Find the remainder when the sum of the elements of $S$ is divided "
            "by 1000."
        )
        transcripts.append({"tag": tag, "prompt": prompt, "turns": turns})
    return transcripts


def dev_server_script(transcripts: list[dict[str, Any]]) -> dict[str, Any]:
    """The dev server's script: one rule per episode, matched by the episode's tag."""
    return {
        "rules": [{"match": t["tag"], "replies": [turn["reply"] for turn in t["turns"]]} for t in transcripts]
    }


def tool_outputs(transcripts: list[dict[str, Any]]) -> dict[str, str]:
    """Tool output by the exact code string of the call."""
    return {
        call["code"]: call["output"] for t in transcripts for turn in t["turns"] for call in turn["calls"]
    }


def summary(transcripts: list[dict[str, Any]]) -> dict[str, Any]:
    """Model calls, tool calls and tool-output tokens of a transcript set."""
    outputs = [call["output_tokens"] for t in transcripts for turn in t["turns"] for call in turn["calls"]]
    model_calls = sum(len(t["turns"]) for t in transcripts)
    return {
        "episodes": len(transcripts),
        "model_calls": model_calls,
        "model_calls_per_episode": model_calls / len(transcripts),
        "tool_calls": len(outputs),
        "tool_output_tokens_mean": sum(outputs) / max(1, len(outputs)),
        "tool_output_tokens_min": min(outputs, default=0),
        "tool_output_tokens_max": max(outputs, default=0),
    }


def save(transcripts: list[dict[str, Any]], path: Path) -> None:
    path.write_text(json.dumps(transcripts, ensure_ascii=False))


def load(path: Path) -> list[dict[str, Any]]:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list) or not all(isinstance(t, dict) and "turns" in t for t in data):
        raise ValueError(f"{path} is not a transcript file (a JSON list of episodes with 'turns')")
    return data
