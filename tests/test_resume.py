"""Partial-rollout resume: an episode aborted anywhere goes on where it stopped when slime hands the
recycled sample back, and ends with the trajectory an uninterrupted run produces.

Real parts throughout: generate() over HTTP to the scripted dev server, the real Qwen3 tokenizer and
the real sandbox. Aborts land at chosen points through ``args.abort_event`` (the role slime's
``GenerateState.aborted`` plays); the sandbox's ``run`` is wrapped only to count executions.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import pickle
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import solve_with_tool, think, tool_call

from strands_slime import generate
from strands_slime.cli import RolloutOptions, slime_args
from strands_slime.config import get_rollout_config
from strands_slime.devserver import DevServer
from strands_slime.provider.client import SGLangClient
from strands_slime.rollout.resume import STATE_KEY
from strands_slime.rollout.slime_compat import Sample
from strands_slime.sandbox import get_shared_sandbox

pytestmark = pytest.mark.integration

SLEEP_CODE = "import time\ntime.sleep(0.6)\nprint(17 * 2)"
SCRIPT = [
    solve_with_tool("seventeen", "print(17 * 2)", "34"),
    {
        "match": "sleepy",
        "replies": [
            think("Compute slowly.", tool_call(SLEEP_CODE)),
            think("Done.", "The result is 34.\n\nAnswer: \\boxed{34}"),
        ],
    },
    {
        "match": "parallel",
        "replies": [
            think("Both at once.", tool_call("print(17)") + "\n" + tool_call(SLEEP_CODE)),
            "Both done: 34.\n\nAnswer: \\boxed{34}",
        ],
    },
    {
        "match": "malformed",
        "replies": [  # cut before its closing brace: the plugin answers it with the parser's explanation
            think(
                "Try.",
                '<tool_call>\n{"name": "execute_python_code", "arguments": {"code": "print(34)"\n</tool_call>',
            ),
            think("It failed; by hand.", "The result is 34.\n\nAnswer: \\boxed{34}"),
        ],
    },
    {
        "match": "twice",
        "replies": [
            think("First.", tool_call("print(17)")),
            think("Second.", tool_call("print(2)")),
            "It is 34. " + "Checking the product once more. " * 60 + "\n\nAnswer: \\boxed{34}",
        ],
    },
]
PARAMS = {
    "temperature": 1.0,
    "top_p": 1.0,
    "max_new_tokens": 2048,
    "no_stop_trim": True,
    "skip_special_tokens": False,
}


@pytest.fixture
async def server() -> AsyncIterator[DevServer]:
    async with DevServer(backend="scripted", script=SCRIPT) as running:
        yield running


def _caller() -> str:
    """The function that read the abort flag, past slime_compat's wrappers around ``abort_event`` and
    the episode's one decision (``Episode.slime_aborted``)."""
    frame = sys._getframe(2)
    while frame is not None and (
        frame.f_globals.get("__name__") == "strands_slime.rollout.slime_compat"
        or frame.f_code.co_name == "slime_aborted"
    ):
        frame = frame.f_back  # type: ignore[assignment]
    return frame.f_code.co_name if frame is not None else ""


class Aborter:
    """``args.abort_event``: false until ``fire`` says the abort lands at this check.

    ``fire(caller)`` gets the name of the function that asked (``_play_guarded``, ``stream``,
    ``tool_abort_check``, the client's ``_poll``, ...); once it answered True the flag stays up, as
    slime's does, until ``clear``."""

    def __init__(self, fire: Callable[[str], bool]) -> None:
        self.fire = fire
        self.raised = False

    def __call__(self) -> bool:
        if not self.raised and self.fire(_caller()):
            self.raised = True
        return self.raised

    def clear(self) -> None:
        self.raised = False
        self.fire = lambda caller: False


class SandboxCounter:
    """Counts the sandbox's runs: started and finished (a run the abort cuts short never finishes)."""

    def __init__(self) -> None:
        self.started = 0
        self.finished = 0
        self.running = asyncio.Event()

    async def install(self, args: Any) -> None:
        sandbox = get_shared_sandbox(get_rollout_config(args).sandbox)
        original = type(sandbox).run.__get__(sandbox)

        async def counted(code: str, *rest: Any, **kwargs: Any) -> Any:
            self.started += 1
            self.running.set()
            result = await original(code, *rest, **kwargs)
            self.finished += 1
            return result

        sandbox.run = counted  # type: ignore[method-assign]


