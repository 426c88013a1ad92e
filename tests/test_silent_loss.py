"""Data that used to go missing silently is now counted in the sample metadata and logged once per
process with its cause: model tokens without logprobs, episodes without abort detection, and string
prompts that only look chat-templated."""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from strands_slime import generate
from strands_slime.cli import RolloutOptions, slime_args
from strands_slime.config import ConfigError
from strands_slime.devserver import DevServer
from strands_slime.provider.chat import ChatTemplater, get_templater
from strands_slime.provider.chat_families import UnsupportedChatTemplate
from strands_slime.rollout.metrics import compute_rollout_metrics
from strands_slime.rollout.slime_compat import Sample
from strands_slime.runtime import get_runtime

pytestmark = pytest.mark.unit

SCRIPT = [{"replies": ["The answer is five.\n\nAnswer: \\boxed{5}"]}]
PARAMS = {"max_new_tokens": 256, "no_stop_trim": True, "skip_special_tokens": False}


@pytest.fixture
async def server() -> AsyncIterator[DevServer]:
    async with DevServer("scripted", script=SCRIPT, token_latency=0.0) as running:
        yield running


@pytest.fixture(autouse=True)
def _fresh_process_logs() -> None:
    """Each test sees a process that has logged nothing yet (the warnings are once per process)."""
    get_runtime().logged.clear()


def make_args(url: str, **overrides: Any) -> Any:
    args = slime_args(
        RolloutOptions(data=Path("unused"), out=Path("unused"), max_response_len=256), url, None
    )
    args.strands_slime = {"tools": [], "client": {"max_retries": 0}}
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def question(text: str = "What is two plus three?") -> Sample:
    return Sample(prompt=[{"role": "user", "content": text}], label="5", index=0, group_index=0)


# --------------------------------------------------------------------------- null logprobs


async def _proxy(target: str, rewrite: Callable[[dict[str, Any]], None]) -> tuple[web.AppRunner, str]:
    """A loopback HTTP proxy in front of the dev server that edits each /generate reply's meta_info,
    as an SGLang build that leaves logprobs out would send it."""
    session = aiohttp.ClientSession()

    async def forward(request: web.Request) -> web.Response:
        body = await request.read()
        async with session.request(request.method, target + request.path_qs, data=body) as upstream:
            payload = await upstream.read()
            if request.path == "/generate" and upstream.status == 200:
                reply = await upstream.json()
                rewrite(reply["meta_info"])
                return web.json_response(reply)
            return web.Response(body=payload, status=upstream.status, content_type=upstream.content_type)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    app.on_cleanup.append(lambda _app: session.close())
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


def _null_first_two(meta: dict[str, Any]) -> None:
    for entry in meta["output_token_logprobs"][:2]:
        entry[0] = None


def _null_all(meta: dict[str, Any]) -> None:
    for entry in meta["output_token_logprobs"]:
        entry[0] = None


@pytest.mark.parametrize(
    ("rewrite", "cause"),
    [
        (_null_first_two, "the server returned null logprobs for some output tokens"),
        (_null_all, "a /generate reply had no logprob for any of its output tokens"),
    ],
)
async def test_tokens_without_logprobs_are_masked_counted_and_logged_once(
    server: DevServer, caplog: pytest.LogCaptureFixture, rewrite: Any, cause: str
) -> None:
    runner, url = await _proxy(server.url, rewrite)
    try:
        caplog.set_level(logging.WARNING, logger="strands_slime.rollout.episode")
        samples = [await generate(make_args(url), question(), dict(PARAMS)) for _ in range(2)]
    finally:
        await runner.cleanup()
    outputs = sum(1 for m in samples[0].loss_mask if m == 1) + samples[0].metadata["masked_null_logprobs"]
    expected = 2 if rewrite is _null_first_two else outputs
    for sample in samples:
        assert sample.status == Sample.Status.COMPLETED
        assert sample.metadata["masked_null_logprobs"] == expected
        assert len(sample.loss_mask) == len(sample.rollout_log_probs) == sample.response_length
        assert sample.loss_mask[:expected] == [0] * expected, "nothing is trained where no logprob came"
        assert sample.rollout_log_probs[:expected] == [0.0] * expected
    metrics = compute_rollout_metrics(samples)
    assert metrics["masked_null_logprobs/total"] == 2 * expected
    assert metrics["masked_null_logprobs/episodes_with_any"] == 1.0
    warnings = [r for r in caplog.records if "masked" in r.getMessage()]
    assert len(warnings) == 1, "one line per process and cause, not one per sample or token"
    assert warnings[0].levelno == logging.WARNING and cause in warnings[0].getMessage()
    assert f"masked {expected} model token(s)" in warnings[0].getMessage()


