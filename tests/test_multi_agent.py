"""Several agents in one episode through ``generate``: sub-agents from the rollout config (an agent used
as a tool, nested, parallel in one turn), a sub-agent a user's tool builds, frozen agents, and an agent
with its own reward. Every output the scripted server sampled is in exactly one returned sample with
mask 1, right after the ids it was sampled from; nothing else has mask 1."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strands import Agent, tool
from strands.multiagent import GraphBuilder, Swarm
from threaded_app import devserver_in_thread

from benchmarks.devserver_reference import scripted_output_logprobs
from benchmarks.fault_injection import ReplyRecorder
from strands_slime import generate
from strands_slime.cli import RolloutOptions, slime_args
from strands_slime.config import ConfigError, parse_config
from strands_slime.devserver import DevServer
from strands_slime.provider.chat import tool_specs_to_template_tools
from strands_slime.provider.model import SGLangModel
from strands_slime.provider.recorder import Recorder
from strands_slime.provider.trajectory import mask_runs
from strands_slime.rollout.fanout import normalize_by_group_index
from strands_slime.rollout.offline import sampling_params
from strands_slime.rollout.slime_compat import Sample

pytestmark = pytest.mark.unit

VERIFIER_PROMPT = "You check a proposed answer and reply VERIFIED or WRONG."
CHECKER_PROMPT = "You recheck arithmetic for the verifier."
BUILDER_PROMPT = "You are a helper built inside a tool."


def call(name: str, text: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": {"input": text}}) + "\n</tool_call>"


def handoff(to: str) -> str:
    arguments = {"agent_name": to, "message": "please write it up"}
    return (
        "<tool_call>\n" + json.dumps({"name": "handoff_to_agent", "arguments": arguments}) + "\n</tool_call>"
    )


def ask(name: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": {"question": "2+2"}}) + "\n</tool_call>"


SCRIPT = [
    {"match": CHECKER_PROMPT, "replies": ["<think>\n2+2 is 4.\n</think>\n\nCORRECT"]},
    {
        "match": VERIFIER_PROMPT,
        "replies": [
            f"<think>\nLet me verify.\n</think>\n\nAsking the checker.\n{call('checker', '2+2=4?')}",
            "<think>\nThe checker agrees.\n</think>\n\nVERIFIED",
        ],
    },
    {"match": BUILDER_PROMPT, "replies": ["<think>\nHelping.\n</think>\n\nHELPED"]},
    {
        "match": "Solve NESTED",
        "replies": [
            f"<think>\nCheck it.\n</think>\n\n{call('verifier', 'Is 4 right?')}",
            "Answer: \\boxed{4}",
        ],
    },
    {
        "match": "Solve TWICE",
        "replies": [
            call("verifier", "Is 4 right?") + "\n" + call("verifier_b", "Is 4 right?"),
            call("verifier", "Again: is 4 right?"),
            "Answer: \\boxed{4}",
        ],
    },
    {
        "match": "Solve BUILT",
        "replies": [
            "<tool_call>\n"
            + json.dumps({"name": "ask_helper", "arguments": {"question": "help"}})
            + "\n</tool_call>",
            "Answer: \\boxed{4}",
        ],
    },
    {"match": "Solve ALONE", "replies": ["Answer: \\boxed{4}"]},
    {"match": "ROLE-R", "replies": [handoff("writer"), "Handed off."]},
    {"match": "ROLE-W", "replies": ["<think>\nWriting.\n</think>\n\nWRITTEN"]},
    {"match": "ROLE-A", "replies": ["A-DONE"]},
    {"match": "ROLE-B", "replies": ["B-DONE"]},
    {"match": "Solve TEAM", "replies": [ask("ask_team"), "Answer: \\boxed{4}"]},
    {"match": "Solve GRAPH", "replies": [ask("ask_graph"), "Answer: \\boxed{4}"]},
]

OPTIONS = RolloutOptions(data=Path("unused"), out=Path("unused"), max_response_len=1024)

VERIFIER = {"name": "verifier", "description": "Checks an answer.", "system_prompt": VERIFIER_PROMPT}
CHECKER = {
    "name": "checker",
    "description": "Rechecks arithmetic.",
    "system_prompt": CHECKER_PROMPT,
    "parent": "verifier",
}


@pytest.fixture
async def server() -> AsyncIterator[DevServer]:
    async with DevServer("scripted", script=SCRIPT) as dev:
        dev.hooks.plugins.append(ReplyRecorder())
        yield dev


def make_args(url: str, agents: dict[str, Any] | None, **extra: Any) -> Any:
    args = slime_args(OPTIONS, url, None)
    args.strands_slime = {"tools": [], "client": {"max_retries": 0}, **({"agents": agents} if agents else {})}
    for key, value in extra.items():
        setattr(args, key, value)
    return args


def new_sample(question: str, index: int = 3) -> Sample:
    return Sample(prompt=[{"role": "user", "content": question}], label="4", index=index, group_index=0)


def sampled(server: DevServer) -> list[tuple[list[int], list[int]]]:
    """(ids sent, ids sampled) of every /generate reply."""
    return [(e["json"]["input_ids"], e["reply"]["output_ids"]) for e in server.request_log]


def trained(sample: Sample) -> list[tuple[list[int], list[int]]]:
    """(ids before, ids) of each mask-1 run, checked to carry the logprobs sampled after those ids."""
    prompt_length = len(sample.tokens) - sample.response_length
    runs = []
    for value, start, end in mask_runs(sample.loss_mask):  # type: ignore[arg-type]
        if value == 1:
            before = sample.tokens[: prompt_length + start]
            ids = sample.tokens[prompt_length + start : prompt_length + end]
            assert sample.rollout_log_probs[start:end] == pytest.approx(scripted_output_logprobs(before, ids))
            runs.append((before, ids))
    return runs


def assert_trained_once(samples: list[Sample], server: DevServer, untrained: int = 0) -> None:
    """Each sampled output in exactly one sample with mask 1 (``untrained`` of them in none)."""

    def key(pair: tuple[list[int], list[int]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return tuple(pair[0]), tuple(pair[1])

    outputs = Counter(key(pair) for pair in sampled(server))
    runs = [run for sample in samples for run in trained(sample)]
    trained_runs = Counter(key(run) for run in runs)
    assert not trained_runs - outputs, "an output trained more often than sampled, or never sampled there"
    assert sum((outputs - trained_runs).values()) == untrained
    assert sum(sum(s.loss_mask) for s in samples) == sum(len(ids) for _, ids in runs)


async def test_a_nested_sub_agent_is_trained_as_its_own_samples(server: DevServer) -> None:
    args = make_args(server.url, {"subagents": [VERIFIER, CHECKER]})
    samples = await generate(args, new_sample("Solve NESTED: 2+2"), sampling_params(OPTIONS))
    assert isinstance(samples, list)
    assert [s.metadata["agent"] for s in samples] == ["main", "verifier", "checker"]
    assert [s.metadata["agent_role"] for s in samples] == ["main", "sub", "sub"]
    main, verifier, checker = samples
    assert main.metadata["parent_agent"] is None and main.metadata["parent_tool_call"] is None
    assert verifier.metadata["parent_agent"] == "main" and verifier.metadata["parent_tool_call"]
    assert checker.metadata["parent_agent"] == "verifier"
    assert checker.metadata["parent_tool_call"] != verifier.metadata["parent_tool_call"]
    assert {s.rollout_id for s in samples} == {3}
    assert all(s.metadata["agent_samples"] == 3 and s.metadata["agent_segment"] == 0 for s in samples)
    assert all(s.status == Sample.Status.COMPLETED for s in samples)
    assert all(s.metadata["final_text"].endswith("\\boxed{4}") for s in samples)  # the episode's reward
    assert_trained_once(samples, server)
    # each sub-agent's sample is its own conversation: its system prompt, not the main agent's
    from strands_slime.rollout.metrics import compute_rollout_metrics

    alone = await generate(args, new_sample("Solve ALONE", index=4), sampling_params(OPTIONS))
    metrics = compute_rollout_metrics([samples, alone])
    assert metrics["samples"] == 4 and metrics["tool_calls/mean"] == 0.5, "each episode counted once"
    texts = [server_decode(server, s.tokens) for s in samples]
    assert VERIFIER_PROMPT in texts[1] and VERIFIER_PROMPT not in texts[0] and CHECKER_PROMPT in texts[2]


def server_decode(server: DevServer, ids: list[int]) -> str:
    from strands_slime.provider.tokenizer import load_tokenizer

    return load_tokenizer().decode(ids)


async def test_parallel_sub_agents_and_a_second_call_give_one_segment_per_call(server: DevServer) -> None:
    second = {**VERIFIER, "name": "verifier_b"}
    args = make_args(server.url, {"subagents": [VERIFIER, second]})
    samples = await generate(args, new_sample("Solve TWICE: 2+2"), sampling_params(OPTIONS))
    agents = [(s.metadata["agent"], s.metadata["agent_segment"]) for s in samples]
    assert agents == [("main", 0), ("verifier", 0), ("verifier", 1), ("verifier_b", 0)]
    calls = [s.metadata["parent_tool_call"] for s in samples[1:]]
    assert len(set(calls)) == 3, "each segment names the tool call that started it"
    assert_trained_once(samples, server)


async def test_frozen_and_untrained_agents_are_left_out(server: DevServer) -> None:
    args = make_args(server.url, {"subagents": [VERIFIER, CHECKER], "frozen": ["checker"]})
    samples = await generate(args, new_sample("Solve NESTED: 2+2"), sampling_params(OPTIONS))
    assert [s.metadata["agent"] for s in samples] == ["main", "verifier"]
    assert_trained_once(samples, server, untrained=1)  # the checker's one reply
    server.clear_request_log()
    elsewhere = f"http://localhost:{server.url.rsplit(':', 1)[1]}"  # the same engine under another URL
    args = make_args(server.url, {"subagents": [{**VERIFIER, "base_url": elsewhere}, CHECKER]})
    samples = await generate(args, new_sample("Solve NESTED: 2+2"), sampling_params(OPTIONS))
    assert [s.metadata["agent"] for s in samples] == ["main", "checker"], "another server: never trained"
    assert_trained_once(samples, server, untrained=2)  # the verifier's two replies


def helper_tools(episode: Any) -> list[Any]:
    """A tool that builds its sub-agent's model itself, without recorder= (it joins the active record)."""
    url = episode.model.client.base_url

    @tool
    async def ask_helper(question: str) -> str:
        """Ask a helper agent.

        Args:
            question: what to ask.
        """
        model = SGLangModel(episode.tokenizer, base_url=url, name="helper")
        helper = Agent(
            model=model, system_prompt=BUILDER_PROMPT, callback_handler=None, plugins=[model.plugin()]
        )
        return str(await helper.invoke_async(question))

    return [ask_helper]


