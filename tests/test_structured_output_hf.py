"""Grammar-constrained sampling on the hf dev-server backend (tiny random Qwen3, xgrammar masks).

A random model follows no format by itself, so every valid reply here comes from the mask.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from enum import Enum
from typing import Any

import pytest
from pydantic import BaseModel, Field
from strands import Agent, tool
from strands.agent.conversation_manager import NullConversationManager

from benchmarks.devserver_reference import full_forward_logprobs
from benchmarks.devserver_runners import DevServerThread
from strands_slime.devserver import build_tiny_qwen3
from strands_slime.provider.client import SGLangBadRequestError, SGLangClient
from strands_slime.provider.model import SGLangModel

pytest.importorskip("xgrammar")
pytestmark = pytest.mark.slow


class Mood(str, Enum):
    CALM = "calm"
    ANGRY = "angry"


class Verdict(BaseModel):
    ok: bool
    mood: Mood
    score: int = Field(ge=0, le=9)
    note: str | None = Field(default=None, max_length=3)


@tool
async def rate(mood: Mood, score: int) -> str:
    """Rate something.

    Args:
        mood: The mood.
        score: A score.
    """
    return f"{mood}:{score}"


@pytest.fixture(scope="module")
def hf_server() -> Any:
    with DevServerThread("hf", constrained_json_disable_any_whitespace=True, seed=7) as server:
        yield server


@pytest.fixture
async def client(hf_server: Any) -> AsyncIterator[SGLangClient]:
    async with SGLangClient(hf_server.url, max_retries=0) as c:
        yield c


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"text": text}]}]


async def test_structured_output_is_valid_by_construction(qwen3_tokenizer: Any, client: SGLangClient) -> None:
    model = SGLangModel(
        qwen3_tokenizer, client=client, sampling_params={"max_new_tokens": 200}, enable_thinking=False
    )
    events = [event async for event in model.structured_output(Verdict, user("Judge it."))]
    verdict = events[-1]["output"]
    assert isinstance(verdict, Verdict)
    assert model.stats.last_finish_reason == "stop"
    # The logprobs are the server's: taken after the grammar mask, so each sampled token is at least
    # as likely as under the unconstrained model (the mask only removes competitors).
    trajectory = model.trajectory
    start = trajectory.initial_prompt_length
    sampled = trajectory.token_ids[start:].tolist()
    unconstrained = full_forward_logprobs(build_tiny_qwen3(0), trajectory.token_ids.tolist())[start - 1 :]
    constrained = trajectory.logprobs[start:].tolist()
    assert len(constrained) == len(sampled) == len(unconstrained)
    assert all(c >= u - 1e-5 for c, u in zip(constrained, unconstrained, strict=True))
    assert any(c > u + 1e-3 for c, u in zip(constrained, unconstrained, strict=True))
    assert trajectory.loss_mask[start:].tolist() == [1] * len(sampled)


async def test_same_seed_same_constrained_reply_and_logprobs(client: SGLangClient) -> None:
    schema = json.dumps(Verdict.model_json_schema())
    params = {"json_schema": schema, "max_new_tokens": 120, "sampling_seed": 3}
    first = await client.generate(list(range(100, 120)), params)
    second = await client.generate(list(range(100, 120)), params)
    assert first.output_ids == second.output_ids
    # The second run reuses the first one's KV from the prefix cache: equal up to float rounding.
    assert first.output_logprobs == pytest.approx(second.output_logprobs, abs=1e-5)
    Verdict.model_validate_json(first.text)


async def test_regex_and_ebnf_constrain_sampling(client: SGLangClient) -> None:
    reply = await client.generate(list(range(50, 60)), {"regex": "(yes|no)!", "max_new_tokens": 20})
    assert reply.text in ("yes!", "no!")
    grammar = 'root ::= "A" [0-9] [0-9] "."'
    reply = await client.generate(list(range(50, 60)), {"ebnf": grammar, "max_new_tokens": 20})
    assert reply.text[0] == "A" and reply.text[1:3].isdigit() and reply.text.endswith(".")
    assert reply.finish_reason is not None and reply.finish_reason.type == "stop"


async def test_invalid_grammar_is_sglangs_400(client: SGLangClient) -> None:
    with pytest.raises(SGLangBadRequestError, match="Failed to compile ebnf grammar"):
        await client.generate([1, 2, 3], {"ebnf": "root ::= ", "max_new_tokens": 4})
    with pytest.raises(SGLangBadRequestError, match="Failed to compile regex grammar"):
        await client.generate([1, 2, 3], {"regex": "(", "max_new_tokens": 4})


async def test_forced_tool_call_from_a_random_model(qwen3_tokenizer: Any, client: SGLangClient) -> None:
    # A strong <|im_end|> bias ends the free first turn at once; the grammar masks <|im_end|> in the
    # forced turn until the call is complete, so the bias cannot cut the call short.
    sampling = {"max_new_tokens": 160, "logit_bias": {"151645": 40.0}}
    model = SGLangModel(qwen3_tokenizer, client=client, sampling_params=sampling, enable_thinking=False)
    agent = Agent(
        model=model,
        tools=[rate],
        callback_handler=None,
        conversation_manager=NullConversationManager(),
        retry_strategy=None,
        structured_output_model=Verdict,
    )
    # Turn 1 is free and ends without a call; Strands then forces the Verdict tool, which only the
    # grammar can make the random model call correctly.
    result = await agent.invoke_async("Judge it.", limits={"turns": 4})
    assert isinstance(result.structured_output, Verdict)
    assert model.stats.finish_reasons == ["stop", "stop"]
    assert model.stats.tool_calls == 1 and model.stats.parse_errors == 0
    assert model.last_output_text.startswith('<tool_call>\n{"name": "Verdict", "arguments": {"ok": ')
    model.trajectory.check()


async def test_forced_qwen3_coder_call_from_a_random_model(
    qwen3_tokenizer: Any, client: SGLangClient
) -> None:
    model = SGLangModel(
        qwen3_tokenizer,
        client=client,
        tool_parser="qwen3_coder",
        enable_thinking=False,
        sampling_params={"max_new_tokens": 200, "sampling_seed": 5},
    )
    events = [
        event
        async for event in model.stream(
            user("Rate it."), [rate.tool_spec], tool_choice={"tool": {"name": "rate"}}
        )
    ]
    stop = next(event["messageStop"]["stopReason"] for event in events if "messageStop" in event)
    assert stop == "tool_use", model.last_output_text
    assert model.last_output_text.startswith("<tool_call>\n<function=rate>\n<parameter=mood>\n")
    (call,) = model.last_reply.parsed.tool_calls
    assert call.error is None and call.arguments["mood"] in ("calm", "angry")
    assert isinstance(call.arguments["score"], int)


def test_cli_flag_reaches_the_server() -> None:
    from strands_slime.devserver.cli import build_parser

    args = build_parser().parse_args(["--constrained-json-disable-any-whitespace"])
    assert args.constrained_json_disable_any_whitespace is True
    assert build_parser().parse_args([]).constrained_json_disable_any_whitespace is False
