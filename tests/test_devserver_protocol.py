"""SGLang protocol conformance of the dev server, rule by rule (scripted backend, real HTTP).

Section numbers refer to /work/shared/reference/sglang-protocol.md (mirrored in docs/devserver.md).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import aiohttp
import pytest

from benchmarks.devserver_reference import scripted_output_logprobs
from strands_slime.devserver import DevServer
from strands_slime.provider.client import (
    SGLangBadRequestError,
    SGLangClient,
    SGLangContextLengthError,
    SGLangHTTPError,
)

pytestmark = pytest.mark.unit

IM_END = 151645
ENDOFTEXT = 151643
HELLO = "Hello there, world!"
LONG_IDS = list(range(1000, 1300))  # 300 tokens, no stop token
SCRIPT: dict[str, Any] = {
    "rules": [
        {"match": "LONG", "replies": [{"token_ids": [*LONG_IDS, IM_END]}]},
        {"match": "STOPSTR", "replies": ["alpha beta STOP gamma delta"]},
        {"match": "ENDOFTEXT", "replies": [{"token_ids": [9707, ENDOFTEXT, 1879, IM_END]}]},
        {"match": None, "replies": [HELLO]},
    ]
}
META_KEYS = [
    "id",
    "finish_reason",
    "prompt_tokens",
    "weight_version",
    "num_retractions",
    "input_token_logprobs",
    "output_token_logprobs",
    "output_token_logprobs_length",
    "reasoning_tokens",
    "completion_tokens",
    "cached_tokens",
    "weight_versions",
    "cached_tokens_details",
    "dp_rank",
    "e2e_latency",
    "response_sent_to_client_ts",
]
QUEUED_META_KEYS = [
    "id",
    "finish_reason",
    "weight_version",
    "e2e_latency",
    "weight_versions",
    "input_token_logprobs",
    "output_token_logprobs",
    "output_token_logprobs_length",
    "completion_tokens",
    "response_sent_to_client_ts",
]
"""SGLang 0.5.23 ``srt/managers/tokenizer_manager.py`` ``TokenizerManager._handle_abort_req`` (with
``add_logprob_to_meta_info``), then ``response_sent_to_client_ts`` from ``_wait_one_response``."""


def chat(tokenizer: Any, user: str, turns: int = 0) -> list[int]:
    text = f"<|im_start|>user\n{user}<|im_end|>\n"
    text += "<|im_start|>assistant\nok<|im_end|>\n" * turns
    text += "<|im_start|>assistant\n"
    return tokenizer.encode(text, add_special_tokens=False)


async def post(server: DevServer, payload: Any, path: str = "/generate", **kwargs: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        data = payload if isinstance(payload, (bytes, str)) else json.dumps(payload)
        headers = {"Content-Type": "application/json", **kwargs.pop("headers", {})}
        async with session.post(server.url + path, data=data, headers=headers, **kwargs) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text) if text else None
            except ValueError:
                return resp.status, text


async def get(server: DevServer, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(server.url + path) as resp:
        text = await resp.text()
        return resp.status, json.loads(text) if text else text


async def wait_until(condition: Any, timeout: float = 30.0) -> None:
    """Poll ``condition()`` until it holds; fail after ``timeout`` seconds (a hang guard, not a timing check)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached before the deadline"
        await asyncio.sleep(0.01)


@pytest.fixture
async def server():
    async with DevServer("scripted", script=SCRIPT, context_length=4096, weight_version="v7") as srv:
        yield srv


@pytest.fixture
async def slow_server():
    """One request runs at a time, one token every 20 ms: aborts land mid-generation."""
    async with DevServer("scripted", script=SCRIPT, token_latency=0.02, max_running_requests=1) as srv:
        yield srv


def parsed_keys(keys: list[str]) -> list[str]:
    """meta_info keys as the client keeps them: the per-token entries are parsed into fields."""
    return [key for key in keys if key not in ("input_token_logprobs", "output_token_logprobs")]


@pytest.fixture
async def client(server):
    async with SGLangClient(server.url, max_retries=0) as c:
        yield c


@pytest.fixture
async def slow_client(slow_server):
    async with SGLangClient(slow_server.url, max_retries=0) as c:
        yield c


# --------------------------------------------------------------------------- §4 response


async def test_response_body_and_meta_info_keys_in_build_order(server, client, qwen3_tokenizer):
    prompt = chat(qwen3_tokenizer, "hi")
    response = await client.generate(prompt, {})
    expected_ids = qwen3_tokenizer.encode(HELLO, add_special_tokens=False) + [IM_END]
    assert response.output_ids == expected_ids
    assert response.text == HELLO
    status, body = await post(server, {"input_ids": prompt, "return_logprob": True})
    assert status == 200 and list(body["meta_info"]) == META_KEYS  # the server's, as built
    meta = response.meta_info  # the client's: less the per-token entries it parsed
    assert list(meta) == [
        key for key in META_KEYS if key not in ("input_token_logprobs", "output_token_logprobs")
    ]
    assert re.fullmatch(r"[0-9a-f]{32}", meta["id"])  # default rid: uuid4().hex
    assert meta["prompt_tokens"] == len(prompt)
    assert meta["completion_tokens"] == len(expected_ids) == meta["output_token_logprobs_length"]
    assert meta["weight_version"] == "v7"
    assert meta["weight_versions"] == [{"version": "v7", "start": 0, "end": len(expected_ids)}]
    assert meta["num_retractions"] == 0 and meta["dp_rank"] is None
    assert isinstance(meta["e2e_latency"], float) and 0 <= meta["e2e_latency"] < 5
    assert meta["response_sent_to_client_ts"] > 1.6e9


async def test_logprob_keys_absent_without_return_logprob(server, client, qwen3_tokenizer):
    response = await client.generate(chat(qwen3_tokenizer, "hi"), {}, return_logprob=False)
    assert "output_token_logprobs" not in response.meta_info
    assert "input_token_logprobs" not in response.meta_info
    assert response.output_ids[-1] == IM_END