def team_tools(episode: Any) -> list[Any]:
    """A Swarm of two agents behind one tool: the researcher hands off to the writer."""

    @tool
    async def ask_team(question: str) -> str:
        """Ask the team.

        Args:
            question: what to ask.
        """
        nodes = [
            node_agent(episode, "researcher", "ROLE-R: you research.", "Finds facts."),
            node_agent(episode, "writer", "ROLE-W: you write.", "Writes answers."),
        ]
        result = await Swarm(nodes).invoke_async(question)
        return str(result.status)

    return [ask_team]


async def graph_tools(episode: Any) -> list[Any]:
    """A Graph a -> b behind one tool (an async factory)."""

    @tool
    async def ask_graph(question: str) -> str:
        """Ask the graph.

        Args:
            question: what to ask.
        """
        builder = GraphBuilder()
        builder.add_node(node_agent(episode, "a", "ROLE-A: first.", "First step."), "a")
        builder.add_node(node_agent(episode, "b", "ROLE-B: second.", "Second step."), "b")
        builder.add_edge("a", "b")
        builder.set_max_node_executions(4)
        result = await builder.build().invoke_async(question)
        return str(result.status)

    return [ask_graph]


def node_agent(episode: Any, name: str, system_prompt: str, description: str) -> Agent:
    model = episode.new_model(name)
    return Agent(
        model=model,
        name=name,
        description=description,
        system_prompt=system_prompt,
        callback_handler=None,
        plugins=[model.plugin()],
    )


