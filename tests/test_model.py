"""SGLangModel fidelity: real Qwen3 tokenizer and templates, real HTTP to the dev server."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator
from typing import Any

import pytest
from helpers import noncanonical_reply, think, tool_call
from strands import Agent, tool
from strands.agent.conversation_manager import NullConversationManager
from strands.hooks import AfterModelCallEvent
from strands.types.exceptions import MaxTokensReachedException
from waiting import wait_until

from benchmarks.devserver_reference import scripted_output_logprobs
from benchmarks.fault_injection import inject_fault
from strands_slime.devserver import DevServer
from strands_slime.errors import (
    ContextLimitExceeded,
    GenerationAborted,
    ModelCallLimitReached,
    ResponseBudgetExhausted,
    ToolLimitReached,
    find_episode_end,
)
from strands_slime.provider.client import SGLangClient
from strands_slime.provider.limits import ToolIterationLimiter, ToolLimiter
from strands_slime.provider.model import SGLangModel
from strands_slime.provider.trajectory import mask_runs

pytestmark = pytest.mark.unit

IM_END = 151645
CALLS: list[str] = []


@tool
async def execute_python_code(code: str) -> str:
    """Execute Python code and return what it prints.

    Args:
        code: The program to run.
    """
    CALLS.append(code)
    await asyncio.sleep(0.05 if "slow" in code else 0)
    return f"ran: {code}"


def thinking_only_template(hybrid: str) -> str:
    start = hybrid.index("{%- if add_generation_prompt %}")
    return (
        hybrid[:start]
        + "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n<think>\\n' }}\n{%- endif %}\n"
    )


def make_agent(model: SGLangModel, *hooks: Any, tools: list[Any] | None = None, plugin: Any = None) -> Agent:
    return Agent(
        model=model,
        tools=[execute_python_code] if tools is None else tools,
        callback_handler=None,
        conversation_manager=NullConversationManager(),
        retry_strategy=None,
        hooks=list(hooks),
        plugins=[model.plugin() if plugin is None else plugin],
    )


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    CALLS.clear()


async def serve(script: Any, **options: Any) -> DevServer:
    return await DevServer(backend="scripted", script=script, **options).start()


@pytest.fixture
async def server_factory() -> AsyncIterator[Any]:
    started: list[DevServer] = []
    clients: list[SGLangClient] = []

    async def factory(script: Any, **options: Any) -> tuple[DevServer, SGLangClient]:
        server = await serve(script, **options)
        client = SGLangClient(server.url, retry_delay=0.01, max_retry_delay=0.05)
        started.append(server)
        clients.append(client)
        return server, client

    yield factory
    for client in clients:
        await client.close()
    for server in started:
        await server.stop()


THREE_TURNS = [
    {
        "match": "triangle",
        "replies": [
            think("Compute area.", "Computing.\n" + tool_call("print(3*4/2)")),
            think("Check once more.", tool_call("print(6)") + "\n" + tool_call("print('slow', 6.0)")),
            think("Done.", "Answer: \\boxed{6}"),
        ],
    }
]


def assert_append_only(server: DevServer, model: SGLangModel) -> None:
    """Every request extends the previous request's input + output; the trajectory is the last one."""
    requests = [entry["json"] for entry in server.request_log]
    outputs: list[list[int]] = []
    for value, start, end in mask_runs(model.trajectory.loss_mask):
        if value == 1:
            outputs.append(model.trajectory.token_ids[start:end].tolist())
    assert len(requests) == len(outputs)
    for previous, output, current in zip(requests, outputs, requests[1:], strict=False):
        assert (
            current["input_ids"][: len(previous["input_ids"]) + len(output)] == previous["input_ids"] + output
        )
    assert model.trajectory.token_ids.tolist() == requests[-1]["input_ids"] + outputs[-1]
    for request in requests:
        assert "logprob_start_len" not in request and request["return_logprob"] is True
    mask = model.trajectory.loss_mask
    assert sum(mask) == sum(len(o) for o in outputs)
    model.trajectory.check()