async def test_cached_tokens_count_the_reused_prefix(server, client, qwen3_tokenizer):
    prompt = chat(qwen3_tokenizer, "cache me")
    cold = await client.generate(prompt, {})
    assert cold.meta_info["cached_tokens_details"] is None or cold.cached_tokens < len(prompt)
    warm = await client.generate(prompt, {})
    assert warm.cached_tokens == len(prompt) - 1  # never the whole prompt
    assert warm.meta_info["cached_tokens_details"] == {"device": len(prompt) - 1, "host": 0}
    # Next turn: the previous prompt + output (all but its last token) is cached.
    turn2 = prompt + cold.output_ids + qwen3_tokenizer.encode("\n<|im_start|>user\nmore<|im_end|>\n")
    second = await client.generate(turn2, {})
    assert second.cached_tokens == len(prompt) + len(cold.output_ids) - 1


# --------------------------------------------------------------------------- §1 validation order


async def test_e1_pydantic_error_body(server):
    status, body = await post(server, {"input_ids": "not a list"})
    assert status == 400
    assert set(body) == {"object", "message", "type", "param", "code"}
    assert body["object"] == "error" and body["type"] == "Bad Request" and body["code"] == 400
    assert body["param"] is None and "input_ids" in body["message"]


async def test_e1_invalid_json_body(server):
    status, body = await post(server, b"{not json")
    assert status == 400 and body["type"] == "Bad Request" and "JSON" in body["message"]


@pytest.mark.parametrize(
    "params", [{"foo": 1}, {"max_new_tokens": 1.5}, {"ignore_eos": 1}, {"stop": 5}, {"watermark": True}]
)
async def test_wrong_sampling_params_are_400s_naming_the_field(server, params):
    """Unknown keys and wrong JSON types (SGLang's wording is compared with the real server's in the
    SGLang lane, not reimplemented)."""
    status, body = await post(server, {"input_ids": [1, 2], "sampling_params": params})
    assert status == 400 and f"SamplingParams: {next(iter(params))}: " in body["message"]


async def test_null_sampling_params_mean_defaults(server, qwen3_tokenizer):
    params = {"temperature": None, "stop": None, "top_k": None, "ignore_eos": None}
    status, body = await post(server, {"input_ids": chat(qwen3_tokenizer, "LONG"), "sampling_params": params})
    assert status == 200 and body["meta_info"]["finish_reason"] == {"type": "length", "length": 128}


async def test_null_max_new_tokens_generates_until_eos(server, qwen3_tokenizer):
    """SGLang 0.5.23 ``srt/sampling/sampling_params.py`` ``SamplingParams.__post_init__`` keeps a
    null ``max_new_tokens`` as None (absent keeps the default 128); ``srt/managers/scheduler.py``
    ``Scheduler.init_req_max_new_tokens`` then uses ``1 << 30`` before clipping."""
    payload = {"input_ids": chat(qwen3_tokenizer, "LONG"), "sampling_params": {"max_new_tokens": None}}
    status, body = await post(server, payload)
    assert status == 200 and body["output_ids"] == [*LONG_IDS, IM_END]
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": IM_END}


async def test_null_max_new_tokens_runs_to_the_context_end(small_server, qwen3_tokenizer):
    """Same rules: with null, ``TokenizerManager._validate_one_request``
    (``srt/managers/tokenizer_manager.py``) skips the total-token check and the scheduler clips the
    budget to ``max_req_len - N - 1``."""
    long_prompt = chat(qwen3_tokenizer, "LONG")
    prompt = long_prompt + [7] * (50 - len(long_prompt))
    status, body = await post(
        small_server, {"input_ids": prompt, "sampling_params": {"max_new_tokens": None}}
    )
    assert status == 200 and body["meta_info"]["finish_reason"] == {"type": "length", "length": 63 - 50 - 1}
    assert body["output_ids"] == LONG_IDS[:12]


async def test_unknown_top_level_keys_are_ignored(server):
    status, body = await post(server, {"input_ids": [1, 2, 3], "no_such_field": {"x": 1}, "lora_path": None})
    assert status == 200 and body["output_ids"]


# --------------------------------------------------------------------------- §2 top-level fields


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({}, "Either text, input_ids or input_embeds should be provided."),
        ({"text": "a", "input_ids": [1]}, "Either text, input_ids or input_embeds should be provided."),
        ({"input_ids": []}, "input_ids cannot be empty."),
    ],
)
async def test_e3_prompt_presence(server, payload, message):
    status, body = await post(server, payload)
    assert (status, body) == (400, {"error": {"message": message}})


async def test_text_prompt_is_tokenized(server, qwen3_tokenizer):
    text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    status, body = await post(server, {"text": text, "return_logprob": True})
    ids = qwen3_tokenizer.encode(text)
    assert status == 200 and body["meta_info"]["prompt_tokens"] == len(ids)
    # Scripted logprobs are a function of the exact prompt ids: equal only if the text became `ids`.
    logprobs = [entry[0] for entry in body["meta_info"]["output_token_logprobs"]]
    assert logprobs == scripted_output_logprobs(ids, body["output_ids"])


async def test_rid_is_echoed(server, client):
    response = await client.generate([1, 2, 3], {}, rid="my-rid")
    assert response.rid == "my-rid"


async def test_duplicate_live_rid_is_rejected(slow_server, slow_client, qwen3_tokenizer):
    first = asyncio.create_task(slow_client.generate(chat(qwen3_tokenizer, "LONG"), {}, rid="dup"))
    await wait_until(lambda: "dup" in slow_server.scheduler.live)
    with pytest.raises(SGLangBadRequestError) as caught:
        await slow_client.generate([1, 2, 3], {}, rid="dup")
    assert json.loads(caught.value.body) == {"error": {"message": "Duplicate request ID detected: dup"}}
    await slow_client.abort("dup")
    assert (await first).is_abort


async def test_routed_experts_start_len_out_of_range(server):
    status, body = await post(
        server, {"input_ids": [1, 2, 3], "return_routed_experts": True, "routed_experts_start_len": 4}
    )
    assert status == 400 and "routed_experts_start_len" in body["error"]["message"]
    status, _ = await post(
        server, {"input_ids": [1, 2, 3], "return_routed_experts": True, "routed_experts_start_len": 3}
    )
    assert status == 200


