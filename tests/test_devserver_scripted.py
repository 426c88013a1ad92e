"""The scripted backend: script format, reply selection, tokenization, logprobs, latency."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from helpers import noncanonical_reply

from benchmarks.devserver_reference import scripted_output_logprobs
from strands_slime.devserver import DevServer, Script, ScriptError, scripted_input_logprobs, scripted_logprob
from strands_slime.provider.client import SGLangBadRequestError, SGLangClient

pytestmark = pytest.mark.unit

IM_END = 151645


async def wait_until(condition: Any, timeout: float = 30.0) -> None:
    """Poll ``condition()`` until it holds; fail after ``timeout`` seconds (a hang guard, not a timing check)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached before the deadline"
        await asyncio.sleep(0.01)


def chat(tokenizer: Any, user: str, turns: int = 0) -> list[int]:
    text = f"<|im_start|>user\n{user}<|im_end|>\n"
    text += "<|im_start|>assistant\nok<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n" * turns
    text += "<|im_start|>assistant\n"
    return tokenizer.encode(text, add_special_tokens=False)


async def generate(script: Any, prompt: list[int], params: dict[str, Any] | None = None, **options: Any):
    async with DevServer("scripted", script=script, **options) as server:
        async with SGLangClient(server.url, max_retries=0) as client:
            return await client.generate(prompt, params or {})


# --------------------------------------------------------------------------- script format


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        ([], "rules: List should have at least 1 item"),
        ({"rules": [{"replies": ["a"]}], "extra": 1}, "script.extra: Extra inputs are not permitted"),
        (["just a string"], "rules[0]: Input should be a valid dictionary"),
        ([{"replies": ["a"], "when": "x"}], "rules[0].when: Extra inputs are not permitted"),
        ([{"replies": []}], "rules[0].replies: List should have at least 1 item"),
        ([{"match": "", "replies": ["a"]}], "rules[0].match"),
        ([{"replies": [{"text": "a", "token_ids": [1]}]}], "exactly one of 'text' or 'token_ids'"),
        ([{"replies": [{"token_ids": [1, -2]}]}], "rules[0].replies[0].token_ids"),
        ([{"replies": [{"token_ids": []}]}], "rules[0].replies[0].token_ids"),
        (  # the noncanonical convenience left the package: tests/helpers.noncanonical_reply builds the ids
            [{"replies": [{"text": "a", "noncanonical": True}]}],
            "rules[0].replies[0].noncanonical: Extra inputs are not permitted",
        ),
        ([{"replies": [{"text": 5}]}], "rules[0].replies[0].text: Input should be a valid string"),
        ([{"replies": [7]}], "rules[0].replies[0]: Input should be a valid dictionary"),
    ],
)
def test_bad_scripts_name_the_problem(obj, fragment):
    with pytest.raises(ScriptError) as caught:
        Script.from_obj(obj)
    assert fragment in str(caught.value)


def test_script_files(tmp_path):
    rules = [{"match": "x", "replies": ["one", {"token_ids": [1, 2]}]}]
    (tmp_path / "s.json").write_text(json.dumps({"rules": rules}))
    (tmp_path / "s.yaml").write_text("- match: x\n  replies:\n    - one\n    - token_ids: [1, 2]\n")
    from_json, from_yaml = Script.load(tmp_path / "s.json"), Script.load(tmp_path / "s.yaml")
    assert from_json.rules == from_yaml.rules
    assert from_json.name == "s.json"
    (tmp_path / "bad.yaml").write_text("- match: [unclosed\n")
    with pytest.raises(ScriptError, match="cannot parse"):
        Script.load(tmp_path / "bad.yaml")
    with pytest.raises(ScriptError, match="cannot read"):
        Script.load(tmp_path / "missing.json")


# --------------------------------------------------------------------------- reply selection


async def test_reply_index_counts_assistant_turns_and_repeats_the_last(qwen3_tokenizer):
    script = [{"match": "quiz", "replies": ["first", "second", "third"]}]
    async with (
        DevServer("scripted", script=script) as server,
        SGLangClient(server.url, max_retries=0) as client,
    ):
        texts = [(await client.generate(chat(qwen3_tokenizer, "quiz", turns), {})).text for turns in range(5)]
    assert texts == ["first", "second", "third", "third", "third"]