@pytest.mark.parametrize("style", ["hybrid", "thinking_only", "instruct", "hybrid_no_think"])
async def test_multi_turn_episode_is_append_only(
    qwen3_tokenizer: Any, server_factory: Any, style: str
) -> None:
    from pathlib import Path

    template = None
    kwargs: dict[str, Any] = {}
    script = THREE_TURNS
    if style == "thinking_only":
        template = thinking_only_template(qwen3_tokenizer.chat_template)
        script = [
            {
                "match": "triangle",
                "replies": [
                    "Compute area.\n</think>\n\n" + tool_call("print(3*4/2)"),
                    "Done.\n</think>\n\nAnswer: \\boxed{6}",
                ],
            }
        ]
    elif style == "instruct":
        template = (Path(__file__).parent / "data" / "templates" / "chatml_instruct.jinja").read_text()
    elif style == "hybrid_no_think":
        kwargs["enable_thinking"] = False
    server, client = await server_factory(script)
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client, chat_template=template, **kwargs)
    result = await make_agent(model).invoke_async("Area of the triangle with legs 3 and 4?")
    assert result.stop_reason == "end_turn"
    assert_append_only(server, model)
    assert model.trajectory.token_ids[-1] == IM_END
    assert model.token_manager is model.trajectory and model.token_manager.segments[0]
    # Prompt positions carry 0.0, outputs the server's logprobs unchanged.
    requests = [entry["json"] for entry in server.request_log]
    t = model.trajectory
    outputs = [(s, e) for v, s, e in mask_runs(t.loss_mask) if v == 1]
    for request, (start, end) in zip(requests, outputs, strict=True):
        expected = scripted_output_logprobs(request["input_ids"], t.token_ids[start:end].tolist())
        assert t.logprobs[start:end].tolist() == pytest.approx(expected, abs=0)
    assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m == 0)
    if style == "hybrid_no_think":
        text = qwen3_tokenizer.decode(t.token_ids.tolist())
        assert text.count("<think>\n\n</think>\n\n") == len(requests)


async def test_a_finished_episode_is_freed_by_reference_counting(
    qwen3_tokenizer: Any, server_factory: Any
) -> None:
    """Nothing of an episode (model, plugin, trajectory) is in a reference cycle, so it is freed the
    moment the episode is dropped. The rollout's GC tuning runs full collections rarely: cyclic garbage
    (~100 objects and the token arrays of every episode) would pile up in the oldest generation."""
    _, client = await server_factory(THREE_TURNS)
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    plugin = model.plugin()
    agent = make_agent(model, plugin=plugin)
    result = await agent.invoke_async("Area of the triangle with legs 3 and 4?")
    assert result.stop_reason == "end_turn" and len(model.trajectory.token_ids) > 0
    alive = [weakref.ref(model), weakref.ref(model.trajectory), weakref.ref(plugin), weakref.ref(agent)]
    gc.disable()  # what is freed now is freed by reference counting alone
    try:
        del model, plugin, agent, result
        assert [ref() is None for ref in alive] == [True] * len(alive)
    finally:
        gc.enable()


async def test_parallel_results_follow_call_order(qwen3_tokenizer: Any, server_factory: Any) -> None:
    calls = "\n".join(tool_call(f"print({i})" + (" # slow" if i % 3 == 0 else "")) for i in range(12))
    script = [{"match": "many", "replies": [calls, "Answer: \\boxed{1}"]}]
    server, client = await server_factory(script)
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    await make_agent(model).invoke_async("many calls please")
    second = qwen3_tokenizer.decode(server.request_log[1]["json"]["input_ids"])
    tail = second[second.rindex("<|im_start|>user") :]
    positions = [tail.index(f"ran: print({i})") for i in range(12)]
    assert positions == sorted(positions), "tool results must be ordered by call (numerically)"
    assert_append_only(server, model)