# --------------------------------------------------------------------------- §3 sampling params


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"temperature": -1}, "temperature must be a non-negative finite number, got -1."),
        ({"top_p": 0}, "top_p must be in (0, 1], got 0."),
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5."),
        ({"top_k": 0}, "top_k must be -1 (disable) or at least 1, got 0."),
        ({"max_new_tokens": -1}, "max_new_tokens must be at least 0, got -1."),
        ({"regex": "a+", "ebnf": "x"}, "Only one of json_schema, regex, ebnf, or structural_tag can be set."),
        ({"stop": [str(i) for i in range(33)]}, "at most 32 stop strings are allowed, got 33"),
        (
            {"stop_regex": [r"S\w+P"]},
            "The dev server does not implement stop_regex; use a real SGLang server.",
        ),
        ({"stop_regex": "a"}, "The dev server does not implement stop_regex; use a real SGLang server."),
        ({"repetition_penalty": 0}, "repetition_penalty must be in (0, 2] (1.0 = no penalty), got 0."),
        ({"repetition_penalty": 2.5}, "repetition_penalty must be in (0, 2] (1.0 = no penalty), got 2.5."),
        ({"min_new_tokens": -1}, "min_new_tokens must be in [0, max_new_tokens], got -1."),
        (
            {"min_new_tokens": 5, "max_new_tokens": 2},
            "min_new_tokens must be in [0, max_new_tokens(2)], got 5.",
        ),
        # The scripted vocabulary is the tokenizer's (151669 ids), not Qwen3's 151936 embeddings.
        ({"logit_bias": {"151669": 1.0}}, "logit_bias must has keys in [0, 151668], got 151669."),
        ({"logit_bias": {"abc": 1.0}}, "invalid literal for int() with base 10: 'abc'"),
        ({"sampling_seed": 2**63}, "sampling_seed must be in [-2**63, 2**63 - 1], got 9223372036854775808."),
        ({"beam_width": 0}, "beam_width must be at least 1, got 0."),
        (
            {"structural_tag": "{}"},
            "The dev server does not implement structural_tag; use a real SGLang server.",
        ),
    ],
)
async def test_e3_verify_messages(server, params, message):
    """SGLang 0.5.23 ``srt/sampling/sampling_params.py`` ``SamplingParams.normalize`` and ``verify``."""
    status, body = await post(server, {"input_ids": [1, 2, 3], "sampling_params": params})
    assert (status, body) == (400, {"error": {"message": message}})


@pytest.mark.parametrize(
    "params",
    [{"json_schema": "", "regex": ""}, {"temperature": 0, "top_k": 0}, {"repetition_penalty": 2}],
)
async def test_sampling_params_sglang_accepts(server, params):
    """``SamplingParams.__post_init__`` (same file): an empty grammar is unset, and a greedy
    temperature becomes ``top_k = 1`` before ``verify`` looks at ``top_k``."""
    status, _ = await post(server, {"input_ids": [1, 2, 3], "sampling_params": params})
    assert status == 200


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (
            {"custom_logit_processor": "{}"},
            "The server is not configured to enable custom logit processor. "
            "Please set `--enable-custom-logit-processor` to enable this feature.",
        ),
        (
            {"return_hidden_states": True},
            "The server is not configured to return hidden states. Please set "
            "`--return-hidden-states-mode last`, `--return-hidden-states-mode full`, or the legacy "
            "`--enable-return-hidden-states` flag.",
        ),
        (
            {"return_hidden_states": "last"},
            "The server is not configured to return hidden states. Please set "
            "`--return-hidden-states-mode last`, `--return-hidden-states-mode full`, or the legacy "
            "`--enable-return-hidden-states` flag.",
        ),
        (
            {"return_hidden_states": "all"},
            "return_hidden_states must be a boolean or the string literal 'last'.",
        ),
    ],
)
async def test_server_features_not_enabled_are_refused(server, payload, message):
    """SGLang 0.5.23 ``srt/managers/tokenizer_manager.py`` ``TokenizerManager._validate_one_request``
    (a server launched without ``--enable-custom-logit-processor`` or a hidden-states mode) and
    ``srt/managers/schedule_batch.py`` ``get_return_hidden_states_mode``."""
    status, body = await post(server, {"input_ids": [1, 2, 3], **payload})
    assert (status, body) == (400, {"error": {"message": message}})
    status, _ = await post(
        server, {"input_ids": [1, 2, 3], "custom_logit_processor": None, "return_hidden_states": False}
    )
    assert status == 200


async def test_token_ids_logprob_outside_vocabulary(server):
    """``TokenizerManager._validate_token_ids_logprob`` (``srt/managers/tokenizer_manager.py``)."""
    payload = {"input_ids": [1, 2, 3], "return_logprob": True, "token_ids_logprob": [5, 151669]}
    status, body = await post(server, payload)
    message = "token_ids_logprob contains out-of-vocabulary token id 151669; valid range is [0, 151669)."
    assert (status, body) == (400, {"error": {"message": message}})


async def test_top_k_minus_one_is_accepted(server, client):
    response = await client.generate([1, 2, 3], {"top_k": -1, "temperature": 0})
    assert response.finish_reason.type == "stop"


async def test_default_max_new_tokens_is_128(server, client, qwen3_tokenizer):
    response = await client.generate(chat(qwen3_tokenizer, "LONG"), {})
    assert response.output_ids == LONG_IDS[:128]
    assert response.finish_reason.raw == {"type": "length", "length": 128}


async def test_both_qwen3_eos_tokens_stop(server, client, qwen3_tokenizer):
    response = await client.generate(chat(qwen3_tokenizer, "ENDOFTEXT"), {})
    assert response.output_ids == [9707, ENDOFTEXT]
    assert response.finish_reason.raw == {"type": "stop", "matched": ENDOFTEXT}


async def test_stop_token_ids(server, client, qwen3_tokenizer):
    hello = qwen3_tokenizer.encode(HELLO, add_special_tokens=False)
    response = await client.generate(chat(qwen3_tokenizer, "hi"), {"stop_token_ids": [hello[2]]})
    assert response.output_ids == hello[:3]
    assert response.finish_reason.raw == {"type": "stop", "matched": hello[2]}
    assert response.text == qwen3_tokenizer.decode(hello[:2])