async def test_a_model_built_in_a_users_tool_joins_the_episode(server: DevServer) -> None:
    args = make_args(server.url, {"tool_factories": [f"{__name__}.helper_tools"]})
    samples = await generate(args, new_sample("Solve BUILT"), sampling_params(OPTIONS))
    assert isinstance(samples, list) and [s.metadata["agent"] for s in samples] == ["main", "helper"]
    assert samples[1].metadata["parent_agent"] == "main" and samples[1].metadata["agent_role"] == "sub"
    assert_trained_once(samples, server)


async def test_a_swarm_in_a_tool_trains_each_node(server: DevServer) -> None:
    args = make_args(server.url, {"tool_factories": [f"{__name__}.team_tools"]})
    samples = await generate(args, new_sample("Solve TEAM"), sampling_params(OPTIONS))
    assert [s.metadata["agent"] for s in samples] == ["main", "researcher", "writer"]
    assert {s.metadata["parent_agent"] for s in samples[1:]} == {"main"}
    assert len({s.metadata["parent_tool_call"] for s in samples[1:]}) == 1, "both under main's one call"
    assert_trained_once(samples, server)


async def test_a_graph_in_a_tool_trains_each_node(server: DevServer) -> None:
    args = make_args(server.url, {"tool_factories": [f"{__name__}.graph_tools"]})
    samples = await generate(args, new_sample("Solve GRAPH"), sampling_params(OPTIONS))
    assert [s.metadata["agent"] for s in samples] == ["main", "a", "b"]
    assert_trained_once(samples, server)