async def test_noncanonical_output_ids_come_back_unchanged(qwen3_tokenizer: Any, server_factory: Any) -> None:
    text = "Hello world, photosynthesis happens.\n" + tool_call("print('hello')")
    script = [
        {"match": "split", "replies": [noncanonical_reply(qwen3_tokenizer, text), "Answer: \\boxed{2}"]}
    ]
    server, client = await server_factory(script)
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    await make_agent(model).invoke_async("split words")
    t = model.trajectory
    first_output = next(t.token_ids[s:e].tolist() for v, s, e in mask_runs(t.loss_mask) if v == 1)
    canonical = qwen3_tokenizer.encode(text, add_special_tokens=False) + [IM_END]
    assert first_output != canonical and qwen3_tokenizer.decode(first_output[:-1]) == text
    assert CALLS == ["print('hello')"], "the tool call is still parsed from the non-canonical ids"
    assert_append_only(server, model)


async def test_seed_quick_start(qwen3_tokenizer: Any, server_factory: Any) -> None:
    """The strands-sglang 0.1.x quick start, with only the import changed."""
    server, _ = await server_factory(THREE_TURNS)
    from strands_slime import SGLangModel as SeedModel
    from strands_slime import ToolIterationLimiter as SeedLimiter

    model = SeedModel(tokenizer=qwen3_tokenizer, base_url=server.url, params={"max_new_tokens": 1024})
    agent = Agent(
        model=model, tools=[execute_python_code], hooks=[SeedLimiter(max_iterations=5)], callback_handler=None
    )
    await agent.invoke_async("triangle area?")
    tm = model.token_manager
    assert len(tm.token_ids) == len(tm.loss_mask) == len(tm.logprobs) > 0
    assert tm.segments[0] == tm.token_ids[: len(tm.segments[0])].tolist()
    model.reset()
    assert model.token_manager.token_ids.tolist() == []
    await model.client.close()


async def test_tool_call_drafted_in_reasoning_is_not_executed(
    qwen3_tokenizer: Any, server_factory: Any
) -> None:
    draft = tool_call("import shutil; shutil.rmtree('/')")
    script = [
        {
            "match": "careful",
            "replies": [f"Maybe {draft}? No.\n</think>\n\nNo tool needed. Answer: \\boxed{{1}}"],
        }
    ]
    server, client = await server_factory(script)
    template = thinking_only_template(qwen3_tokenizer.chat_template)
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client, chat_template=template)
    result = await make_agent(model).invoke_async("be careful")
    assert CALLS == [] and result.stop_reason == "end_turn"
    assert len(server.request_log) == 1
    blocks = result.message["content"]
    assert any("reasoningContent" in b for b in blocks) and not any("toolUse" in b for b in blocks)


@pytest.mark.parametrize(
    ("bad_call", "reason"),
    [
        (
            '<tool_call>\n{"name": "execute_python_code", "arguments": {"code": "x}\n</tool_call>',
            "invalid JSON",
        ),
        ('<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>', "unknown tool 'rm_rf'"),
        (
            '<tool_call>\n{"name": "execute_python_code", "arguments": {"code": 7}}\n</tool_call>',
            "must be string",
        ),
        ('<tool_call>\n{"arguments": {"code": "1"}}\n</tool_call>', 'no "name"'),
    ],
)
async def test_malformed_call_returns_an_explanation(
    qwen3_tokenizer: Any, server_factory: Any, bad_call: str, reason: str
) -> None:
    script = [{"match": "oops", "replies": [bad_call, "Answer: \\boxed{0}"]}]
    server, client = await server_factory(script)
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    await make_agent(model).invoke_async("oops")
    assert CALLS == [], "a malformed call never runs the tool"
    second = qwen3_tokenizer.decode(server.request_log[1]["json"]["input_ids"])
    response = second[second.rindex("<tool_response>") :]
    assert "invalid tool call" in response and reason in response and "Expected format" in response
    assert model.stats.parse_errors == 1
    assert_append_only(server, model)