async def test_first_matching_rule_wins_and_none_matches_all(qwen3_tokenizer):
    script = [
        {"match": "apple", "replies": ["A"]},
        {"match": "apple pie", "replies": ["never"]},
        {"match": None, "replies": ["fallback"]},
    ]
    async with (
        DevServer("scripted", script=script) as server,
        SGLangClient(server.url, max_retries=0) as client,
    ):
        assert (await client.generate(chat(qwen3_tokenizer, "apple pie"), {})).text == "A"
        assert (await client.generate(chat(qwen3_tokenizer, "banana"), {})).text == "fallback"


async def test_match_sees_special_tokens(qwen3_tokenizer):
    script = [{"match": "<|im_start|>system", "replies": ["has system"]}, {"replies": ["no system"]}]
    prompt = qwen3_tokenizer.encode("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>assistant\n")
    assert (await generate(script, prompt)).text == "has system"


async def test_no_matching_rule_is_a_clear_400(qwen3_tokenizer):
    script = [{"match": "only this", "replies": ["x"]}]
    async with (
        DevServer("scripted", script=script) as server,
        SGLangClient(server.url, max_retries=0) as client,
    ):
        with pytest.raises(SGLangBadRequestError) as caught:
            await client.generate(chat(qwen3_tokenizer, "something else"), {})
    message = json.loads(caught.value.body)["error"]["message"]
    assert "no script rule matches the prompt" in message and "'only this'" in message


async def test_default_script_answers_everything():
    async with DevServer("scripted") as server, SGLangClient(server.url, max_retries=0) as client:
        response = await client.generate([1, 2, 3], {})
    assert response.text == "Hello from the strands_slime dev server."


async def test_script_object_and_file_path_are_accepted(tmp_path, qwen3_tokenizer):
    path = tmp_path / "script.yaml"
    path.write_text("rules:\n  - replies: [from file]\n")
    assert (await generate(str(path), [1, 2])).text == "from file"
    assert (await generate(Script.from_obj([{"replies": ["from object"]}]), [1, 2])).text == "from object"


# --------------------------------------------------------------------------- tokenization


async def test_text_reply_is_canonical_tokens_plus_eos(qwen3_tokenizer):
    text = "Let me compute: <tool_call>\n{}\n</tool_call>"
    response = await generate([{"replies": [text]}], [1, 2], {"skip_special_tokens": False})
    assert response.output_ids == [*qwen3_tokenizer.encode(text, add_special_tokens=False), IM_END]
    assert response.text == text


async def test_noncanonical_reply_decodes_to_the_same_text(qwen3_tokenizer):
    text = "The answer is 42, obviously."
    response = await generate([{"replies": [noncanonical_reply(qwen3_tokenizer, text)]}], [1, 2])
    ids = response.output_ids[:-1]
    assert response.output_ids[-1] == IM_END and response.finish_reason.raw == {
        "type": "stop",
        "matched": IM_END,
    }
    assert qwen3_tokenizer.decode(ids) == text == response.text
    canonical = qwen3_tokenizer.encode(text, add_special_tokens=False)
    assert canonical != ids and len(ids) > len(canonical)
    with pytest.raises(ValueError, match="no non-canonical tokenization"):
        noncanonical_reply(qwen3_tokenizer, "\n")  # one byte: nothing to split


async def test_token_ids_reply_is_verbatim_without_eos():
    response = await generate([{"replies": [{"token_ids": [5, 6, 7]}]}], [1, 2])
    assert response.output_ids == [5, 6, 7]
    assert response.finish_reason.raw == {"type": "length", "length": 3}


async def test_token_ids_outside_vocabulary_fail_at_start():
    with pytest.raises(ScriptError, match="outside the vocabulary"):
        async with DevServer("scripted", script=[{"replies": [{"token_ids": [10**7]}]}]):
            pass


# --------------------------------------------------------------------------- logprobs


async def test_logprobs_are_deterministic_and_depend_on_prompt(qwen3_tokenizer):
    script = [{"replies": ["same reply for everyone"]}]
    async with (
        DevServer("scripted", script=script) as server,
        SGLangClient(server.url, max_retries=0) as client,
    ):
        first = await client.generate([1, 2, 3], {})
        again = await client.generate([1, 2, 3], {})
        other = await client.generate([1, 2, 4], {})
        with_input = await client.generate([1, 2, 3], {}, logprob_start_len=1)
    assert first.output_logprobs == again.output_logprobs
    assert first.output_ids == other.output_ids and first.output_logprobs != other.output_logprobs
    assert first.output_logprobs == scripted_output_logprobs([1, 2, 3], first.output_ids)
    assert all(-8.0 < value <= -0.7 for value in first.output_logprobs)
    assert with_input.input_logprobs == scripted_input_logprobs([1, 2, 3], 1)