async def test_a_single_agent_episode_returns_one_sample_without_agent_keys(server: DevServer) -> None:
    sample = await generate(make_args(server.url, None), new_sample("Solve ALONE"), sampling_params(OPTIONS))
    assert isinstance(sample, Sample) and "agent" not in sample.metadata and sample.rollout_id is None


async def verifier_reward(args: Any, sample: Any) -> float:
    return 0.5


async def test_an_agent_with_its_own_reward_is_normalized_on_its_own_track(server: DevServer) -> None:
    path = f"{__name__}.verifier_reward"
    args = make_args(server.url, {"subagents": [VERIFIER, CHECKER], "rewards": {"verifier": path}})
    episodes = [
        await generate(args, new_sample("Solve NESTED: 2+2", index=i), sampling_params(OPTIONS))
        for i in (1, 2)
    ]
    flat = [s for episode in episodes for s in episode]
    verifier = [s for s in flat if s.metadata["agent"] == "verifier"]
    assert [s.reward for s in verifier] == [0.5, 0.5]
    assert all(s.metadata["reward_track"] == "verifier" for s in verifier)
    others = [s for s in flat if s.metadata["agent"] != "verifier"]
    assert all(s.reward is None and "reward_track" not in s.metadata for s in others)
    rewards = {1: 1.0, 2: 0.0}
    for s in others:
        s.reward = rewards[s.rollout_id]
    args.advantage_estimator, args.rewards_normalization, args.grpo_std_normalization = "grpo", True, True
    args.reward_key = None
    _, normalized = normalize_by_group_index(args, flat)
    by_agent = {(s.rollout_id, s.metadata["agent"]): value for s, value in zip(flat, normalized, strict=True)}
    assert by_agent[(1, "verifier")] == by_agent[(2, "verifier")] == 0.0  # equal rewards on its track
    assert by_agent[(1, "main")] == by_agent[(1, "checker")] > 0 > by_agent[(2, "main")]