async def test_ignore_eos_disables_eos_and_stop_token_ids(server, client, qwen3_tokenizer):
    reply = [9707, ENDOFTEXT, 1879, IM_END]
    response = await client.generate(
        chat(qwen3_tokenizer, "ENDOFTEXT"), {"ignore_eos": True, "stop_token_ids": [1879]}
    )
    assert response.output_ids == reply  # the script ran out: ends as a length finish there
    assert response.finish_reason.raw == {"type": "length", "length": len(reply)}


async def test_ignore_eos_keeps_stop_strings(server, client, qwen3_tokenizer):
    response = await client.generate(chat(qwen3_tokenizer, "STOPSTR"), {"ignore_eos": True, "stop": "STOP"})
    assert response.finish_reason.raw == {"type": "stop", "matched": "STOP"}


# --------------------------------------------------------------------------- §5 finish reasons


async def test_eos_finish_shape(server, client, qwen3_tokenizer):
    response = await client.generate(chat(qwen3_tokenizer, "hi"), {})
    assert response.finish_reason.raw == {"type": "stop", "matched": IM_END}


async def test_length_finish_shape(server, client, qwen3_tokenizer):
    response = await client.generate(chat(qwen3_tokenizer, "hi"), {"max_new_tokens": 2})
    assert response.finish_reason.raw == {"type": "length", "length": 2}
    assert len(response.output_ids) == 2 == response.completion_tokens


async def test_stop_string_keeps_completing_token_and_trims_text(server, client, qwen3_tokenizer):
    prompt = chat(qwen3_tokenizer, "STOPSTR")
    response = await client.generate(prompt, {"stop": ["nope", "STOP"]})
    assert response.finish_reason.raw == {"type": "stop", "matched": "STOP"}
    assert response.text == "alpha beta "
    assert "STOP" in qwen3_tokenizer.decode(response.output_ids)
    assert "STOP" not in qwen3_tokenizer.decode(response.output_ids[:-1])  # later tokens dropped
    kept = await client.generate(prompt, {"stop": "STOP", "no_stop_trim": True})
    assert kept.text == "alpha beta STOP"  # cut just after the stop string
    assert kept.output_ids == response.output_ids


async def test_precedence_stop_string_over_eos(server, client, qwen3_tokenizer):
    # The EOS token itself completes the stop string "<|im_end|>": the string wins.
    response = await client.generate(chat(qwen3_tokenizer, "hi"), {"stop": "<|im_end|>"})
    assert response.finish_reason.raw == {"type": "stop", "matched": "<|im_end|>"}
    assert response.output_ids[-1] == IM_END


async def test_precedence_eos_over_length(server, client, qwen3_tokenizer):
    reply_len = len(qwen3_tokenizer.encode(HELLO, add_special_tokens=False)) + 1
    response = await client.generate(chat(qwen3_tokenizer, "hi"), {"max_new_tokens": reply_len})
    assert response.finish_reason.raw == {"type": "stop", "matched": IM_END}


@pytest.mark.parametrize(
    ("skip_special_tokens", "no_stop_trim", "suffix"),
    [(True, False, ""), (False, False, ""), (True, True, ""), (False, True, "<|im_end|>")],
)
async def test_im_end_text_matrix(server, client, qwen3_tokenizer, skip_special_tokens, no_stop_trim, suffix):
    params = {"skip_special_tokens": skip_special_tokens, "no_stop_trim": no_stop_trim}
    response = await client.generate(chat(qwen3_tokenizer, "hi"), params)
    assert response.output_ids[-1] == IM_END
    assert response.completion_tokens == len(response.output_ids)
    assert response.text == HELLO + suffix  # generated tokens only, never the prompt


async def test_max_new_tokens_zero(server, client):
    response = await client.generate([1, 2, 3], {"max_new_tokens": 0})
    assert response.output_ids == [] and response.output_logprobs == []
    assert response.finish_reason.raw == {"type": "length", "length": 0}


# --------------------------------------------------------------------------- §6 logprobs


async def test_output_logprob_entries(server, client, qwen3_tokenizer):
    prompt = chat(qwen3_tokenizer, "hi")
    status, body = await post(server, {"input_ids": prompt, "return_logprob": True})
    assert status == 200
    meta = body["meta_info"]
    entries = meta["output_token_logprobs"]
    assert len(entries) == len(body["output_ids"]) == meta["output_token_logprobs_length"]
    assert [entry[1] for entry in entries] == body["output_ids"]
    assert all(entry[2] is None for entry in entries)
    assert [entry[0] for entry in entries] == scripted_output_logprobs(prompt, body["output_ids"])
    assert meta["input_token_logprobs"] == []  # logprob_start_len defaults to -1
    # The client parses the entries into ids and logprobs and keeps the rest of meta_info.
    response = await client.generate(prompt, {})
    assert response.output_ids == body["output_ids"]
    assert response.output_logprobs == [entry[0] for entry in entries]
    assert response.input_logprobs == []
    assert (
        "output_token_logprobs" not in response.meta_info and "input_token_logprobs" not in response.meta_info
    )
    assert response.meta_info["output_token_logprobs_length"] == len(entries)


@pytest.mark.parametrize("flag", ["return_text_in_logprobs", "return_prompt_token_ids"])
async def test_unimplemented_response_extras_are_refused(server, flag):
    """Nothing here or in slime asks for token texts in logprobs or the prompt ids back: a 400."""
    status, body = await post(server, {"input_ids": [1, 2, 3], "return_logprob": True, flag: True})
    message = f"The dev server does not implement {flag}; send false or omit it."
    assert (status, body) == (400, {"error": {"message": message}})
    assert (await post(server, {"input_ids": [1, 2, 3], flag: False}))[0] == 200


@pytest.mark.parametrize("start", [0, 2, 5])
async def test_input_logprobs_from_logprob_start_len(server, client, start):
    prompt = [11, 12, 13, 14, 15]
    status, body = await post(
        server, {"input_ids": prompt, "return_logprob": True, "logprob_start_len": start}
    )
    assert status == 200
    entries = body["meta_info"]["input_token_logprobs"]
    response = await client.generate(prompt, {}, logprob_start_len=start)
    assert response.input_logprobs == [entry[0] for entry in entries]
    assert len(entries) == len(prompt) - start
    assert [entry[1] for entry in entries] == prompt[start:]
    if entries:
        assert entries[0] == [None, prompt[start], None]
        assert all(isinstance(entry[0], float) and entry[0] < 0 for entry in entries[1:])