async def test_length_finish_keeps_truncated_output(qwen3_tokenizer: Any, server_factory: Any) -> None:
    script = [{"match": "long", "replies": ["word " * 200]}]
    _server, client = await server_factory(script)
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client, sampling_params={"max_new_tokens": 16})
    with pytest.raises(MaxTokensReachedException):
        await make_agent(model).invoke_async("long answer")
    t = model.trajectory
    assert sum(t.loss_mask) == 16 and t.token_ids[-1] != IM_END
    assert model.stats.finish_reasons == ["length"]


async def test_response_budget_spans_the_episode(qwen3_tokenizer: Any, server_factory: Any) -> None:
    """slime's rollout_max_response_len counts every token after the first prompt, tool text included."""
    server, client = await server_factory(THREE_TURNS)
    budget = 1000
    model = SGLangModel(
        tokenizer=qwen3_tokenizer,
        client=client,
        max_response_tokens=budget,
        sampling_params={"max_new_tokens": 900},
    )
    await make_agent(model).invoke_async("triangle")
    requests = [entry["json"] for entry in server.request_log]
    prompt_len = model.trajectory.initial_prompt_length
    for request in requests:
        used = len(request["input_ids"]) - prompt_len
        assert request["sampling_params"]["max_new_tokens"] == min(900, budget - used)
    assert requests[0]["sampling_params"]["max_new_tokens"] == 900
    assert requests[-1]["sampling_params"]["max_new_tokens"] < 900


async def test_exhausted_budget_raises_typed_error_before_sending(
    qwen3_tokenizer: Any, server_factory: Any
) -> None:
    server, client = await server_factory(THREE_TURNS)
    first_reply = THREE_TURNS[0]["replies"][0]
    first_output = len(qwen3_tokenizer.encode(first_reply, add_special_tokens=False)) + 1
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client, max_response_tokens=first_output + 1)
    with pytest.raises(Exception) as info:
        await make_agent(model).invoke_async("triangle")
    ended = find_episode_end(info.value)
    assert isinstance(ended, ResponseBudgetExhausted)
    assert ended.used == first_output and ended.pending > 1
    assert len(server.request_log) == 1, "nothing is sent once the budget cannot hold the tool result"
    assert model.trajectory.ends_with_output and model.trajectory.response_length == first_output


async def test_budget_cap_truncates_a_turn(qwen3_tokenizer: Any, server_factory: Any) -> None:
    server, client = await server_factory(THREE_TURNS)
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client, max_response_tokens=10)
    with pytest.raises(MaxTokensReachedException):
        await make_agent(model).invoke_async("triangle")
    assert server.request_log[0]["json"]["sampling_params"]["max_new_tokens"] == 10
    assert model.trajectory.response_length == 10


async def test_context_limit_caps_max_new_tokens_and_overflows_cleanly(
    qwen3_tokenizer: Any, server_factory: Any
) -> None:
    first_reply = THREE_TURNS[0]["replies"][0]
    first_output = len(qwen3_tokenizer.encode(first_reply, add_special_tokens=False)) + 1
    probe, _ = await server_factory(THREE_TURNS)
    prompt = "triangle " + "pad " * 150
    probe_model = SGLangModel(tokenizer=qwen3_tokenizer, base_url=probe.url)
    await make_agent(probe_model).invoke_async(prompt)
    prompt_len = probe_model.trajectory.initial_prompt_length
    await probe_model.client.close()
    # Room for the first output but not for the tool result that follows it.
    context = prompt_len + first_output + 5
    server, client = await server_factory(THREE_TURNS, context_length=context)
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client, sampling_params={"max_new_tokens": 4096})
    with pytest.raises(Exception) as info:
        await make_agent(model).invoke_async(prompt)
    first = server.request_log[0]["json"]
    assert first["sampling_params"]["max_new_tokens"] == context - len(first["input_ids"])
    ended = find_episode_end(info.value)
    assert isinstance(ended, ContextLimitExceeded) and ended.limit == context
    assert len(server.request_log) == 1 and model.trajectory.ends_with_output


