"""slime generate() end to end: scripted transcripts over HTTP to the dev server, real sandbox."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from helpers import NAME_ITSELF, processes_named, solve_with_tool, think, tool_call
from waiting import wait_until

from benchmarks.fault_injection import inject_fault
from strands_slime import generate
from strands_slime.cli import RolloutOptions, slime_args
from strands_slime.config import ConfigError
from strands_slime.devserver import DevServer
from strands_slime.reward.dapo import reward_func
from strands_slime.rollout.filters import drop_groups_with_infra_failures
from strands_slime.rollout.metrics import compute_rollout_metrics, log_rollout
from strands_slime.rollout.slime_compat import Sample

pytestmark = pytest.mark.integration

DAPO = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: \\boxed{{$Answer}} where $Answer is the answer to the problem.\n\n{q}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)

SLEEPY_TOOL = f"sleepy{os.getpid() % 10**7}"
"""The process name the sleepy tool call gives itself (this test run's own: other runs may share the machine)."""

SCRIPT = [
    solve_with_tool("seventeen", "print(17 * 2)", "34"),
    {"match": "looping", "replies": [think("Again.", tool_call("print(1)"))]},
    {"match": "verbose", "replies": ["blah " * 400]},
    {
        "match": "malformed",
        "replies": [
            '<tool_call>\n{"name": "execute_python_code", "arguments": {"code": "1}\n</tool_call>',
            "Answer: \\boxed{1}",
        ],
    },
    {
        "match": "sleepy",
        "replies": [
            tool_call(NAME_ITSELF.format(name=SLEEPY_TOOL) + "import time\ntime.sleep(30)"),
            "Answer: \\boxed{0}",
        ],
    },
    {"match": "slowpoke", "replies": ["one two three four " * 50]},
    {"match": "plain", "replies": ["The answer is 5.\n\nAnswer: \\boxed{5}"]},
]


@pytest.fixture
async def server() -> AsyncIterator[DevServer]:
    async with DevServer(backend="scripted", script=SCRIPT, token_latency=0.0) as running:
        yield running


def make_args(url: str, **overrides: Any) -> Any:
    options = RolloutOptions(data=Path("unused"), out=Path("unused"), max_response_len=2048)
    args = slime_args(options, url, None)
    args.strands_slime = {"sandbox": {"timeout_s": 2.0}}
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def new_sample(question: str, label: str = "34", *, as_messages: bool = True) -> Sample:
    text = DAPO.format(q=question)
    prompt: Any = [{"role": "user", "content": text}] if as_messages else text
    return Sample(prompt=prompt, label=label, index=0, group_index=0, session_id="session-abc")


PARAMS = {
    "temperature": 1.0,
    "top_p": 1.0,
    "max_new_tokens": 2048,
    "no_stop_trim": True,
    "skip_special_tokens": False,
}


def check_invariants(sample: Sample) -> None:
    assert sample.response_length >= 1
    assert len(sample.loss_mask) == len(sample.rollout_log_probs) == sample.response_length  # type: ignore[arg-type]
    assert len(sample.tokens) > sample.response_length
    for mask, logprob in zip(sample.loss_mask, sample.rollout_log_probs, strict=True):  # type: ignore[arg-type]
        assert mask in (0, 1)
        if mask == 0:
            assert logprob == 0.0
        else:
            assert logprob <= 0.0


async def run(args: Any, sample: Sample, evaluation: bool = False) -> Sample:
    # slime sends max_new_tokens = --rollout-max-response-len (the eval one in evaluation)
    budget = args.eval_max_response_len if evaluation else args.rollout_max_response_len
    expected = dict(PARAMS, max_new_tokens=budget or PARAMS["max_new_tokens"])
    params = dict(expected)
    result = await generate(args, sample, params, evaluation=evaluation)
    assert params == expected, "generate must not mutate the shared sampling params"
    assert result is sample
    check_invariants(sample)
    return sample


async def test_completed_episode_with_tool_call(server: DevServer) -> None:
    args = make_args(server.url)
    sample = await run(args, new_sample("What is seventeen times two?"))
    assert sample.status == Sample.Status.COMPLETED
    meta = sample.metadata
    assert meta["tool_iterations"] == 1 and meta["tool_calls"] == 1 and meta["tool_errors"] == 0
    assert meta["turns"] == 2 and meta["finish_reason"] == "stop" and meta["infra_error"] is None
    assert meta["sandbox_seconds"] > 0 and sample.non_generation_time == pytest.approx(
        meta["sandbox_seconds"], abs=1e-5
    )
    assert "<tool_response>\n34\n</tool_response>" in sample.response
    assert "\\boxed{34}" in meta["final_text"] and "<tool_response>" not in meta["final_text"]
    sample.reward = await reward_func(args, sample)
    assert sample.reward == 1.0
    import gc

    from strands_slime.rollout.episode import GC_THRESHOLDS

    assert gc.get_threshold()[0] >= GC_THRESHOLDS[0] > 700, "the rollout process tunes the collector once"
    # consistent hashing: every request of the episode carries the session id
    headers = [entry["headers"] for entry in server.request_log]
    assert len(headers) == 2 and all(h.get("X-SMG-Routing-Key") == "session-abc" for h in headers)


async def test_no_routing_key_without_consistent_hashing(server: DevServer) -> None:
    args = make_args(server.url, router_policy="cache_aware")
    await run(args, new_sample("What is seventeen times two?"))
    assert all("X-SMG-Routing-Key" not in entry["headers"] for entry in server.request_log)


async def test_tool_limit_truncates(server: DevServer) -> None:
    args = make_args(server.url)
    args.strands_slime = {"max_tool_iters": 2, "sandbox": {"timeout_s": 2.0}}
    sample = await run(args, new_sample("keep looping"))
    assert sample.status == Sample.Status.TRUNCATED
    assert sample.metadata["truncation"] == "tool_limit" and sample.metadata["tool_iterations"] == 2
    assert sample.loss_mask[-1] == 1, "the episode ends on the model's own output"  # type: ignore[index]


async def test_length_truncation(server: DevServer) -> None:
    args = make_args(server.url, rollout_max_response_len=64)
    sample = await run(args, new_sample("be verbose"))
    assert sample.status == Sample.Status.TRUNCATED and sample.metadata["finish_reason"] == "length"
    assert sample.response_length == 64 and all(sample.loss_mask)  # type: ignore[arg-type]


async def test_budget_exhaustion(server: DevServer) -> None:
    args = make_args(server.url, rollout_max_response_len=60)
    sample = await run(args, new_sample("What is seventeen times two?"))
    assert sample.status == Sample.Status.TRUNCATED
    assert sample.metadata["truncation"] in ("response_budget", "length")
    assert sample.response_length <= 60


async def test_context_overflow(server: DevServer) -> None:
    args = make_args(server.url, rollout_max_context_len=300)
    sample = await run(args, new_sample("What is seventeen times two? " + "pad " * 40))
    assert sample.status == Sample.Status.TRUNCATED
    assert sample.metadata["truncation"] == "context_length"
    # The prompt alone is over the limit: no request, the exact prompt and one inert response token.
    assert sample.metadata["turns"] == 0 and sample.loss_mask == [0] and len(sample.tokens) > 300


async def test_malformed_tool_call_is_reported_to_the_model(server: DevServer) -> None:
    args = make_args(server.url)
    sample = await run(args, new_sample("malformed call", label="1"))
    assert sample.status == Sample.Status.COMPLETED
    assert sample.metadata["parse_errors"] == 1
    assert "invalid tool call" in sample.response


@pytest.mark.slow  # 5 s
async def test_sandbox_timeout_is_a_tool_result(server: DevServer) -> None:
    args = make_args(server.url)
    sample = await run(args, new_sample("sleepy code", label="0"))
    assert sample.status == Sample.Status.COMPLETED
    assert sample.metadata["tool_timeouts"] == 1
    assert "timed out" in sample.response.lower()


async def test_503_burst_completes(server: DevServer) -> None:
    inject_fault(server, status=503, count=3)
    args = make_args(server.url)
    args.strands_slime = {"client": {"retry_delay_s": 0.01}, "sandbox": {"timeout_s": 2.0}}
    sample = await run(args, new_sample("What is seventeen times two?"))
    assert sample.status == Sample.Status.COMPLETED


async def test_unreachable_server_gives_a_removed_sample() -> None:
    args = make_args("http://127.0.0.1:9")
    args.strands_slime = {"client": {"max_retries": 1, "retry_delay_s": 0.01}}
    sample = await run(args, new_sample("plain"))
    assert sample.status == Sample.Status.FAILED and sample.remove_sample
    assert sample.reward == 0.0 and "Connection" in sample.metadata["infra_error"]
    assert sample.metadata["raw_reward"] == 0.0


async def test_abort_while_running(server: DevServer) -> None:
    slow = await DevServer(backend="scripted", script=SCRIPT, token_latency=0.01).start()
    try:
        aborted = threading.Event()
        args = make_args(slow.url, abort_event=aborted)
        task = asyncio.create_task(run(args, new_sample("slowpoke")))
        assert slow.scheduler is not None
        scheduler = slow.scheduler
        await wait_until(lambda: scheduler.total_generated_tokens >= 5, what="the reply to be under way")
        aborted.set()  # what slime does: set the flag, then abort every request on the servers
        from strands_slime.provider.client import SGLangClient

        async with SGLangClient(slow.url) as client:
            await client.abort(abort_all=True)
        sample = await task
        assert sample.status == Sample.Status.ABORTED and not sample.remove_sample
        assert len(slow.request_log) == 1
    finally:
        await slow.stop()


async def test_abort_while_queued() -> None:
    slow = await DevServer(
        backend="scripted", script=SCRIPT, token_latency=0.01, max_running_requests=1
    ).start()
    try:
        aborted = threading.Event()
        args = make_args(slow.url, abort_event=aborted)
        tasks = [asyncio.create_task(run(args, new_sample("slowpoke"))) for _ in range(2)]
        await wait_until(lambda: len(slow.request_log) >= 2, what="both requests to arrive")
        aborted.set()
        from strands_slime.provider.client import SGLangClient

        async with SGLangClient(slow.url) as client:
            await client.abort(abort_all=True)
        samples = await asyncio.gather(*tasks)
        assert all(s.status == Sample.Status.ABORTED for s in samples)
    finally:
        await slow.stop()


async def test_aborted_before_start_sends_nothing(server: DevServer) -> None:
    aborted = threading.Event()
    aborted.set()
    args = make_args(server.url, abort_event=aborted)
    sample = await run(args, new_sample("plain"))
    assert sample.status == Sample.Status.ABORTED and server.request_log == []


async def test_eval_mode_is_flagged_and_unshaped(server: DevServer) -> None:
    args = make_args(server.url)
    sample = await run(args, new_sample("plain question", label="6"), evaluation=True)
    assert sample.metadata["evaluation"] is True
    assert await reward_func(args, sample) == -1.0  # wrong answer, no shaping in eval
    train = await run(args, new_sample("plain question", label="6"))
    assert await reward_func(args, train) == -1.0  # no shaping by default (docs/reward.md)


async def test_recycled_partial_rollout_sample_restarts(server: DevServer) -> None:
    args = make_args(server.url, partial_rollout=True)
    sample = new_sample("What is seventeen times two?")
    sample.tokens = [1, 2, 3, 4]
    sample.response_length = 2
    sample.loss_mask = [1, 1]
    sample.rollout_log_probs = [-0.1, -0.2]
    sample.status = Sample.Status.ABORTED
    sample.metadata = {"tool_calls": 3, "dataset_key": "kept"}
    await run(args, sample)
    assert sample.status == Sample.Status.COMPLETED and sample.tokens[:4] != [1, 2, 3, 4]
    assert sample.metadata["restarts"] == 1 and sample.metadata["dataset_key"] == "kept"
    assert sample.metadata["tool_calls"] == 1


async def test_string_prompt_and_templated_prompt(server: DevServer) -> None:
    args = make_args(server.url)
    ok = await run(args, new_sample("plain string", label="5", as_messages=False))
    assert ok.status == Sample.Status.COMPLETED
    templated = Sample(prompt="<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", label="1")
    with pytest.raises(ConfigError, match="already chat-templated"):  # --apply-chat-template: stop the job
        await generate(args, templated, dict(PARAMS))
    assert (
        server.request_log[-1]["json"]["input_ids"]
        == ok.tokens[: len(server.request_log[-1]["json"]["input_ids"])]
    )


async def test_invalid_config_raises_from_the_first_call(server: DevServer) -> None:
    args = make_args(server.url)
    args.strands_slime = {"max_tool_iter": 3}  # misspelled
    with pytest.raises(ConfigError, match="max_tool_iter"):
        await generate(args, new_sample("plain"), dict(PARAMS))
    args.strands_slime = {"max_tool_iters": "many"}
    with pytest.raises(ConfigError, match="max_tool_iters"):
        await generate(args, new_sample("plain"), dict(PARAMS))
    assert server.request_log == [], "no GPU time is spent on a misconfigured job"


async def test_unsupported_chat_template_is_a_configuration_error(
    server: DevServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    template = tmp_path / "llama.jinja"
    template.write_text("{% for m in messages %}<|start_header_id|>{{ m.content }}<|eot_id|>{% endfor %}")
    args = make_args(server.url)
    args.strands_slime = {"chat_template_path": str(template)}
    for _ in range(2):
        with pytest.raises(ConfigError, match="chat_family"):
            await generate(args, new_sample("plain"), dict(PARAMS))
    assert server.request_log == [], "no GPU time is spent on a misconfigured job"
    errors = [r for r in caplog.records if "configuration error" in r.getMessage()]
    assert len(errors) == 1 and not errors[0].exc_info  # one line for the run, no traceback per sample


@pytest.mark.slow  # 13 s
async def test_metrics_and_filter(server: DevServer) -> None:
    args = make_args(server.url)
    good = await run(args, new_sample("What is seventeen times two?"))
    dead = await run(
        make_args("http://127.0.0.1:9", strands_slime={"client": {"max_retries": 0}}), new_sample("x")
    )
    metrics = compute_rollout_metrics([good, dead])
    assert metrics["status/completed"] == 0.5 and metrics["status/failed"] == 0.5
    assert metrics["infra_failures"] == 1 and metrics["tool_calls/mean"] == 0.5
    assert log_rollout(0, args, [good, dead], {}, 1.0) is False
    assert drop_groups_with_infra_failures(args, [good, good]) is True
    assert drop_groups_with_infra_failures(args, [good, dead]) is False


@pytest.mark.slow  # 7 s
async def test_many_concurrent_episodes(server: DevServer) -> None:
    args = make_args(server.url)
    samples = [new_sample("What is seventeen times two?") for _ in range(24)]
    for i, sample in enumerate(samples):
        sample.session_id = f"s{i}"
    done = await asyncio.gather(*(run(args, s) for s in samples))
    assert all(s.status == Sample.Status.COMPLETED for s in done)
    assert len({tuple(s.tokens) for s in done}) == 1, (
        "episodes share nothing: identical inputs, identical outputs"
    )


# ------------------------------------------------------------------ aborts, failures, start-up


@pytest.mark.slow  # 7 s
async def test_abort_during_retries_returns_at_once_and_sends_nothing_more(server: DevServer) -> None:
    """The shipped retry policy (60 retries, backoff to 30 s) must not hold up slime's abort()."""
    inject_fault(server, status=503, count=1000)
    aborted = threading.Event()
    args = make_args(server.url, abort_event=aborted)
    args.strands_slime = {"client": {"max_retries": 60, "retry_delay_s": 1.0, "max_retry_delay_s": 30.0}}
    task = asyncio.create_task(run(args, new_sample("plain")))
    # the first retry went out; now it sleeps 1-2 s before the next
    await wait_until(lambda: len(server.request_log) >= 2, what="the first retry")
    aborted.set()
    set_at = time.monotonic()
    sample = await asyncio.wait_for(task, 10)
    assert time.monotonic() - set_at < 1.0
    assert sample.status == Sample.Status.ABORTED and not sample.remove_sample
    sent = len(server.request_log)
    await asyncio.sleep(2.5)
    assert len(server.request_log) == sent == 2, "no request after the abort"


@pytest.mark.slow  # 5 s
async def test_abort_while_the_server_is_silent_returns_at_once(server: DevServer) -> None:
    inject_fault(server, delay_s=30.0, count=1)
    aborted = threading.Event()
    args = make_args(server.url, abort_event=aborted)
    task = asyncio.create_task(run(args, new_sample("plain")))
    await wait_until(lambda: server.request_log, what="the request to reach the server")
    aborted.set()
    set_at = time.monotonic()
    sample = await asyncio.wait_for(task, 10)
    assert time.monotonic() - set_at < 1.0
    assert sample.status == Sample.Status.ABORTED and len(server.request_log) == 1


@pytest.mark.slow  # 6 s
async def test_abort_while_a_tool_runs_returns_at_once_and_kills_the_tool(server: DevServer) -> None:
    """slime's abort() waits for every episode: a 30 s tool call must not hold it up."""
    aborted = threading.Event()
    args = make_args(server.url, abort_event=aborted)
    args.strands_slime = {"sandbox": {"timeout_s": 60.0}}
    task = asyncio.create_task(run(args, new_sample("sleepy")))
    await wait_until(lambda: server.request_log, what="the model call")
    await wait_until(lambda: processes_named(SLEEPY_TOOL), what="the tool call to run")
    aborted.set()
    set_at = time.monotonic()
    sample = await asyncio.wait_for(task, 10)
    assert time.monotonic() - set_at < 1.0
    assert sample.status == Sample.Status.ABORTED and sample.metadata["abort_source"] == "slime"
    assert len(server.request_log) == 1, "no model call after the abort"
    # the sandbox kills the cancelled call's worker (a count of all child processes would race the
    # zygote's replacement for that worker, which it forks whenever it is next idle)
    await wait_until(
        lambda: not processes_named(SLEEPY_TOOL), timeout=5, what="the aborted tool call to be killed"
    )


@pytest.mark.slow  # 5 s
async def test_sample_without_output_gets_the_exact_prompt(server: DevServer) -> None:
    """System prompt, tools and history included: the ids a successful episode sent first."""
    prompt = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Earlier question"},
        {"role": "assistant", "content": "Earlier answer"},
        {"role": "user", "content": "plain question"},
    ]
    args = make_args(server.url)
    ok = await run(args, Sample(prompt=prompt, label="5"))
    assert ok.status == Sample.Status.COMPLETED
    sent_ids = server.request_log[-1]["json"]["input_ids"]

    inject_fault(server, status=500, count=10)  # the first request fails: no output at all
    failing = make_args(server.url)
    failing.strands_slime = {"client": {"max_retries": 0}, "sandbox": {"timeout_s": 2.0}}  # same tool text
    failed = await run(failing, Sample(prompt=prompt, label="5"))
    assert failed.status == Sample.Status.FAILED and failed.remove_sample
    assert failed.tokens[: len(failed.tokens) - failed.response_length] == sent_ids

    calls = iter([False])  # generate's own check passes; the model's check before its first call aborts
    aborted = make_args(server.url, abort_event=lambda: next(calls, True))
    before_first_call = await run(aborted, Sample(prompt=prompt, label="5"))
    assert before_first_call.status == Sample.Status.ABORTED
    prompt_len = len(before_first_call.tokens) - before_first_call.response_length
    assert before_first_call.tokens[:prompt_len] == sent_ids


@pytest.mark.slow  # 5 s
async def test_exhausted_retries_log_one_line_with_the_cause(
    server: DevServer, caplog: pytest.LogCaptureFixture
) -> None:
    inject_fault(server, status=503, count=100, message="The request queue is full.")
    args = make_args(server.url)
    args.strands_slime = {"client": {"max_retries": 2, "retry_delay_s": 0.01}}
    with caplog.at_level(logging.WARNING):
        samples = await asyncio.gather(*(run(args, new_sample("plain")) for _ in range(3)))
    assert all(s.status == Sample.Status.FAILED for s in samples)
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(records) == 3, [r.getMessage() for r in records]
    for record in records:
        assert record.exc_info is None and "\n" not in record.getMessage()
        assert "SGLangThrottledError: HTTP 503" in record.getMessage()
        assert "The request queue is full." in record.getMessage()
    assert "Traceback" not in caplog.text
    assert samples[0].metadata["infra_error"].startswith("SGLangThrottledError: HTTP 503")


@pytest.mark.slow  # 5 s
async def test_a_server_that_never_answers_fails_the_sample_with_the_deadline(server: DevServer) -> None:
    args = make_args(server.url)
    args.strands_slime = {"client": {"first_byte_timeout_s": 0.5}, "sandbox": {"timeout_s": 2.0}}
    await run(args, new_sample("plain"))  # start-up (tokenizer, sandbox) is not what is timed here
    server.clear_request_log()
    inject_fault(server, delay_s=60.0, count=5)  # accepts the request, then says nothing
    start = time.monotonic()
    sample = await run(args, new_sample("plain"))
    assert time.monotonic() - start < 3
    assert sample.status == Sample.Status.FAILED and sample.remove_sample
    assert "first_byte_timeout_s=0.5" in sample.metadata["infra_error"]
    assert len(server.request_log) == 1, "a reply that never starts is not retried"