async def test_logprob_start_len_beyond_prompt(server):
    status, body = await post(
        server, {"input_ids": [1, 2, 3], "return_logprob": True, "logprob_start_len": 4}
    )
    assert status == 400
    assert body == {
        "error": {
            "message": "req.logprob_start_len=4 is higher than the number of input tokens "
            "len(req.origin_input_ids)=3. Please use a smaller logprob_start_len."
        }
    }
    status, _ = await post(server, {"input_ids": [1, 2, 3], "logprob_start_len": 4})
    assert status == 200  # ignored without return_logprob


async def test_logprob_start_len_caps_prefix_reuse(server, client, qwen3_tokenizer):
    prompt = chat(qwen3_tokenizer, "reuse")
    await client.generate(prompt, {})
    assert (await client.generate(prompt, {}, logprob_start_len=3)).cached_tokens <= 3
    assert (await client.generate(prompt, {}, logprob_start_len=0)).cached_tokens == 0
    assert (await client.generate(prompt, {})).cached_tokens == len(prompt) - 1


@pytest.mark.parametrize("option", [{"top_logprobs_num": 3}, {"token_ids_logprob": [5, 6]}])
async def test_scripted_backend_refuses_top_logprobs(server, option):
    """Scripted logprobs are no distribution; the hf backend serves these (checked against SGLang)."""
    status, body = await post(server, {"input_ids": [1, 2, 3], "return_logprob": True, **option})
    assert status == 400 and "use the hf backend" in body["error"]["message"]


# --------------------------------------------------------------------------- §7 limits and errors


@pytest.fixture
async def small_server():
    async with DevServer("scripted", script=SCRIPT, context_length=64) as srv:
        yield srv


async def test_prompt_not_shorter_than_context(small_server):
    status, body = await post(small_server, {"input_ids": [7] * 64})
    assert (status, body) == (
        400,
        {
            "error": {
                "message": "The input (64 tokens) is longer than the model's context length (64 tokens)."
            }
        },
    )


async def test_prompt_plus_max_new_tokens_over_context(small_server):
    async with SGLangClient(small_server.url, max_retries=0) as client:
        with pytest.raises(SGLangContextLengthError) as caught:
            await client.generate([7] * 60, {"max_new_tokens": 10})
    assert json.loads(caught.value.body)["error"]["message"] == (
        "Requested token count exceeds the model's maximum context length of 64 tokens. You requested a "
        "total of 70 tokens: 60 tokens from the input messages and 10 tokens for the completion. Please "
        "reduce the number of tokens in the input messages or the completion to fit within the limit."
    )


async def test_scheduler_input_limit_and_silent_clipping(small_server, qwen3_tokenizer):
    long_prompt = chat(qwen3_tokenizer, "LONG")
    pad = lambda n: long_prompt + [7] * (n - len(long_prompt))  # noqa: E731
    status, body = await post(small_server, {"input_ids": pad(58)})  # C-6: no M sent, still refused
    assert status == 400
    assert body["error"]["message"] == (
        "Input length (58 tokens) exceeds the maximum allowed length (58 tokens). "
        "Use a shorter input or enable --allow-auto-truncate."
    )
    status, body = await post(small_server, {"input_ids": pad(57)})  # C-7 fits; output <= C-2-N
    assert status == 200 and body["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    status, body = await post(small_server, {"input_ids": pad(50), "sampling_params": {"max_new_tokens": 14}})
    assert status == 200 and body["meta_info"]["finish_reason"] == {"type": "length", "length": 12}


@pytest.fixture
async def speculative_server():
    async with DevServer(
        "scripted",
        script=SCRIPT,
        context_length=64,
        speculative_algorithm="EAGLE",
        speculative_num_draft_tokens=4,
    ) as srv:
        yield srv


async def test_speculative_draft_tokens_count_as_prompt_tokens(speculative_server, small_server):
    """SGLang 0.5.23 ``srt/managers/tokenizer_manager.py`` ``TokenizerManager._validate_one_request``
    adds ``self.num_reserved_tokens`` (``srt/managers/utils.py`` ``compute_num_reserved_tokens``:
    ``max(eagle_topk * num_steps, num_draft_tokens)`` for EAGLE/EAGLE3/NEXTN) to the input length
    before both context checks, so exactly ``C - N`` new tokens is a 400 there."""
    status, _ = await post(small_server, {"input_ids": [7] * 50, "sampling_params": {"max_new_tokens": 14}})
    assert status == 200  # without speculative decoding N + M == C fits
    status, body = await post(
        speculative_server, {"input_ids": [7] * 50, "sampling_params": {"max_new_tokens": 14}}
    )
    assert (status, body) == (
        400,
        {
            "error": {
                "message": "Requested token count exceeds the model's maximum context length of 64 tokens. "
                "You requested a total of 68 tokens: 54 tokens from the input messages and 14 tokens for "
                "the completion. Please reduce the number of tokens in the input messages or the "
                "completion to fit within the limit."
            }
        },
    )
    status, body = await post(
        speculative_server, {"input_ids": [7] * 50, "sampling_params": {"max_new_tokens": 10}}
    )
    assert status == 200 and body["meta_info"]["prompt_tokens"] == 50  # the reservation is not reported
    status, body = await post(speculative_server, {"input_ids": [7] * 60})
    assert (status, body["error"]["message"]) == (
        400,
        "The input (64 tokens) is longer than the model's context length (64 tokens).",
    )


async def test_server_info_reports_speculative_decoding(speculative_server, server):
    """SGLang 0.5.23 ``srt/utils/common.py`` ``build_server_info`` returns the resolved server args,
    speculative ones included (null without speculative decoding)."""
    _status, info = await get(speculative_server, "/server_info")
    assert {key: info[key] for key in info if key.startswith("speculative_")} == {
        "speculative_algorithm": "EAGLE",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
    }
    _status, info = await get(server, "/server_info")
    assert info["speculative_algorithm"] is None and info["speculative_num_draft_tokens"] is None
    async with SGLangClient(speculative_server.url, max_retries=0) as client:
        assert await client.reserved_context_tokens() == 4
        assert await client.usable_context_length() == 64 - 4
    async with SGLangClient(server.url, max_retries=0) as client:
        assert await client.usable_context_length() == 4096


async def test_nextn_is_reported_as_eagle():
    """SGLang 0.5.23 ``srt/arg_groups/speculative_hook.py`` ``_resolve_speculative_algorithm_alias``."""
    async with DevServer("scripted", script=SCRIPT, speculative_algorithm="nextn") as srv:
        _status, info = await get(srv, "/server_info")
    assert (info["speculative_algorithm"], info["speculative_num_draft_tokens"]) == ("EAGLE", 4)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"speculative_algorithm": "NGRAM"}, "speculative_algorithm must be one of EAGLE, EAGLE3, NEXTN"),
        ({"speculative_num_draft_tokens": 4}, "speculative_num_draft_tokens needs speculative_algorithm"),
        (
            {"speculative_algorithm": "EAGLE3", "speculative_num_draft_tokens": 1},
            "speculative_num_draft_tokens must be at least 2",
        ),
    ],
)
def test_speculative_options_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        DevServer("scripted", **options)