def make_args(url: str, **overrides: Any) -> Any:
    options = RolloutOptions(data=Path("unused"), out=Path("unused"), max_response_len=2048)
    args = slime_args(options, url, None)
    args.strands_slime = {"sandbox": {"timeout_s": 5.0}, "client": {"max_retries": 0}}
    args.partial_rollout = True
    args.mask_offpolicy_in_partial_rollout = False
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def new_sample(question: str) -> Sample:
    return Sample(
        prompt=[{"role": "user", "content": f"{question}: what is 17 times 2?"}],
        label="34",
        index=0,
        group_index=0,
    )


def check_invariants(sample: Sample) -> None:
    assert sample.response_length >= 1 and len(sample.tokens) > sample.response_length
    assert len(sample.loss_mask) == len(sample.rollout_log_probs) == sample.response_length  # type: ignore[arg-type]
    for mask, logprob in zip(sample.loss_mask, sample.rollout_log_probs, strict=True):  # type: ignore[arg-type]
        assert mask in (0, 1) and logprob <= 0.0


def model_turns(sample: Sample) -> int:
    """Model outputs in the response: the runs of loss mask 1."""
    mask = sample.loss_mask or []
    return sum(1 for i, m in enumerate(mask) if m == 1 and (i == 0 or mask[i - 1] == 0))


async def reference(server: DevServer, question: str) -> tuple[Sample, int]:
    """An uninterrupted run: the sample and how many model requests it sent."""
    before = len(server.request_log)
    sample = await generate(make_args(server.url), new_sample(question), dict(PARAMS))
    assert sample.status.name == "COMPLETED" and STATE_KEY not in sample.metadata
    return sample, len(server.request_log) - before


def assert_same_trajectory(resumed: Sample, expected: Sample, continued_calls: int = 0) -> None:
    """The same tokens, mask, logprobs, turns and outcome; ``continued_calls`` model calls were cut
    by the abort and went on in a second request (one more weight version each)."""
    check_invariants(resumed)
    assert resumed.tokens == expected.tokens
    assert resumed.loss_mask == expected.loss_mask
    assert resumed.rollout_log_probs == expected.rollout_log_probs
    assert resumed.response == expected.response and resumed.response_length == expected.response_length
    assert resumed.status == expected.status
    assert len(resumed.weight_versions) - continued_calls == model_turns(resumed) == model_turns(expected)
    for key in (
        "tool_iterations",
        "tool_calls",
        "tool_errors",
        "final_text",
        "finish_reason",
        "parse_errors",
    ):
        assert resumed.metadata[key] == expected.metadata[key], key
    assert STATE_KEY not in resumed.metadata


async def abort_then_resume(
    server: DevServer, question: str, fire: Callable[[str], bool], **overrides: Any
) -> tuple[Sample, Sample, SandboxCounter, int]:
    """Run with an abort landing where ``fire`` says, then resume the recycled sample (after a
    pickle round trip, as slime's buffer may hold it); returns (aborted copy, resumed, sandbox
    counter, model requests of both attempts)."""
    aborter = Aborter(fire)
    args = make_args(server.url, abort_event=aborter, **overrides)
    counter = SandboxCounter()
    await counter.install(args)
    before = len(server.request_log)
    sample = await generate(args, new_sample(question), dict(PARAMS))
    assert sample.status.name == "ABORTED" and sample.metadata["abort_source"] == "slime"
    check_invariants(sample)
    aborted = copy.deepcopy(sample)
    recycled = pickle.loads(pickle.dumps(sample))
    aborter.clear()
    resumed = await generate(args, recycled, dict(PARAMS))
    return aborted, resumed, counter, len(server.request_log) - before


# ------------------------------------------------------------------ abort at every point, then resume


def abort_at_check(number: int) -> Callable[[str], bool]:
    """An abort that lands at the ``number``-th reading of slime's flag, wherever that is."""
    seen = [0]

    def fire(caller: str) -> bool:
        seen[0] += 1
        return seen[0] == number

    return fire