def test_scripted_logprob_depends_on_every_argument():
    base = scripted_logprob(1, 2, 3)
    assert base == scripted_logprob(1, 2, 3)
    assert len({base, scripted_logprob(9, 2, 3), scripted_logprob(1, 9, 3), scripted_logprob(1, 2, 9)}) == 4


# --------------------------------------------------------------------------- latency and concurrency


async def test_request_latency_delays_the_reply():
    started = time.perf_counter()
    response = await generate([{"replies": ["hi"]}], [1, 2], latency=0.2)
    assert time.perf_counter() - started >= 0.2 and response.meta_info["e2e_latency"] >= 0.2


async def test_token_latency_paces_each_token():
    started = time.perf_counter()
    response = await generate([{"replies": [{"token_ids": [5] * 10}]}], [1, 2], token_latency=0.02)
    assert len(response.output_ids) == 10 and time.perf_counter() - started >= 0.2


async def test_max_running_requests_queues_the_rest():
    script = [{"replies": [{"token_ids": [5] * 30}]}]  # 0.6 s each: all four arrive while two run
    async with (
        DevServer("scripted", script=script, token_latency=0.02, max_running_requests=2) as server,
        SGLangClient(server.url, max_retries=0) as client,
    ):
        tasks = [asyncio.create_task(client.generate([i + 1, 2], {})) for i in range(4)]
        await wait_until(lambda: server.scheduler.num_waiting == 2)
        assert server.scheduler.num_running == 2
        results = await asyncio.gather(*tasks)
    assert all(len(result.output_ids) == 30 for result in results)


async def test_many_concurrent_requests_zero_latency(qwen3_tokenizer):
    script = [{"replies": ["short answer"]}]
    async with (
        DevServer("scripted", script=script) as server,
        SGLangClient(server.url, max_retries=0) as client,
    ):
        prompts = [chat(qwen3_tokenizer, f"user {i}") for i in range(200)]
        results = await asyncio.gather(*(client.generate(prompt, {}) for prompt in prompts))
    assert {result.text for result in results} == {"short answer"}


# --------------------------------------------------------------------------- tokenizer


def test_rust_tokenizer_equals_the_transformers_tokenizer(qwen3_tokenizer):
    from strands_slime.devserver.tokens import load_devserver_tokenizer

    fast = load_devserver_tokenizer()
    assert len(fast) == len(qwen3_tokenizer)
    assert fast.eos_token_id == qwen3_tokenizer.eos_token_id == IM_END
    texts = [
        "Hello, world! 123",
        "   leading spaces",
        "café 你好世界 \u0065\u0301",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        '<tool_call>\n{"name": "python"}\n</tool_call>',
    ]
    for text in texts:
        for special in (True, False):
            ids = qwen3_tokenizer.encode(text, add_special_tokens=special)
            assert fast.encode(text, add_special_tokens=special) == ids
            for skip in (True, False):
                assert fast.decode(ids, skip_special_tokens=skip) == qwen3_tokenizer.decode(
                    ids, skip_special_tokens=skip
                )
    assert fast.decode([9707, 0xE4, 151645][:2]) == qwen3_tokenizer.decode([9707, 0xE4])
    assert fast.convert_ids_to_tokens(1879) == qwen3_tokenizer.convert_ids_to_tokens(1879)


@pytest.mark.slow
def test_scripted_server_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from benchmarks.devserver_runners import DevServerThread\n"
        "with DevServerThread('scripted') as server:\n"
        "    pass\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=True
    )
    assert result.stdout.strip() == "False"


async def test_prompt_text_is_exact_across_a_split_character(qwen3_tokenizer):
    """Turn 2 reuses turn 1's decoded text only at a clean character boundary."""
    script = [{"match": "你好", "replies": ["found"]}, {"replies": ["nope"]}]
    byte_pieces = qwen3_tokenizer.convert_ids_to_tokens(108386)  # "你好" as 6 byte-level characters
    byte_ids = qwen3_tokenizer.convert_tokens_to_ids(list(byte_pieces))
    head = qwen3_tokenizer.encode("<|im_start|>user\n", add_special_tokens=False)
    async with (
        DevServer("scripted", script=script) as server,
        SGLangClient(server.url, max_retries=0) as client,
    ):
        assert (await client.generate(head + byte_ids[:2], {})).text == "nope"  # ends mid-character
        assert (await client.generate(head + byte_ids, {})).text == "found"
        assert (await client.generate(head + byte_ids + [198], {})).text == "found"  # clean seam reused