async def test_input_ids_outside_vocabulary(server):
    status, body = await post(server, {"input_ids": [1, 10**7]})
    assert status == 400 and "outside the vocabulary" in body["error"]["message"]


# --------------------------------------------------------------------------- §8 other endpoints


async def test_health(server):
    for path in ("/health", "/health_generate"):
        async with aiohttp.ClientSession() as session, session.get(server.url + path) as resp:
            assert resp.status == 200 and await resp.read() == b""


async def test_model_info(server, client):
    info = await client.model_info()
    assert info["tokenizer_path"] and info["model_path"] == "scripted:inline"
    assert info["is_generation"] is True and info["weight_version"] == "v7"
    assert (await get(server, "/get_model_info"))[1] == info


async def test_server_info(server, client):
    info = await client.server_info()
    assert info["status"] == "ready" and info["version"] == "0.5.23"
    assert info["context_length"] == 4096  # set explicitly here
    assert info["max_req_input_len"] == 4096 - 1 - 5
    assert info["max_total_num_tokens"] > 4096
    assert info["devserver"]["backend"] == "scripted"
    assert (await get(server, "/get_server_info"))[0] == 200


async def test_server_info_context_length_null_unless_set():
    async with DevServer("scripted", script=SCRIPT) as srv:
        status, info = await get(srv, "/server_info")
        assert status == 200 and info["context_length"] is None
        assert (await get(srv, "/v1/models"))[1]["data"][0]["max_model_len"] == 40960


async def test_v1_models_reports_context_length(server, client):
    assert await client.max_model_len() == 4096
    _status, body = await get(server, "/v1/models")
    assert body["object"] == "list" and body["data"][0]["max_model_len"] == 4096


async def test_v1_loads_counts_running_and_waiting(slow_server, slow_client, qwen3_tokenizer):
    running = asyncio.create_task(slow_client.generate(chat(qwen3_tokenizer, "LONG"), {}))
    queued = asyncio.create_task(slow_client.generate(chat(qwen3_tokenizer, "LONG"), {}))
    await wait_until(lambda: slow_server.scheduler.num_waiting == 1)
    _status, body = await get(slow_server, "/v1/loads?include=core")  # what slime polls after an abort
    load = body["loads"][0]
    assert (load["num_running_reqs"], load["num_waiting_reqs"]) == (1, 1)
    await slow_client.abort(abort_all=True)
    await asyncio.gather(running, queued)
    _status, body = await get(slow_server, "/v1/loads?include=core")
    assert body["loads"][0]["num_running_reqs"] + body["loads"][0]["num_waiting_reqs"] == 0


async def test_update_weight_version_aborts_and_switches(slow_server, slow_client, qwen3_tokenizer):
    running = asyncio.create_task(slow_client.generate(chat(qwen3_tokenizer, "LONG"), {}))
    await wait_until(lambda: slow_server.scheduler.num_running == 1)
    status, body = await post(slow_server, {"new_version": "step-3"}, "/update_weight_version")
    assert (status, body["success"], body["new_version"]) == (200, True, "step-3")
    aborted = await running
    assert aborted.is_abort
    after = await slow_client.generate([1, 2, 3], {"max_new_tokens": 1})
    assert after.weight_version == "step-3"


async def test_flush_cache(server, client, qwen3_tokenizer):
    """SGLang 0.5.23 ``srt/entrypoints/http_server.py`` ``flush_cache``: GET or POST, plain text."""
    flushed = (
        "Cache flushed.\nPlease check backend logs for more details. "
        "(When there are running or waiting requests, the operation will not be performed.)\n"
    )
    prompt = chat(qwen3_tokenizer, "flush")
    await client.generate(prompt, {})
    status, text = await post(server, {}, "/flush_cache")
    assert (status, text) == (200, flushed)
    assert (await client.generate(prompt, {})).cached_tokens < len(prompt) - 1
    await client.generate(prompt, {})
    async with aiohttp.ClientSession() as session, session.get(server.url + "/flush_cache") as resp:
        assert (resp.status, await resp.text()) == (200, flushed)  # slime's SGLangEngine.flush_cache uses GET
    assert (await client.generate(prompt, {})).cached_tokens < len(prompt) - 1


async def test_flush_cache_refused_while_requests_are_live(slow_server, slow_client, qwen3_tokenizer):
    """``Scheduler.flush_cache`` (``srt/managers/scheduler.py``) flushes only when fully idle; the
    route then answers 400 ``ret.message or "Flush cache failed.\n"`` (the message is empty)."""
    running = asyncio.create_task(slow_client.generate(chat(qwen3_tokenizer, "LONG"), {}))
    await wait_until(lambda: slow_server.scheduler.num_running == 1)
    async with aiohttp.ClientSession() as session, session.get(slow_server.url + "/flush_cache") as resp:
        assert (resp.status, await resp.text()) == (400, "Flush cache failed.\n")
    await slow_client.abort(abort_all=True)
    await running