@pytest.mark.slow
@pytest.mark.parametrize("question", ["seventeen", "malformed", "parallel"])
async def test_an_abort_at_every_check_resumes_to_the_uninterrupted_trajectory(
    server: DevServer, question: str
) -> None:
    """The abort lands at the 1st, 2nd, ... reading of the flag (start-up, each model call's checks,
    the tools' polls, the episode's end) until the episode outruns it; every resumed episode ends with
    the tokens, mask and logprobs of the run no abort touched. The malformed call is the regression:
    its answered round was dropped from the saved history and the resumed call refused it."""
    expected, _ = await reference(server, question)
    number = 0
    while True:
        number += 1
        aborter = Aborter(abort_at_check(number))
        args = make_args(server.url, abort_event=aborter)
        sample = await generate(args, new_sample(question), dict(PARAMS))
        if not aborter.raised:
            break  # the episode ended before the flag was read this often: every point was tried
        assert sample.status.name == "ABORTED", number
        aborter.clear()
        resumed = await generate(args, pickle.loads(pickle.dumps(sample)), dict(PARAMS))
        cut_kept = len(resumed.weight_versions) - model_turns(resumed)
        assert resumed.status.name == "COMPLETED", (number, resumed.metadata.get("infra_error"))
        assert_same_trajectory(resumed, expected, continued_calls=cut_kept)
    assert number > 8, "the flag is read at every step"


async def test_abort_before_the_first_call_starts_over(server: DevServer) -> None:
    expected, requests = await reference(server, "seventeen")
    aborted, resumed, counter, sent = await abort_then_resume(
        server, "seventeen", lambda caller: caller == "_turn"
    )
    assert STATE_KEY not in aborted.metadata, "no output yet: nothing to resume"
    assert_same_trajectory(resumed, expected)
    assert sent == requests and counter.finished == counter.started == 1
    assert resumed.metadata["restarts"] == 1 and "resumes" not in resumed.metadata


async def test_abort_after_a_tool_result_resumes_without_running_it_again(server: DevServer) -> None:
    expected, requests = await reference(server, "seventeen")
    counter_box: list[SandboxCounter] = []

    def after_the_tool(caller: str) -> bool:  # the model's check before its second call
        return caller == "_turn" and bool(counter_box) and counter_box[0].finished == 1

    aborter = Aborter(after_the_tool)
    args = make_args(server.url, abort_event=aborter)
    counter = SandboxCounter()
    counter_box.append(counter)
    await counter.install(args)
    before = len(server.request_log)
    sample = await generate(args, new_sample("seventeen"), dict(PARAMS))
    assert sample.status.name == "ABORTED" and model_turns(sample) == 1
    state = sample.metadata[STATE_KEY]
    json.dumps(state)  # plain JSON: survives slime's buffer and Sample.to_dict
    assert state["messages"][-1]["role"] == "user" and "toolResult" in state["messages"][-1]["content"][0]
    assert state["tool_results"] == {}, "finished rounds live in the messages only"
    assert len(sample.weight_versions) == 1
    aborter.clear()
    resumed = await generate(args, sample, dict(PARAMS))
    assert_same_trajectory(resumed, expected)
    assert counter.started == counter.finished == 1, "the finished tool call did not run again"
    assert len(server.request_log) - before == requests, "no model call was made twice"
    assert resumed.metadata["resumes"] == 1 and "restarts" not in resumed.metadata
    assert resumed.metadata["turns"] == 2 and resumed.metadata["tool_calls"] == 1


@pytest.mark.slow
async def test_abort_while_a_tool_runs_runs_it_again(server: DevServer) -> None:
    expected, requests = await reference(server, "sleepy")
    counter_box: list[SandboxCounter] = []
    aborter = Aborter(lambda caller: bool(counter_box) and counter_box[0].running.is_set())
    args = make_args(server.url, abort_event=aborter)
    counter = SandboxCounter()
    counter_box.append(counter)
    await counter.install(args)
    before = len(server.request_log)
    sample = await generate(args, new_sample("sleepy"), dict(PARAMS))
    assert sample.status.name == "ABORTED" and counter.started == 1 and counter.finished == 0
    state = sample.metadata[STATE_KEY]
    assert state["tool_results"] == {}, "the cut call's error result is not kept"
    assert state["messages"][-1]["role"] == "assistant", "the round runs again on resume"
    aborter.clear()
    resumed = await generate(args, sample, dict(PARAMS))
    assert_same_trajectory(resumed, expected)
    assert counter.started == 2 and counter.finished == 1
    assert len(server.request_log) - before == requests
    assert resumed.metadata["tool_errors"] == 0