def test_the_agents_config_is_checked_up_front() -> None:
    for agents, message in [
        ({"subagents": [{**VERIFIER, "name": "main"}]}, "'main' is the episode's own agent"),
        ({"subagents": [VERIFIER, VERIFIER]}, "duplicate names verifier"),
        ({"subagents": [{**CHECKER, "parent": "nobody"}]}, "neither main nor a sub-agent"),
        ({"subagents": [{**VERIFIER, "parent": "checker"}, CHECKER]}, "its own ancestor"),
        ({"train": ["verifier"]}, "must match main"),
        ({"frozen": ["m*"]}, "must not match main"),
        ({"rewards": {"*": "strands_slime.reward.dapo.scoring_text"}}, "matches main"),
        ({"rewards": {"v": "strands_slime.reward.no_such_function"}}, "is not a function"),
        ({"subagents": [{**VERIFIER, "name": "has space"}]}, "subagents.0.name"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_config({"agents": agents})


async def test_sub_agents_are_refused_with_partial_rollout(server: DevServer) -> None:
    args = make_args(server.url, {"subagents": [VERIFIER]}, partial_rollout=True)
    with pytest.raises(
        ConfigError,
        match=r"agents\.subagents / agents\.tool_factories does not work with slime's --partial-rollout",
    ):
        await generate(args, new_sample("Solve NESTED: 2+2"), sampling_params(OPTIONS))


def test_a_model_outside_an_episode_keeps_its_own_recorder() -> None:
    assert Recorder.active() is None
    record = Recorder()
    with record.activate():
        assert Recorder.active() is record
        assert [record.join("a").name, record.join("a").name, record.join().name] == ["a", "a-2", "model-2"]
    assert Recorder.active() is None


class AbortAfterFirstReply:
    """A dev-server plugin that raises slime's abort flag once the first reply went out."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    async def around(self, request: Any, entry: Any, answer: Any) -> Any:
        reply = await answer()
        self.event.set()
        return reply

    def routes(self) -> list[Any]:
        return []


async def test_slimes_abort_stops_every_agent(server: DevServer) -> None:
    event = threading.Event()
    server.hooks.plugins.append(AbortAfterFirstReply(event))
    args = make_args(server.url, {"subagents": [VERIFIER, CHECKER]}, abort_event=event)
    samples = await generate(args, new_sample("Solve NESTED: 2+2"), sampling_params(OPTIONS))
    assert len(server.request_log) == 1, "no agent sent a request after the abort"
    assert [s.metadata["agent"] for s in samples] == ["main"]
    assert samples[0].status == Sample.Status.ABORTED and samples[0].metadata["abort_source"] == "slime"


@pytest.mark.integration
async def test_several_agents_through_a_worker_process_equal_in_process() -> None:
    """The episode executor's worker returns the same samples as the in-process episode."""
    from strands_slime.rollout.executor import shutdown_executors

    async with DevServer("scripted", script=SCRIPT) as dev:
        results = []
        for executor in ({}, {"executor": {"workers": 1, "oversubscribe": True}}):
            args = make_args(dev.url, {"subagents": [VERIFIER, CHECKER]})
            args.strands_slime.update(executor)
            results.append(await generate(args, new_sample("Solve NESTED: 2+2"), sampling_params(OPTIONS)))
        await shutdown_executors()
    local, remote = results
    assert [s.metadata["agent"] for s in remote] == ["main", "verifier", "checker"]
    assert all(s.metadata["parent_tool_call"] for s in remote[1:])
    assert [same_across_runs(s) for s in remote] == [same_across_runs(s) for s in local]


def same_across_runs(sample: Sample) -> dict[str, Any]:
    """What two runs of one episode must agree on (the session and the tool-call ids are random per run)."""
    from test_executor import comparable

    fields = comparable(sample)
    fields.pop("session_id")
    fields["metadata"].pop("parent_tool_call")
    return fields


# ---------------------------------------------------------------------- the property, over random trees

EPISODES: dict[int, Any] = {}
"""The running episode of each property example (sample index -> episode), read after generate."""
TREES: dict[int, list[tuple[str, str, bool]]] = {}
"""sample index -> the sub-agents: (name, parent, preserve_context)."""
PLANNED: dict[int, dict[str, list[list[str]]]] = {}
"""sample index -> what each agent calls per reply."""
SNAPSHOTS: dict[tuple[int, str], dict[int, tuple[list[dict[str, Any]], Any]]] = {}
"""(sample index, agent) -> segment number -> (its transcript, its tool specs) after each invocation."""


def tree_tools(episode: Any) -> list[Any]:
    """The sub-agents of the example's tree, each one a tool of its parent (``Agent.as_tool``); the
    transcript of the segment each invocation leaves is kept for the fresh render."""
    from strands.hooks import AfterInvocationEvent

    index = episode.sample.index
    EPISODES[index] = episode
    tree = TREES[index]

    def build(name: str, preserve: bool) -> Any:
        model = episode.new_model(name)
        children = [build(child, keep) for child, parent, keep in tree if parent == name]
        agent = Agent(
            model=model,
            name=name,
            system_prompt=system_prompt(name, PLANNED[index][name]),
            tools=children,
            callback_handler=None,
            plugins=[model.plugin()],
        )

        def snapshot(event: AfterInvocationEvent) -> None:
            segments = SNAPSHOTS.setdefault((index, name), {})
            specs = event.agent.tool_registry.get_all_tool_specs()
            segments[len(model.lane.closed)] = (model.transcript(), specs)

        agent.add_hook(snapshot, AfterInvocationEvent)
        return agent.as_tool(name=name, description=f"Helper {name}.", preserve_context=preserve)

    return [build(child, keep) for child, parent, keep in tree if parent == "main"]


def calls(names: list[str]) -> str:
    return "\n".join(
        "<tool_call>\n" + json.dumps({"name": n, "arguments": {"input": f"task for {n}"}}) + "\n</tool_call>"
        for n in names
    )


NODES = [f"n{k}" for k in range(3)]
ROUND_CALLS = [[a] for a in NODES] + [[a, b] for a in NODES for b in NODES]
"""What one reply may call: one sub-agent, or two in parallel (the same one twice included: Strands
answers the second with an error, as an agent runs one request at a time)."""


def plan_code(rounds: list[list[str]]) -> str:
    return "[PLAN " + "/".join("+".join(names) for names in rounds) + "]"


PLANS = [[]] + [[a] for a in ROUND_CALLS] + [[a, [b]] for a in ROUND_CALLS for b in NODES]
PLAN_SCRIPT = [
    {
        "match": plan_code(rounds),
        "replies": [f"Calling.\n{calls(names)}" for names in rounds] + ["DONE. Answer: \\boxed{4}"],
    }
    for rounds in sorted(PLANS, key=len, reverse=True)  # "[PLAN n0]" is no substring of another code
]
"""One rule per plan: an agent whose system prompt holds a plan's code calls what it says, one round
per reply, then answers (a reply past the last repeats the answer)."""


@pytest.fixture(scope="module")
def plan_server() -> Iterator[DevServer]:
    with devserver_in_thread("scripted", script=PLAN_SCRIPT) as running:
        running.hooks.plugins.append(ReplyRecorder())
        yield running


def system_prompt(name: str, rounds: list[list[str]]) -> str:
    return f"{plan_code(rounds)} AGENT-{name}: do your part."


@st.composite
def trees(draw: st.DrawFn) -> tuple[list[tuple[str, str, bool]], dict[str, list[list[str]]], list[str]]:
    """Sub-agents n0..nk (each under main or an earlier one), what each agent calls per reply (one
    child or two in parallel, then one), and the frozen ones."""
    count = draw(st.integers(1, len(NODES)))
    tree = []
    for k in range(count):
        parent = draw(st.sampled_from(["main", *NODES[:k]]))
        tree.append((NODES[k], parent, draw(st.booleans())))
    rounds: dict[str, list[list[str]]] = {}
    for name in ["main", *[n for n, _, _ in tree]]:
        children = [n for n, parent, _ in tree if parent == name]
        turns = draw(st.integers(1 if name == "main" else 0, 2)) if children else 0
        rounds[name] = []
        if turns:
            first = draw(st.lists(st.sampled_from(children), min_size=1, max_size=2))
            rounds[name] = [first, [draw(st.sampled_from(children))]][:turns]
    frozen = draw(st.lists(st.sampled_from([n for n, _, _ in tree]), unique=True, max_size=2))
    return tree, rounds, frozen


@settings(
    max_examples=15, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
@given(example=trees())
def test_every_agents_sampled_outputs_are_trained_once_in_a_fresh_render_of_its_conversation(
    qwen3_tokenizer: Any, plan_server: DevServer, example: Any
) -> None:
    """Any tree of agents as tools (nested, parallel calls, preserve_context or not, some frozen): each
    output of a trained agent is in exactly one sample with mask 1 after the ids it was sampled from;
    a frozen agent's in none; each output of a sample follows a fresh chat-template render of its
    agent's conversation before it."""
    tree, rounds, frozen = example
    plan_server.clear_request_log()
    asyncio.run(_tree_episode(qwen3_tokenizer, plan_server, tree, rounds, frozen))


async def _tree_episode(tokenizer: Any, dev: DevServer, tree: Any, rounds: Any, frozen: list[str]) -> None:
    index = len(TREES) + 100
    TREES[index] = tree
    PLANNED[index] = rounds
    args = make_args(dev.url, {"tool_factories": [f"{__name__}.tree_tools"], "frozen": frozen or ["none"]})
    args.strands_slime["system_prompt"] = system_prompt("main", rounds["main"])
    samples = await generate(args, new_sample("Solve PROP", index=index), sampling_params(OPTIONS))
    frozen_outputs = sum(
        any(f"AGENT-{name}:" in tokenizer.decode(ids) for name in frozen) for ids, _ in sampled(dev)
    )
    assert all(s.status == Sample.Status.COMPLETED for s in samples), samples[0].metadata
    assert_trained_once(samples, dev, untrained=frozen_outputs)
    episode = EPISODES.pop(index)
    templater = episode.model.templater
    assert samples[0].metadata["agent"] == "main"
    assert not {s.metadata["agent"] for s in samples} & set(frozen)
    for sample in samples:
        agent, number = sample.metadata["agent"], sample.metadata["agent_segment"]
        if agent == "main":
            transcript, specs = episode.model.transcript(), episode.agent.tool_registry.get_all_tool_specs()
        else:
            transcript, specs = SNAPSHOTS[(index, agent)][number]
        assert_fresh_render(tokenizer, templater, sample, transcript, tool_specs_to_template_tools(specs))


def assert_fresh_render(tokenizer: Any, templater: Any, sample: Sample, transcript: Any, tools: Any) -> None:
    """Before each output of ``sample``: the template's render of the conversation up to that output
    (with its generation prompt); the output: the assistant message's text."""
    prompt_length = len(sample.tokens) - sample.response_length
    assistants = [i for i, message in enumerate(transcript) if message["role"] == "assistant"]
    outputs = [(start, end) for value, start, end in mask_runs(sample.loss_mask) if value == 1]
    assert len(outputs) == len(assistants), "one output per assistant turn of the agent"
    for position, (start, _) in zip(assistants, outputs, strict=True):
        rendered = templater.render(transcript[:position], tools, add_generation_prompt=True)
        assert tokenizer.decode(sample.tokens[: prompt_length + start]) == rendered