async def test_pause_blocks_generate_until_continue(server, client):
    """slime pauses with ``{}`` (SGLang's default mode ``abort``) around a weight update: new requests
    wait until ``/continue_generation``."""
    status, _ = await post(server, {}, "/pause_generation")
    assert status == 200 and server.scheduler.paused
    pending = asyncio.create_task(client.generate([1, 2, 3], {}))
    await wait_until(lambda: len(server.request_log) == 1)
    assert not pending.done() and not server.scheduler.live
    await post(server, {}, "/continue_generation")
    assert (await asyncio.wait_for(pending, 30)).finish_reason.type == "stop"


# --------------------------------------------------------------------------- §9 batches and n > 1


@pytest.mark.parametrize(
    ("field", "payload"),
    [
        ("text", {"text": ["one", "two"]}),
        ("input_ids", {"input_ids": [[1, 2], [3, 4]]}),
        ("sampling_params", {"input_ids": [1, 2], "sampling_params": [{"max_new_tokens": 1}]}),
        ("rid", {"input_ids": [1, 2], "rid": ["a"]}),
        ("return_logprob", {"input_ids": [1, 2], "return_logprob": [True], "sampling_params": {"n": 2}}),
        ("logprob_start_len", {"input_ids": [1, 2], "logprob_start_len": [0]}),
        ("top_logprobs_num", {"input_ids": [1, 2], "top_logprobs_num": [1]}),
        ("token_ids_logprob", {"input_ids": [1, 2], "token_ids_logprob": [[5]]}),
    ],
)
async def test_batch_requests_are_refused_naming_the_field(server, field, payload):
    """Batch requests are not emulated (neither our client nor slime sends them)."""
    status, body = await post(server, payload)
    message = (
        f"The dev server does not implement batch requests: {field} is a list. Send one prompt per request."
    )
    assert (status, body) == (400, {"error": {"message": message}})
    assert server.request_log[-1]["status"] == 400 and not server.scheduler.live


async def test_n_samples_get_fresh_rids(server):
    status, body = await post(server, {"input_ids": [1, 2, 3], "rid": "mine", "sampling_params": {"n": 3}})
    assert status == 200 and isinstance(body, list) and len(body) == 3
    rids = [item["meta_info"]["id"] for item in body]
    assert "mine" not in rids and len(set(rids)) == 3
    assert all(item["meta_info"]["cached_tokens"] == 2 for item in body)  # the warm-up cached the prompt


async def test_abort_by_caller_rid_misses_n_samples(slow_server, qwen3_tokenizer):
    payload = {"input_ids": chat(qwen3_tokenizer, "hi"), "rid": "group", "sampling_params": {"n": 2}}
    pending = asyncio.create_task(post(slow_server, payload))
    await wait_until(lambda: len(slow_server.scheduler.live) == 2)  # the two samples, after the warm-up
    await post(slow_server, {"rid": "group"}, "/abort_request")
    status, body = await pending
    assert status == 200 and all(item["meta_info"]["finish_reason"]["type"] == "stop" for item in body)


# --------------------------------------------------------------------------- §10 abort


async def test_abort_endpoint_is_silent(server):
    async with aiohttp.ClientSession() as session:
        for payload in ({"rid": "nobody"}, {"abort_all": True}, {"rid": ""}):
            async with session.post(server.url + "/abort_request", json=payload) as resp:
                assert resp.status == 200 and await resp.read() == b""


async def test_abort_running_returns_partial_output(slow_server, slow_client, qwen3_tokenizer):
    prompt = chat(qwen3_tokenizer, "LONG")
    pending = asyncio.create_task(slow_client.generate(prompt, {}, rid="run-1"))
    await wait_until(lambda: "run-1" in slow_server.scheduler.live)
    await wait_until(
        lambda: "run-1" not in slow_server.scheduler.live or slow_server.scheduler.live["run-1"].output_ids
    )
    await slow_client.abort("run-1")
    response = await pending
    assert response.finish_reason.raw == {
        "type": "abort",
        "message": "Aborted",
        "status_code": None,
        "err_type": None,
    }
    assert 0 < len(response.output_ids) < len(LONG_IDS)
    assert response.output_ids == LONG_IDS[: len(response.output_ids)]
    assert len(response.output_logprobs) == len(response.output_ids) == response.completion_tokens
    assert list(response.meta_info) == parsed_keys(META_KEYS)  # complete meta_info
    assert response.prompt_tokens == len(prompt)


async def test_abort_queued_returns_queued_shape(slow_server, slow_client, qwen3_tokenizer):
    running = asyncio.create_task(slow_client.generate(chat(qwen3_tokenizer, "LONG"), {}, rid="r"))
    await wait_until(lambda: slow_server.scheduler.num_running == 1)
    queued = asyncio.create_task(slow_client.generate([1, 2, 3], {}, rid="q"))
    await wait_until(lambda: slow_server.scheduler.num_waiting == 1)
    await slow_client.abort("q")
    response = await queued
    assert (response.text, response.output_ids) == ("", [])
    assert list(response.meta_info) == parsed_keys(QUEUED_META_KEYS)
    assert response.meta_info["finish_reason"] == {"type": "abort", "message": "Abort in waiting queue"}
    assert response.meta_info["completion_tokens"] == 0 and response.prompt_tokens is None
    await slow_client.abort("r")
    await running