@pytest.mark.slow
async def test_abort_mid_generation_resends_only_the_cut_call() -> None:
    async with DevServer(backend="scripted", script=SCRIPT) as fast:
        expected, requests = await reference(fast, "twice")
    async with DevServer(backend="scripted", script=SCRIPT, token_latency=0.005) as slow:
        aborted_flag = threading.Event()
        args = make_args(slow.url, abort_event=aborted_flag)
        counter = SandboxCounter()
        await counter.install(args)
        task = asyncio.create_task(generate(args, new_sample("twice"), dict(PARAMS)))
        assert slow.scheduler is not None
        deadline = time.monotonic() + 30
        while len(slow.request_log) < 3 or slow.scheduler.num_running == 0:
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.01)
        generated = slow.scheduler.total_generated_tokens
        while slow.scheduler.total_generated_tokens < generated + 5:  # the third call is generating
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.01)
        aborted_flag.set()  # what slime's abort() does: the flag, then abort every request
        async with SGLangClient(slow.url) as client:
            await client.abort(abort_all=True)
        sample = await asyncio.wait_for(task, 10)
        assert sample.status.name == "ABORTED" and counter.finished == 2
        # the client stops waiting on slime's flag within ~50 ms; whether the server's abort reply with
        # the partial output came first decides if the cut call is kept (and continued) or sent again
        cut_kept = len(sample.weight_versions) - 2
        assert cut_kept in (0, 1) and model_turns(sample) == 2 + cut_kept
        aborted_tokens = list(sample.tokens)
        aborted_flag.clear()
        slow.scheduler.token_latency = 0.0
        resumed = await generate(args, sample, dict(PARAMS))
        assert_same_trajectory(resumed, expected, continued_calls=cut_kept)
        assert counter.started == counter.finished == 2, "no tool ran twice"
        assert len(slow.request_log) == requests + 1, "only the cut call was sent again"
        resent = slow.request_log[-1]["json"]["input_ids"]
        assert resent[: len(aborted_tokens)] == aborted_tokens, "the resumed call extends the saved ids"


@pytest.mark.slow
async def test_server_abort_mid_generation_goes_on_from_the_partial_output() -> None:
    """A weight update or an operator aborts the request on the server (slime's flag stays down): the
    partial output stays in the sample, as slime's own generate keeps it, and the resumed call
    continues from it."""
    async with DevServer(backend="scripted", script=SCRIPT) as fast:
        expected, requests = await reference(fast, "twice")
    async with DevServer(backend="scripted", script=SCRIPT, token_latency=0.005) as slow:
        args = make_args(slow.url, mask_offpolicy_in_partial_rollout=True)
        task = asyncio.create_task(generate(args, new_sample("twice"), dict(PARAMS)))
        assert slow.scheduler is not None
        deadline = time.monotonic() + 30
        while len(slow.request_log) < 3 or slow.scheduler.num_running == 0:
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.01)
        generated = slow.scheduler.total_generated_tokens
        while slow.scheduler.total_generated_tokens < generated + 5:  # a few tokens of the third reply
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.01)
        async with SGLangClient(slow.url) as client:
            await client.abort(abort_all=True)
        sample = await asyncio.wait_for(task, 10)
        assert sample.status.name == "ABORTED" and sample.metadata["abort_source"] == "server"
        assert len(sample.weight_versions) == 3, "the cut call's partial output is kept"
        kept = list(sample.tokens)
        assert len(kept) > len(expected.tokens) - expected.response_length
        slow.scheduler.token_latency = 0.0
        resumed = await generate(args, sample, dict(PARAMS))
        assert slow.request_log[-1]["json"]["input_ids"] == kept, "the call goes on from the partial output"
        assert len(slow.request_log) == requests + 1
        check_invariants(resumed)
        assert resumed.tokens == expected.tokens and resumed.rollout_log_probs == expected.rollout_log_probs
        prefix = len(kept) - (len(resumed.tokens) - resumed.response_length)
        assert resumed.loss_mask == [0] * prefix + expected.loss_mask[prefix:]  # type: ignore[index]
        assert resumed.status.name == "COMPLETED" and len(resumed.weight_versions) == 4
        assert resumed.metadata["final_text"] == expected.metadata["final_text"]
        assert resumed.metadata["tool_calls"] == 2


async def test_abort_after_the_last_turn_only_reports_the_outcome(server: DevServer) -> None:
    expected, requests = await reference(server, "seventeen")

    def after_the_episode(caller: str) -> bool:
        return caller == "_see_late_abort"  # the episode's check once the agent has finished

    aborted, resumed, counter, sent = await abort_then_resume(server, "seventeen", after_the_episode)
    assert aborted.metadata[STATE_KEY]["finished"] == ["COMPLETED", "stop"]
    assert aborted.tokens == expected.tokens
    assert_same_trajectory(resumed, expected)
    assert sent == requests and counter.started == counter.finished == 1