async def test_complete_logprobs_mask_nothing(server: DevServer, caplog: pytest.LogCaptureFixture) -> None:
    sample = await generate(make_args(server.url), question(), dict(PARAMS))
    assert sample.metadata["masked_null_logprobs"] == 0 and set(sample.loss_mask) == {1}
    assert not [r for r in caplog.records if "masked" in r.getMessage()]


# --------------------------------------------------------------------------- abort detection


async def test_abort_event_is_the_flag_without_slime(server: DevServer) -> None:
    sample = await generate(make_args(server.url, abort_event=lambda: False), question(), dict(PARAMS))
    assert sample.metadata["abort_detection"] == "abort_event"


async def test_no_flag_at_all_is_counted_and_said_once(
    server: DevServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="strands_slime.rollout.slime_compat")
    samples = [await generate(make_args(server.url), question(), dict(PARAMS)) for _ in range(2)]
    assert [s.metadata["abort_detection"] for s in samples] == ["off", "off"]
    assert compute_rollout_metrics(samples)["abort_detection/off"] == 1.0
    lines = [r for r in caplog.records if "abort detection is off" in r.getMessage()]
    assert len(lines) == 1 and "slime.rollout.sglang_rollout" in lines[0].getMessage()
    assert lines[0].levelno == logging.INFO, "no slime installed: the offline CLI's normal case"


