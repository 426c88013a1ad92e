"""The client never sends what crashes SGLang or what it refuses on types (provider/request_check.py).

Real parts: the scripted dev server on loopback (its request log shows what went out), the real Qwen3
tokenizer, and slime's ``generate`` for the episode that meets a bad id.
"""

from __future__ import annotations

import array
import asyncio
import json
from pathlib import Path
from typing import Any

import numpy
import pytest

from strands_slime import generate
from strands_slime.devserver import DevServer
from strands_slime.provider.client import InvalidRequestError, SGLangBadRequestError, SGLangClient
from strands_slime.provider.request_check import checked_payload, checked_token_ids, vocabulary_size

pytestmark = pytest.mark.unit

SCRIPT = [{"match": None, "replies": ["Hello there."]}]
VOCAB = 151_669


@pytest.fixture
async def server() -> Any:
    async with DevServer("scripted", script=SCRIPT) as running:
        yield running


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([9707, -3], r"input_ids\[1\] = -3 is not a token id of this model \(must be \[0, 151669\)\)"),
        ([9707, VOCAB], r"input_ids\[1\] = 151669 is not a token id"),
        (numpy.array([9707, -100]), r"input_ids\[1\] = -100 is not a token id"),
        (array.array("i", [9707, 11, 200_000]), r"input_ids\[2\] = 200000 is not a token id"),
        ([9707, 2.5], r"input_ids\[1\] must be an integer, got 2.5"),
        ([9707, "11"], r"input_ids\[1\] must be an integer, got '11'"),
        ([True, 11], r"input_ids\[0\] must be an integer, got the boolean True"),
        (numpy.array([1.0, numpy.nan]), r"input_ids\[1\] is nan"),
        (numpy.array([[1, 2]]), "one flat sequence"),
    ],
)
async def test_a_bad_id_is_refused_before_anything_is_sent(server: DevServer, ids: Any, message: str) -> None:
    async with SGLangClient(server.url, max_retries=0) as client:
        with pytest.raises(InvalidRequestError, match=message) as raised:
            await client.generate(ids, {"max_new_tokens": 2}, vocab_size=VOCAB)
        assert isinstance(raised.value, ValueError) and not raised.value.retryable
        assert server.request_log == [], "nothing went on the wire"
        assert (await client.generate([9707, 11], {"max_new_tokens": 2})).completion_tokens >= 1


async def test_numbers_from_numpy_go_out_as_the_json_types_sglang_accepts(server: DevServer) -> None:
    async with SGLangClient(server.url, max_retries=0) as client:
        await client.generate(
            numpy.array([9707.0, 11.0, 1879.0]),
            {"max_new_tokens": numpy.int64(3), "temperature": numpy.float32(0.5), "stop_token_ids": [3.0]},
            logprob_start_len=numpy.int32(1),
            vocab_size=VOCAB,
            return_routed_experts=numpy.bool_(False),
        )
        await client.generate([numpy.int64(9707), 11.0], {"logit_bias": {numpy.int64(40): numpy.float16(1)}})
    first, second = (entry["json"] for entry in server.request_log)
    assert first["input_ids"] == [9707, 11, 1879] and all(type(i) is int for i in first["input_ids"])
    assert first["sampling_params"] == {"max_new_tokens": 3, "temperature": 0.5, "stop_token_ids": [3]}
    assert type(first["logprob_start_len"]) is int and first["return_routed_experts"] is False
    assert second["input_ids"] == [9707, 11] and second["sampling_params"] == {"logit_bias": {"40": 1.0}}


@pytest.mark.parametrize(
    ("extra", "params", "message"),
    [
        ({"return_logprob": 1}, {}, "return_logprob must be true or false, got 1"),
        ({"logprob_start_len": "3"}, {}, "logprob_start_len must be an integer, got '3'"),
        ({"top_logprobs_num": 2.5}, {}, "top_logprobs_num must be an integer, got 2.5"),
        ({}, {"max_new_tokens": 1.5}, r"sampling_params.max_new_tokens must be an integer, got 1.5"),
        ({}, {"temperature": "hot"}, r"sampling_params.temperature must be a number, got 'hot'"),
        ({}, {"ignore_eos": 1}, r"sampling_params.ignore_eos must be true or false, got 1"),
        ({}, {"stop_token_ids": ["a"]}, r"sampling_params.stop_token_ids\[0\] must be an integer"),
        ({"token_ids_logprob": "12"}, {}, "token_ids_logprob must be a list of integers, got str"),
    ],
)
async def test_a_value_of_the_wrong_type_is_refused_client_side(
    server: DevServer, extra: dict[str, Any], params: dict[str, Any], message: str
) -> None:
    async with SGLangClient(server.url, max_retries=0) as client:
        with pytest.raises(InvalidRequestError, match=message):
            await client.generate([9707, 11], params, **extra)
    assert server.request_log == []