async def aborted_after_the_tool(server: DevServer, **overrides: Any) -> tuple[Any, Aborter, Sample]:
    """An ABORTED sample whose first turn and tool call finished (its state saved)."""
    counter = SandboxCounter()
    aborter = Aborter(lambda caller: caller == "_turn" and counter.finished == 1)
    args = make_args(server.url, abort_event=aborter, **overrides)
    await counter.install(args)
    sample = await generate(args, new_sample("seventeen"), dict(PARAMS))
    assert sample.status.name == "ABORTED" and STATE_KEY in sample.metadata
    return args, aborter, sample


# ------------------------------------------------------------------ loss mask of the earlier part


async def test_mask_offpolicy_zeroes_the_earlier_part_like_slime(server: DevServer) -> None:
    expected, _ = await reference(server, "seventeen")
    args, aborter, sample = await aborted_after_the_tool(server, mask_offpolicy_in_partial_rollout=True)
    kept = sample.response_length
    aborter.clear()
    resumed = await generate(args, sample, dict(PARAMS))
    check_invariants(resumed)
    assert resumed.tokens == expected.tokens
    assert resumed.loss_mask == [0] * kept + expected.loss_mask[kept:]  # type: ignore[index]
    # slime keeps the earlier logprobs under the zero mask (its generate_and_rm only rewrites the mask)
    assert resumed.rollout_log_probs == expected.rollout_log_probs
    assert len(resumed.weight_versions) == 2


async def test_without_mask_offpolicy_the_earlier_part_trains(server: DevServer) -> None:
    expected, _ = await reference(server, "seventeen")
    args, aborter, sample = await aborted_after_the_tool(server)
    aborter.clear()
    resumed = await generate(args, sample, dict(PARAMS))
    assert resumed.loss_mask == expected.loss_mask and 1 in resumed.loss_mask[: model_turns(resumed)]


# ------------------------------------------------------------------ samples that start over


async def test_partial_rollout_off_saves_nothing_and_starts_over(server: DevServer) -> None:
    expected, _ = await reference(server, "seventeen")
    args, aborter, sample = await aborted_after_the_tool(server)
    args.partial_rollout = False
    aborter.clear()
    again = await generate(args, sample, dict(PARAMS))
    assert_same_trajectory(again, expected)
    assert again.metadata["restarts"] == 1 and "resumes" not in again.metadata

    aborter = Aborter(lambda caller: caller == "_turn")
    off = make_args(server.url, abort_event=aborter, partial_rollout=False)
    sample = await generate(off, new_sample("seventeen"), dict(PARAMS))
    assert sample.status.name == "ABORTED" and STATE_KEY not in sample.metadata


async def test_evaluation_episodes_are_not_saved(server: DevServer) -> None:
    checks: list[str] = []

    def after_the_episode(caller: str) -> bool:
        checks.append(caller)
        return caller == "_see_late_abort"

    args = make_args(server.url, abort_event=Aborter(after_the_episode))
    sample = await generate(args, new_sample("seventeen"), dict(PARAMS), evaluation=True)
    assert sample.status.name == "ABORTED" and STATE_KEY not in sample.metadata


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda s: s.prompt.append({"role": "user", "content": "another question"}), "prompt"),
        (lambda s: s.tokens.append(7), "tokens"),
        (lambda s: s.metadata[STATE_KEY].update(version=99), "version"),
        (lambda s: s.metadata[STATE_KEY].pop("prompt_key"), "malformed"),
        (lambda s: s.metadata.update({STATE_KEY: "garbage"}), "version"),
    ],
)
async def test_a_state_that_does_not_match_starts_over_with_a_warning(
    server: DevServer, caplog: pytest.LogCaptureFixture, change: Callable[[Sample], Any], reason: str
) -> None:
    args, aborter, sample = await aborted_after_the_tool(server)
    change(sample)
    aborter.clear()
    with caplog.at_level(logging.WARNING, logger="strands_slime.rollout.resume"):
        again = await generate(args, sample, dict(PARAMS))
    check_invariants(again)
    assert again.status.name == "COMPLETED" and again.metadata["restarts"] == 1
    assert STATE_KEY not in again.metadata and "resumes" not in again.metadata
    assert any(
        "starting the episode over" in r.getMessage() and reason in r.getMessage() for r in caplog.records
    )