async def test_broken_slime_flag_is_a_warning_with_the_cause(
    server: DevServer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slime is there but its GenerateState cannot be built: episodes could not be aborted."""

    class GenerateState:  # slime's singleton, failing as it does outside a set-up rollout actor
        def __init__(self, args: Any) -> None:
            raise RuntimeError("rollout engines are not initialised")

    module = types.ModuleType("slime.rollout.sglang_rollout")
    module.GenerateState = GenerateState  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "slime.rollout.sglang_rollout", module)
    caplog.set_level(logging.WARNING, logger="strands_slime.rollout.slime_compat")
    samples = [await generate(make_args(server.url), question(), dict(PARAMS)) for _ in range(2)]
    assert [s.metadata["abort_detection"] for s in samples] == ["off", "off"]
    lines = [r for r in caplog.records if "abort detection is off" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert (
        "GenerateState(args) raised RuntimeError: rollout engines are not initialised"
        in lines[0].getMessage()
    )


async def test_slime_flag_without_an_aborted_attribute_is_a_warning(
    server: DevServer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    class GenerateState:  # a slime whose GenerateState keeps its abort flag elsewhere
        def __init__(self, args: Any) -> None:
            self.tokenizer = None

    module = types.ModuleType("slime.rollout.sglang_rollout")
    module.GenerateState = GenerateState  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "slime.rollout.sglang_rollout", module)
    caplog.set_level(logging.WARNING, logger="strands_slime.rollout.slime_compat")
    sample = await generate(make_args(server.url), question(), dict(PARAMS))
    assert sample.metadata["abort_detection"] == "off"
    lines = [r for r in caplog.records if "abort detection is off" in r.getMessage()]
    assert len(lines) == 1 and "no 'aborted' attribute" in lines[0].getMessage()


# --------------------------------------------------------------------------- templated prompts


def test_the_assistant_header_is_the_templates_own(qwen3_tokenizer: Any) -> None:
    templater = get_templater(qwen3_tokenizer)
    assert templater.assistant_header == "<|im_start|>assistant"
    templated = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert templater.ends_with_generation_prompt(templated)
    no_thinking = templated + "<think>\n\n</think>\n\n"  # slime's template kwargs enable_thinking=False
    assert templater.ends_with_generation_prompt(no_thinking)
    assert templater.ends_with_generation_prompt(templated + "<think>\n")  # thinking-only templates
    for plain in ("Answer as a helpful assistant", "Who is the assistant", "assistant\n", "<think>assistant"):
        assert not templater.ends_with_generation_prompt(plain), plain


def _headless(template: str) -> str:
    """The template with its generation prompt cut off: ``add_generation_prompt`` adds nothing."""
    return template[: template.index("{%- if add_generation_prompt %}")]


@pytest.mark.parametrize(
    ("edit", "cause"),
    [
        (_headless, "no assistant header after the user turn"),
        (
            lambda t: "{{ raise_exception('three turns at least') }}" + t,
            "TemplateError: three turns at least",
        ),
    ],
)
def test_cannot_tell_is_never_read_as_not_templated(qwen3_tokenizer: Any, edit: Any, cause: str) -> None:
    """A template whose generation prompt cannot be read raises, naming why, instead of passing every
    prompt as plain (which turned the guard off without a word)."""
    templater = ChatTemplater(qwen3_tokenizer, chat_template=edit(qwen3_tokenizer.chat_template))
    templated = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    for text in (templated, "What is 2+3?"):
        with pytest.raises(
            UnsupportedChatTemplate, match="cannot read the chat template's generation prompt"
        ) as info:
            templater.ends_with_generation_prompt(text)
        assert cause in str(info.value)


async def test_a_template_the_guard_cannot_read_stops_the_job(
    server: DevServer, qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    path = tmp_path / "headless.jinja"
    path.write_text(_headless(qwen3_tokenizer.chat_template))
    args = make_args(server.url)
    args.strands_slime["chat_template_path"] = str(path)
    with pytest.raises(ConfigError, match="cannot read the chat template's generation prompt"):
        await generate(args, Sample(prompt="What is 2+3?", label="5"), dict(PARAMS))
    assert server.request_log == [], "no GPU time is spent on a misconfigured job"


def test_the_guard_reads_deepseek_s_header_too() -> None:
    """DeepSeek's render of a user turn always opens the assistant's: the header is what follows it."""
    family_files = pytest.importorskip("family_files")
    if family_files.package_data() is None:
        pytest.skip(family_files.MISSING)
    templater = ChatTemplater(family_files.tokenizer("deepseek_v4"))
    assert templater.assistant_header == "<｜Assistant｜>"
    assert templater.ends_with_generation_prompt(templater.render([{"role": "user", "content": "hi"}]))
    assert not templater.ends_with_generation_prompt("Who spoke last, the user or the Assistant")


async def test_a_plain_prompt_ending_in_assistant_runs(server: DevServer) -> None:
    prompt = "You are grading a chat. Reply with the speaker of the last turn: user or assistant"
    sample = await generate(make_args(server.url), Sample(prompt=prompt, label="5"), dict(PARAMS))
    assert sample.status == Sample.Status.COMPLETED and sample.metadata["turns"] == 1


@pytest.mark.parametrize("thinking_block", ["", "<think>\n\n</think>\n\n"])
async def test_a_templated_prompt_stops_the_job(server: DevServer, thinking_block: str) -> None:
    prompt = "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n" + thinking_block
    with pytest.raises(ConfigError, match="already chat-templated"):
        await generate(make_args(server.url), Sample(prompt=prompt, label="5"), dict(PARAMS))
    assert server.request_log == [], "no GPU time is spent on a misconfigured job"