async def test_abort_needs_an_exact_live_rid(slow_server, slow_client, qwen3_tokenizer):
    """SGLang 0.5.23 ``srt/managers/tokenizer_manager.py`` ``TokenizerManager.abort_request``:
    ``rid_to_state.get(rid)`` is None for a prefix or unknown rid, so nothing is sent to the
    scheduler (one tokenizer worker)."""
    prompt = chat(qwen3_tokenizer, "LONG")
    running = asyncio.create_task(slow_client.generate(prompt, {}, rid="abc_0"))
    await wait_until(lambda: slow_server.scheduler.num_running == 1)
    queued = asyncio.create_task(slow_client.generate(prompt, {}, rid="abc_1"))
    await wait_until(lambda: slow_server.scheduler.num_waiting == 1)
    for rid in ("abc", "ab", "abc_", "abc_2", ""):
        await post(slow_server, {"rid": rid}, "/abort_request")
    # An abort takes effect before /abort_request answers: none of these touched a live request.
    live = slow_server.scheduler.live
    assert sorted(live) == ["abc_0", "abc_1"] and not any(req.abort_requested for req in live.values())
    assert (slow_server.scheduler.num_running, slow_server.scheduler.num_waiting) == (1, 1)
    await post(slow_server, {"rid": "abc_1"}, "/abort_request")  # exact: the queued one
    await post(slow_server, {"rid": "abc_0"}, "/abort_request")
    first, second = await asyncio.gather(running, queued)
    assert first.finish_reason.message == "Aborted"
    assert 0 < len(first.output_ids) < len(LONG_IDS)
    assert second.finish_reason.raw == {"type": "abort", "message": "Abort in waiting queue"}


async def test_exact_abort_also_takes_live_rids_it_prefixes(slow_server, slow_client, qwen3_tokenizer):
    """SGLang 0.5.23 ``srt/managers/scheduler.py`` ``Scheduler.abort_request``: once forwarded, the
    abort matches ``req.rid.startswith(recv_req.rid)`` in the waiting queue and the running batch."""
    prompt = chat(qwen3_tokenizer, "LONG")
    job = asyncio.create_task(slow_client.generate(prompt, {}, rid="job"))
    job_2 = asyncio.create_task(slow_client.generate(prompt, {}, rid="job-2"))
    await wait_until(lambda: len(slow_server.scheduler.live) == 2)
    await slow_client.abort("job")
    first, second = await asyncio.gather(job, job_2)
    assert first.finish_reason.message == "Aborted"
    assert second.finish_reason.raw == {"type": "abort", "message": "Abort in waiting queue"}


async def test_client_disconnect_aborts_the_request(slow_server, slow_client, qwen3_tokenizer):
    hung = asyncio.create_task(slow_client.generate(chat(qwen3_tokenizer, "LONG"), {}))
    await wait_until(lambda: slow_server.scheduler.num_running == 1)
    hung.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hung
    # The only running slot is freed at once, not after the remaining ~290 tokens x 20 ms.
    response = await asyncio.wait_for(slow_client.generate([1, 2, 3], {"max_new_tokens": 2}), 2)
    assert response.completion_tokens == 2


# --------------------------------------------------------------------------- §11 streaming


async def test_streaming_is_refused_naming_the_field(server):
    """Streaming is not emulated (neither our client nor slime's default rollout streams)."""
    status, body = await post(server, {"input_ids": [1, 2, 3], "stream": True})
    message = "The dev server does not implement stream; send false or omit it."
    assert (status, body) == (400, {"error": {"message": message}})
    assert (await post(server, {"input_ids": [1, 2, 3], "stream": False}))[0] == 200


# --------------------------------------------------------------------------- §12 routing header


async def test_routing_key_header_is_accepted_and_logged(server, client):
    await client.generate([1, 2, 3], {}, routing_key="session-42")
    entry = server.request_log[-1]
    assert entry["headers"]["X-SMG-Routing-Key"] == "session-42"
    assert entry["json"]["input_ids"] == [1, 2, 3] and entry["status"] == 200


# --------------------------------------------------------------------------- /dev hooks


async def test_request_log_over_http(server, client):
    await client.generate([1, 2, 3], {})
    await post(server, {"input_ids": []})
    _status, log = await get(server, "/dev/requests")
    assert [entry["status"] for entry in log] == [200, 400]
    assert log[1]["json"] == {"input_ids": []}
    async with aiohttp.ClientSession() as session, session.delete(server.url + "/dev/requests") as resp:
        assert (await resp.json()) == {"cleared": 2}
    assert server.request_log == []


async def test_request_log_is_bounded():
    async with DevServer("scripted", script=SCRIPT, request_log_size=3) as srv:
        for i in range(5):
            await post(srv, {"input_ids": [i + 1]})
        assert [entry["json"]["input_ids"] for entry in srv.request_log] == [[3], [4], [5]]


async def test_http_errors_are_typed_by_the_client(server, client):
    with pytest.raises(SGLangHTTPError) as caught:
        await client.generate([1, 2], {"top_p": 0})
    assert caught.value.status == 400 and not caught.value.retryable


def test_request_log_bounds_bytes_and_keeps_raw_bodies():
    from strands_slime.devserver.request_log import RequestLog

    log = RequestLog(max_entries=100, max_bytes=60)
    for i in range(4):
        log.add({"n": str(i)}, json.dumps({"input_ids": [i] * 5}).encode())  # 30 bytes each
    assert [entry["headers"]["n"] for entry in log.entries()] == ["2", "3"]
    log.add({"Authorization": "Bearer secret"}, b"{oops")
    assert {k: v for k, v in log.entries()[-1].items() if k != "time"} == {
        "json": None,
        "headers": {"Authorization": "<redacted>"},
        "status": None,
    }
    assert log.clear() == 2 and log.entries() == []


async def test_pause_abort_mode_aborts_running_requests(slow_server, slow_client, qwen3_tokenizer):
    running = asyncio.create_task(slow_client.generate(chat(qwen3_tokenizer, "LONG"), {}))
    await wait_until(lambda: slow_server.scheduler.num_running == 1)
    status, body = await post(slow_server, {"mode": "abort"}, "/pause_generation")
    # SGLang 0.5.23 srt/entrypoints/http_server.py pause_generation / continue_generation replies, and
    # TokenizerManager.pause_generation returns only once the aborted requests have ended.
    assert (status, body) == (200, {"message": "Generation paused successfully.", "status": "ok"})
    assert slow_server.scheduler.num_running == 0 and not slow_server.scheduler.live
    assert (await running).is_abort
    status, body = await post(slow_server, {"mode": "sideways"}, "/pause_generation")
    assert status == 400 and body["type"] == "Bad Request" and "mode" in body["message"]  # Literal field
    status, body = await post(slow_server, {}, "/continue_generation")
    assert (status, body) == (200, {"message": "Generation continued successfully.", "status": "ok"})
    assert (await slow_client.generate([1, 2, 3], {"max_new_tokens": 1})).completion_tokens == 1