async def test_what_the_client_converts_the_dev_server_refuses_raw(server: DevServer) -> None:
    """The dev server refuses SGLang's type errors itself (so a client bug shows up locally)."""
    async with SGLangClient(server.url, max_retries=0) as client:
        for body in (
            {"input_ids": [9707.0, 11.0]},
            {"input_ids": ["9707"]},
            {"input_ids": [9707], "return_logprob": 1},
            {"input_ids": [9707], "logprob_start_len": "0"},
            {"input_ids": [9707], "top_logprobs_num": 2.0},
        ):
            with pytest.raises(SGLangBadRequestError) as raised:
                await client.request("POST", "/generate", payload=body, max_retries=0)
            assert raised.value.status == 400, body


def test_only_the_window_is_checked_and_unchanged_ids_are_not_copied() -> None:
    ids = [5, 999_999, 7, 8]
    assert checked_token_ids(ids, 100, slice(2, None)) is ids, "ids before the window were sent before"
    with pytest.raises(InvalidRequestError, match=r"input_ids\[1\]"):
        checked_token_ids(ids, 100)
    held = array.array("i", [1, 2, 3])
    assert checked_token_ids(held, 10) is held
    assert checked_token_ids([1, numpy.int64(2)], 10) == [1, 2]
    assert checked_token_ids([-1], None, slice(1, None)) == [-1]
    with pytest.raises(InvalidRequestError, match="0 or more"):
        checked_token_ids([-1], None)
    assert checked_payload({"sampling_params": {"stop": "x", "n": None}}) == {
        "sampling_params": {"stop": "x", "n": None}
    }


def test_the_vocabulary_is_the_models_when_its_config_is_beside_the_tokenizer(
    qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    assert vocabulary_size(qwen3_tokenizer) == len(qwen3_tokenizer) == VOCAB

    class Beside:
        name_or_path = str(tmp_path)

        def __len__(self) -> int:
            return VOCAB

    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 151_936}))
    assert vocabulary_size(Beside()) == 151_936
    assert vocabulary_size(object()) is None


async def test_an_episode_with_a_bad_id_fails_with_one_clear_error_and_the_server_lives() -> None:
    """A recycled sample whose partial output holds an id outside the vocabulary (a buffer bug): the
    resumed episode sends nothing, fails with the client's error, and the server goes on serving."""
    from test_resume import PARAMS, make_args, new_sample
    from test_resume import SCRIPT as RESUME_SCRIPT

    async with DevServer(backend="scripted", script=RESUME_SCRIPT, token_latency=0.005) as slow:
        args = make_args(slow.url)
        task = asyncio.create_task(generate(args, new_sample("twice"), dict(PARAMS)))
        assert slow.scheduler is not None
        for _ in range(3000):  # bounded: until the third reply is a few tokens in
            if (
                len(slow.request_log) >= 3
                and slow.scheduler.num_running
                and slow.scheduler.total_generated_tokens
            ):
                break
            await asyncio.sleep(0.01)
        generated = slow.scheduler.total_generated_tokens
        for _ in range(3000):
            if slow.scheduler.total_generated_tokens >= generated + 5:
                break
            await asyncio.sleep(0.01)
        async with SGLangClient(slow.url) as client:
            await client.abort(abort_all=True)
        sample = await asyncio.wait_for(task, 30)
        assert sample.status.name == "ABORTED" and sample.metadata["abort_source"] == "server"
        sample.tokens[-1] = 10**7
        sent = len(slow.request_log)
        slow.scheduler.token_latency = 0.0
        resumed = await generate(args, sample, dict(PARAMS))
        assert resumed.status.name == "FAILED"
        error = resumed.metadata["infra_error"]
        assert error.startswith("InvalidRequestError: input_ids[") and "= 10000000 is not a token id" in error
        assert len(slow.request_log) == sent, "the bad request was never sent"
        again = await generate(make_args(slow.url), new_sample("seventeen"), dict(PARAMS))
        assert again.status.name == "COMPLETED", "the server lives"
