"""Client CPU per model call (turn) of a two-agent episode against a one-agent episode, through ``generate``.

    python benchmarks/bench_multi_agent.py                  # 64 episodes at a time, 3 repeats
    python benchmarks/bench_multi_agent.py --episodes 32 --concurrency 16 --repeats 1   # smoke run

Both shapes make four model calls per episode with two tool calls, against the scripted dev server in a
child process (its CPU is not counted), no sandbox:

* ``one agent``: the solver calls a cheap ``note`` tool twice, then answers (4 calls);
* ``two agents``: the solver calls the ``verifier`` sub-agent (``agents.subagents``: its own model,
  agent and context, in the episode's record) and the ``note`` tool, then answers; the verifier answers
  in one call (3 + 1 calls) and generate returns two samples.

The number is this process's CPU time (``time.process_time``) over the whole batch divided by the model
calls the server answered; the two shapes alternate per repeat. Results go to docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from strands import tool

from benchmarks.devserver_runners import DevServerProcess
from strands_slime import generate
from strands_slime.cli import RolloutOptions, slime_args
from strands_slime.rollout.offline import sampling_params
from strands_slime.rollout.slime_compat import Sample

VERIFIER_PROMPT = "You verify a proposed answer and reply VERIFIED or WRONG."
REASONING = "<think>\n" + "Let me work through this carefully, step by step. " * 12 + "\n</think>\n\n"


def call(name: str, arguments: dict[str, str]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


SCRIPT = [
    {"match": VERIFIER_PROMPT, "replies": [REASONING + "VERIFIED: 34 is right."]},
    {
        "match": "ONEAGENT",
        "replies": [
            REASONING + call("note", {"text": "17 * 2"}),
            REASONING + call("note", {"text": "34"}),
            REASONING + "Answer: \\boxed{34}",
        ],
    },
    {
        "match": "TWOAGENTS",
        "replies": [
            REASONING + call("verifier", {"input": "Is 17 * 2 = 34?"}),
            REASONING + call("note", {"text": "verified"}),
            REASONING + "Answer: \\boxed{34}",
        ],
    },
]
OPTIONS = RolloutOptions(data=Path("unused"), out=Path("unused"), max_response_len=8192)


@tool
def note(text: str) -> str:
    """Write down a note.

    Args:
        text: the note.
    """
    return f"noted: {text} " + "context " * 100


def note_tools(episode: Any) -> list[Any]:
    return [note]


def config(two_agents: bool) -> dict[str, Any]:
    agents: dict[str, Any] = {"tool_factories": [f"{__name__}.note_tools"]}
    if two_agents:
        agents["subagents"] = [
            {"name": "verifier", "description": "Checks an answer.", "system_prompt": VERIFIER_PROMPT}
        ]
    return {"tools": [], "client": {"max_retries": 0}, "agents": agents}


async def batch(url: str, two_agents: bool, episodes: int, concurrency: int) -> tuple[float, int]:
    """(CPU seconds, model calls) of ``episodes`` episodes, ``concurrency`` at a time."""
    question = "TWOAGENTS: 17 times two?" if two_agents else "ONEAGENT: 17 times two?"
    semaphore = asyncio.Semaphore(concurrency)
    calls = 0

    async def one(index: int) -> None:
        nonlocal calls
        args = slime_args(OPTIONS, url, None)
        args.strands_slime = config(two_agents)
        sample = Sample(
            prompt=[{"role": "user", "content": question}], label="34", index=index, group_index=0
        )
        async with semaphore:
            result = await generate(args, sample, sampling_params(OPTIONS))
        samples = result if isinstance(result, list) else [result]
        for each in samples:
            assert each.status == Sample.Status.COMPLETED, each.metadata
        calls += sum(len(each.weight_versions) for each in samples)  # one weight version per model call

    started = time.process_time()
    await asyncio.gather(*(one(i) for i in range(episodes)))
    return time.process_time() - started, calls


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    ns = parser.parse_args(argv)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as file:
        json.dump(SCRIPT, file)
    with DevServerProcess(["--backend", "scripted", "--script", file.name]) as server:
        await batch(server.url, True, 8, 8)  # warm-up: tokenizer, client, templates
        await batch(server.url, False, 8, 8)
        results: dict[str, list[float]] = {"one agent": [], "two agents": []}
        for repeat in range(ns.repeats):
            order = [False, True] if repeat % 2 == 0 else [True, False]
            for two in order:
                cpu, calls = await batch(server.url, two, ns.episodes, ns.concurrency)
                results["two agents" if two else "one agent"].append(1000 * cpu / calls)
    one, two = (statistics.median(results[k]) for k in ("one agent", "two agents"))
    print(f"| shape | CPU ms per model call (median of {ns.repeats}) | every repeat |")
    print("|---|---|---|")
    for name, values in results.items():
        print(f"| {name} | {statistics.median(values):.2f} | {', '.join(f'{v:.2f}' for v in values)} |")
    print(f"\ntwo agents / one agent: {two / one:.3f} ({ns.episodes} episodes, {ns.concurrency} at a time)")


if __name__ == "__main__":
    asyncio.run(main())