async def test_speculative_decoding_margin_avoids_context_400s(
    qwen3_tokenizer: Any, server_factory: Any
) -> None:
    """Under EAGLE speculative decoding SGLang counts the draft tokens as prompt tokens; the provider
    reads them from /server_info and leaves that margin, so no request is ever refused."""
    first_reply = THREE_TURNS[0]["replies"][0]
    first_output = len(qwen3_tokenizer.encode(first_reply, add_special_tokens=False)) + 1
    probe, _ = await server_factory(THREE_TURNS)
    prompt = "triangle " + "pad " * 150
    probe_model = SGLangModel(tokenizer=qwen3_tokenizer, base_url=probe.url)
    await make_agent(probe_model).invoke_async(prompt)
    prompt_len = probe_model.trajectory.initial_prompt_length
    await probe_model.client.close()
    drafts = 6
    context = prompt_len + drafts + first_output + 5  # room for the first output, not the tool result
    server, client = await server_factory(
        THREE_TURNS,
        context_length=context,
        speculative_algorithm="EAGLE3",
        speculative_num_draft_tokens=drafts,
    )
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client, sampling_params={"max_new_tokens": 4096})
    with pytest.raises(Exception) as info:
        await make_agent(model).invoke_async(prompt)
    assert [entry["status"] for entry in server.request_log] == [200]
    first = server.request_log[0]["json"]
    assert first["sampling_params"]["max_new_tokens"] == context - drafts - len(first["input_ids"])
    ended = find_episode_end(info.value)
    assert isinstance(ended, ContextLimitExceeded) and ended.limit == context - drafts
    assert model.trajectory.ends_with_output


async def test_prompt_over_context_is_typed(qwen3_tokenizer: Any, server_factory: Any) -> None:
    server, client = await server_factory(THREE_TURNS, context_length=64)
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client, use_server_context_length=False)
    with pytest.raises(ContextLimitExceeded):
        await make_agent(model).invoke_async("triangle " * 100)
    assert len(server.request_log) == 1, "the server's 400 is not retried"
    assert model.trajectory.token_ids.tolist() == []


async def test_abort_while_running_raises_with_partial_trajectory(
    qwen3_tokenizer: Any, server_factory: Any
) -> None:
    script = [{"match": "slowly", "replies": ["one two three four five six seven eight nine ten " * 5]}]
    server, client = await server_factory(script, token_latency=0.01)
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    task = asyncio.create_task(make_agent(model).invoke_async("slowly"))
    assert server.scheduler is not None
    scheduler = server.scheduler
    await wait_until(lambda: scheduler.total_generated_tokens >= 5, what="the reply to be under way")
    await client.abort(abort_all=True)
    with pytest.raises(Exception) as info:
        await task
    ended = find_episode_end(info.value)
    assert isinstance(ended, GenerationAborted) and not ended.queued
    partial = ended.trajectory
    assert 0 < sum(partial.loss_mask) < 60 and partial.token_ids[-1] != IM_END
    partial.check()
    assert model.trajectory.token_ids.tolist() == [], "an aborted turn is not a finished turn"


async def test_abort_while_queued(qwen3_tokenizer: Any, server_factory: Any) -> None:
    script = [{"match": "queue", "replies": ["a b c d e f g h " * 10]}]
    server, client = await server_factory(script, token_latency=0.01, max_running_requests=1)
    models = [SGLangModel(tokenizer=qwen3_tokenizer, client=client) for _ in range(2)]
    tasks = [asyncio.create_task(make_agent(m).invoke_async("queue")) for m in models]
    assert server.scheduler is not None
    scheduler = server.scheduler
    await wait_until(
        lambda: scheduler.num_running == 1 and scheduler.num_waiting == 1, what="one running, one queued"
    )
    await client.abort(abort_all=True)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    ends = [find_episode_end(r) for r in results]
    assert all(isinstance(e, GenerationAborted) for e in ends)
    assert sorted(e.queued for e in ends) == [False, True]  # type: ignore[union-attr]