async def test_a_layout_that_does_not_restore_starts_over(
    server: DevServer, caplog: pytest.LogCaptureFixture
) -> None:
    expected, _ = await reference(server, "seventeen")
    args, aborter, sample = await aborted_after_the_tool(server)
    sample.metadata[STATE_KEY]["trajectory"]["segments"][1][1] += 1  # no longer tiles the tokens
    aborter.clear()
    with caplog.at_level(logging.WARNING, logger="strands_slime.rollout.episode"):
        again = await generate(args, sample, dict(PARAMS))
    assert_same_trajectory(again, expected)
    assert again.metadata["restarts"] == 1
    assert any("does not restore" in r.getMessage() for r in caplog.records)


async def test_a_finished_sample_with_a_leftover_state_starts_over(server: DevServer) -> None:
    args, aborter, sample = await aborted_after_the_tool(server)
    sample.status = Sample.Status.FAILED  # e.g. a hook changed it: only ABORTED samples resume
    aborter.clear()
    again = await generate(args, sample, dict(PARAMS))
    assert again.status.name == "COMPLETED" and again.metadata["restarts"] == 1
    assert STATE_KEY not in again.metadata


async def test_aborted_again_before_the_resumed_episode_starts_keeps_the_state(server: DevServer) -> None:
    expected, _ = await reference(server, "seventeen")
    args, aborter, sample = await aborted_after_the_tool(server)
    saved_tokens = list(sample.tokens)
    aborter.raised = True  # slime is still aborting when the recycled sample comes back
    before = len(server.request_log)
    again = await generate(args, sample, dict(PARAMS))
    assert again.status.name == "ABORTED" and again.tokens == saved_tokens
    assert STATE_KEY in again.metadata and len(server.request_log) == before
    aborter.clear()
    resumed = await generate(args, again, dict(PARAMS))
    assert_same_trajectory(resumed, expected)
    assert resumed.metadata["resumes"] == 1, "the attempt that never started resumed nothing"


async def test_the_saved_state_is_small_and_the_transcript_survives(server: DevServer) -> None:
    transcript = {"keep_transcript": True, "sandbox": {"timeout_s": 5.0}}
    expected = await generate(
        make_args(server.url, strands_slime=transcript), new_sample("seventeen"), dict(PARAMS)
    )
    args, aborter, sample = await aborted_after_the_tool(server)
    plain = json.dumps(sample.metadata[STATE_KEY])
    assert len(plain) < 4096, "no token ids, logprobs or per-turn templates in the state"
    args, aborter, sample = await aborted_after_the_tool(server, strands_slime=transcript)
    aborter.clear()
    resumed = await generate(args, sample, dict(PARAMS))

    def without_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:  # tool-call ids are random
        return [{k: v for k, v in m.items() if k != "tool_call_id"} for m in messages]

    assert without_ids(resumed.metadata["transcript"]) == without_ids(expected.metadata["transcript"])


def test_the_state_key_is_an_episode_metadata_key_reset_on_a_new_attempt() -> None:
    from strands_slime.episode_metadata import EPISODE_METADATA_KEYS, RESUMES_KEY

    assert STATE_KEY in EPISODE_METADATA_KEYS and RESUMES_KEY not in EPISODE_METADATA_KEYS


@pytest.mark.slow
async def test_abort_mid_round_replays_the_finished_call_and_reruns_the_cut_one(server: DevServer) -> None:
    expected, requests = await reference(server, "parallel")
    assert expected.metadata["tool_calls"] == 2 and expected.metadata["tool_iterations"] == 1
    counter = SandboxCounter()
    aborter = Aborter(lambda caller: counter.finished == 1 and counter.started == 2)
    args = make_args(server.url, abort_event=aborter)
    await counter.install(args)
    before = len(server.request_log)
    sample = await generate(args, new_sample("parallel"), dict(PARAMS))
    assert sample.status.name == "ABORTED" and counter.finished == 1
    state = sample.metadata[STATE_KEY]
    assert state["messages"][-1]["role"] == "assistant" and len(state["tool_results"]) == 1
    aborter.clear()
    resumed = await generate(args, sample, dict(PARAMS))
    assert_same_trajectory(resumed, expected)
    assert counter.started == 3 and counter.finished == 2, "the finished call was answered from its result"
    assert len(server.request_log) - before == requests