async def test_abort_flag_stops_before_sending(qwen3_tokenizer: Any, server_factory: Any) -> None:
    server, client = await server_factory(THREE_TURNS)
    aborted = False

    def check() -> bool:
        return aborted

    @tool
    async def execute_python_code(code: str) -> str:
        """Run code.

        Args:
            code: program
        """
        nonlocal aborted
        aborted = True  # slime aborts while the tool runs
        return "1"

    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client, abort_check=check)
    with pytest.raises(Exception) as info:
        await make_agent(model, tools=[execute_python_code]).invoke_async("triangle")
    assert isinstance(find_episode_end(info.value), GenerationAborted)
    assert len(server.request_log) == 1, "no request after the abort"


async def test_retried_turn_leaves_no_duplicate_segment(qwen3_tokenizer: Any, server_factory: Any) -> None:
    server, client = await server_factory(THREE_TURNS)
    retried = {"done": False}

    def retry_second_call(event: AfterModelCallEvent) -> None:
        if event.stop_response is not None and not retried["done"] and len(server.request_log) == 2:
            retried["done"] = True
            event.retry = True

    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    agent = make_agent(model)
    agent.add_hook(retry_second_call, AfterModelCallEvent)
    await agent.invoke_async("triangle")
    assert retried["done"] and len(server.request_log) == 4
    assert model.stats.rolled_back_turns == 1
    # Requests 2 and 3 are the same turn sent twice: identical inputs, no stale segment.
    log = [entry["json"]["input_ids"] for entry in server.request_log]
    assert log[1] == log[2]
    t = model.trajectory
    assert t.num_outputs == 3 and t.token_ids[: len(log[3])].tolist() == log[3]
    t.check()


async def test_tool_limiter_stops_on_a_message_boundary(qwen3_tokenizer: Any, server_factory: Any) -> None:
    loop_script = [{"match": "loop", "replies": [tool_call("print(1)")]}]
    server, client = await server_factory(loop_script)
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    limiter = ToolLimiter(max_tool_iters=2)
    with pytest.raises(Exception) as info:
        await make_agent(model, limiter).invoke_async("loop forever")
    ended = find_episode_end(info.value)
    assert isinstance(ended, ToolLimitReached)
    assert limiter.tool_iter_count == 2 and limiter.tool_call_count == 2 and len(CALLS) == 2
    assert len(server.request_log) == 3 and model.trajectory.ends_with_output
    assert model.trajectory.token_ids[-1] == IM_END


async def test_tool_call_limit_counts_parallel_calls(qwen3_tokenizer: Any, server_factory: Any) -> None:
    two = tool_call("print(1)") + "\n" + tool_call("print(2)")
    _server, client = await server_factory([{"match": "pair", "replies": [two]}])
    limiter = ToolLimiter(max_tool_calls=3)
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    with pytest.raises(Exception) as info:
        await make_agent(model, limiter).invoke_async("pair")
    assert isinstance(find_episode_end(info.value), ToolLimitReached)
    assert (limiter.tool_iter_count, limiter.tool_call_count) == (1, 2)
    seed = ToolIterationLimiter(max_iterations=4)
    assert seed.max_iterations == 4 and seed.iteration_count == 0


async def test_model_call_cap(qwen3_tokenizer: Any, server_factory: Any) -> None:
    server, client = await server_factory([{"match": "loop", "replies": [tool_call("print(1)")]}])
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    with pytest.raises(Exception) as info:
        await make_agent(model, ToolLimiter(max_model_calls=4)).invoke_async("loop")
    assert isinstance(find_episode_end(info.value), ModelCallLimitReached)
    assert len(server.request_log) == 4


async def test_503_burst_is_absorbed_by_the_client(qwen3_tokenizer: Any, server_factory: Any) -> None:
    server, client = await server_factory(THREE_TURNS)
    inject_fault(server, status=503, count=3)
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    result = await make_agent(model).invoke_async("triangle")
    assert result.stop_reason == "end_turn" and model.trajectory.num_outputs == 3


async def test_usage_metadata_and_config(qwen3_tokenizer: Any, server_factory: Any) -> None:
    _server, client = await server_factory(THREE_TURNS)
    model = SGLangModel(
        tokenizer=qwen3_tokenizer, client=client, model_id="qwen3", sampling_params={"top_p": 0.9}
    )
    result = await make_agent(model).invoke_async("triangle")
    usage = result.message["metadata"]["usage"]
    assert usage["outputTokens"] > 0 and usage["inputTokens"] > 0
    assert model.get_config()["model_id"] == "qwen3"
    model.update_config(params={"temperature": 0.5})
    assert model.sampling_params == {"temperature": 0.5}
    assert model.stats.model_calls == 3 and model.stats.cached_tokens > 0
    transcript = model.transcript()
    assert [m["role"] for m in transcript] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]


def test_constructor_validation(qwen3_tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        SGLangModel(tokenizer=qwen3_tokenizer)
    with pytest.raises(ValueError, match="exactly one"):
        SGLangModel(tokenizer=qwen3_tokenizer, base_url="http://x", client=SGLangClient("http://x"))
    with pytest.raises(ValueError, match="tokenizer"):
        SGLangModel(base_url="http://x")


def test_unknown_keywords_are_rejected_with_a_suggestion(qwen3_tokenizer: Any) -> None:
    with pytest.raises(TypeError, match=r"'max_respone_tokens' \(did you mean 'max_response_tokens'\?\)"):
        SGLangModel(tokenizer=qwen3_tokenizer, base_url="http://x", max_respone_tokens=5)
    with pytest.raises(TypeError, match=r"'tool_call_parser' \(did you mean 'tool_parser'\?\)"):
        SGLangModel(tokenizer=qwen3_tokenizer, base_url="http://x", tool_call_parser="hermes")
    with pytest.raises(TypeError, match="not both"):
        SGLangModel(tokenizer=qwen3_tokenizer, base_url="http://x", params={}, sampling_params={})
    model = SGLangModel(tokenizer=qwen3_tokenizer, base_url="http://x", params={"top_p": 0.5})
    assert model.get_config()["sampling_params"] == {"top_p": 0.5}, "the seed alias"
    with pytest.raises(TypeError, match=r"'enable_thinkng' \(did you mean 'enable_thinking'\?\)"):
        model.update_config(enable_thinkng=False)
    with pytest.raises(TypeError, match="'bogus'; known: model_id, sampling_params"):
        model.update_config(bogus=1)
    assert model.get_config()["sampling_params"] == {"top_p": 0.5}, "a rejected update changes nothing"


async def test_update_config_applies_what_get_config_shows(qwen3_tokenizer: Any, server_factory: Any) -> None:
    server, client = await server_factory(THREE_TURNS)
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client, max_response_tokens=10_000)
    config = model.get_config()
    assert set(config) == {
        "model_id",
        "sampling_params",
        "enable_thinking",
        "chat_template",
        "template_kwargs",
        "chat_family",
        "context_window_limit",
        "max_response_tokens",
        "use_server_context_length",
        "min_reply_tokens",
    }
    model.update_config(
        enable_thinking=False, sampling_params={"max_new_tokens": 512}, max_response_tokens=2048
    )
    assert model.get_config()["enable_thinking"] is False
    await make_agent(model).invoke_async("Area of the triangle with legs 3 and 4?")
    requests = [entry["json"] for entry in server.request_log]
    first_prompt = qwen3_tokenizer.decode(requests[0]["input_ids"])
    assert first_prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "thinking switched off"
    assert requests[0]["sampling_params"]["max_new_tokens"] == 512
    model.reset()
    model.update_config(max_response_tokens=8)
    with pytest.raises(MaxTokensReachedException):
        await make_agent(model).invoke_async("Area of the triangle with legs 3 and 4?")
    assert server.request_log[-1]["json"]["sampling_params"]["max_new_tokens"] <= 8
