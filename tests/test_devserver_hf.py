"""The hf backend: real sampling and logprobs of the tiny random Qwen3, checked against full passes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import torch

from benchmarks.devserver_reference import full_forward_logprobs
from benchmarks.devserver_runners import DevServerThread
from strands_slime.devserver import DevServer, build_tiny_qwen3
from strands_slime.provider.client import SGLangClient

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def model():
    return build_tiny_qwen3(0)


@pytest.fixture(scope="module")
def hf_server():
    """One hf server for the module, on its own loop: each test's client may use any loop."""
    with DevServerThread("hf", max_running_requests=4) as server:
        yield server


@pytest.fixture
async def client(hf_server):
    async with SGLangClient(hf_server.url, max_retries=0) as c:
        yield c


async def wait_until_on_server(runner: DevServerThread, condition: Any, timeout: float = 60.0) -> None:
    """Poll ``condition(server)`` on the server's own loop until it holds; fail after ``timeout``
    seconds (a hang guard, not a timing check)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    server = runner.server
    while not await asyncio.to_thread(runner.call, lambda: condition(server)):
        assert loop.time() < deadline, "condition not reached before the deadline"
        await asyncio.sleep(0.01)


def prompt_ids(length: int, offset: int = 0) -> list[int]:
    return [(1000 + 37 * i + offset) % 150000 for i in range(length)]


def assert_close(actual: list[float | None], expected: list[float]) -> None:
    assert len(actual) == len(expected)
    worst = max((abs(a - b) for a, b in zip(actual, expected, strict=True)), default=0.0)
    assert worst < TOLERANCE, worst


def full_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


def test_tiny_qwen3_is_reproducible_and_leaves_the_global_rng_alone(model):
    state = torch.random.get_rng_state()
    first, second, other = model, build_tiny_qwen3(0), build_tiny_qwen3(1)
    assert torch.equal(torch.random.get_rng_state(), state)
    weights = dict(first.named_parameters())
    assert all(torch.equal(weights[name], value) for name, value in second.named_parameters())
    assert not torch.equal(first.lm_head.weight, other.lm_head.weight)
    assert sum(p.numel() for p in first.parameters()) < 11_000_000
    assert first.config.max_position_embeddings == 40960


def test_full_forward_logprobs_matches_the_model_logits(model):
    ids = prompt_ids(40)
    logits = full_logits(model, ids)
    expected = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert_close(full_forward_logprobs(model, ids, chunk=16), expected.tolist())
    assert full_forward_logprobs(model, ids[:1]) == []


async def test_output_logprobs_equal_a_full_forward_pass(client, model):
    prompt = prompt_ids(64)
    response = await client.generate(prompt, {"max_new_tokens": 24, "temperature": 1.0, "ignore_eos": True})
    assert response.completion_tokens == 24
    full = full_forward_logprobs(model, prompt + response.output_ids)
    assert_close(response.output_logprobs, full[len(prompt) - 1 :])


async def test_prefix_reuse_keeps_logprobs_exact(client, model):
    prompt = prompt_ids(48, offset=5)
    first = await client.generate(prompt, {"max_new_tokens": 8, "ignore_eos": True})
    turn2 = prompt + first.output_ids + prompt_ids(6, offset=9)
    second = await client.generate(
        turn2, {"max_new_tokens": 8, "ignore_eos": True}, logprob_start_len=len(prompt)
    )
    assert second.cached_tokens == len(prompt)  # capped at logprob_start_len
    third = await client.generate(turn2, {"max_new_tokens": 8, "ignore_eos": True})
    assert third.cached_tokens == len(turn2) - 1
    full = full_forward_logprobs(model, turn2 + second.output_ids)
    assert second.input_logprobs[0] is None and len(second.input_logprobs) == len(turn2) - len(prompt)
    assert_close(second.input_logprobs[1:], full[len(prompt) : len(turn2) - 1])
    assert_close(second.output_logprobs, full[len(turn2) - 1 :])
    assert_close(
        third.output_logprobs, full_forward_logprobs(model, turn2 + third.output_ids)[len(turn2) - 1 :]
    )


async def test_greedy_follows_the_argmax(client, model):
    prompt = prompt_ids(32, offset=1)
    response = await client.generate(prompt, {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True})
    ids = list(prompt)
    for tok in response.output_ids:
        assert tok == int(full_logits(model, ids)[-1].argmax())
        ids.append(tok)
    assert_close(response.output_logprobs, full_forward_logprobs(model, ids)[len(prompt) - 1 :])
    top_k_one = await client.generate(prompt, {"max_new_tokens": 6, "top_k": 1, "ignore_eos": True})
    assert top_k_one.output_ids == response.output_ids
    tiny_top_p = await client.generate(prompt, {"max_new_tokens": 6, "top_p": 1e-9, "ignore_eos": True})
    assert tiny_top_p.output_ids == response.output_ids


async def test_sampling_seed_reproduces_a_sample(client):
    prompt = prompt_ids(16, offset=2)
    params = {"max_new_tokens": 12, "ignore_eos": True, "top_p": 0.95, "top_k": 5000, "min_p": 0.0}
    first = await client.generate(prompt, {**params, "sampling_seed": 11})
    again = await client.generate(prompt, {**params, "sampling_seed": 11})
    other = await client.generate(prompt, {**params, "sampling_seed": 12})
    assert first.output_ids == again.output_ids
    assert_close(again.output_logprobs, first.output_logprobs)  # the rerun reuses cached KV
    assert first.output_ids != other.output_ids


async def test_temperature_scales_the_reported_logprobs(client, model):
    prompt = prompt_ids(20, offset=3)
    response = await client.generate(prompt, {"max_new_tokens": 5, "temperature": 0.5, "ignore_eos": True})
    ids = prompt + response.output_ids
    scaled = torch.log_softmax(full_logits(model, ids)[:-1] / 0.5, dim=-1)
    expected = scaled.gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()[len(prompt) - 1 :]
    assert_close(response.output_logprobs, expected)


async def test_logit_bias_and_min_new_tokens(client):
    prompt = prompt_ids(10, offset=6)
    forced = await client.generate(prompt, {"max_new_tokens": 8, "logit_bias": {"151645": 100.0}})
    assert forced.output_ids == [151645] and forced.finish_reason.raw == {"type": "stop", "matched": 151645}
    assert forced.output_logprobs[0] > -1e-3
    delayed = await client.generate(
        prompt,
        {"max_new_tokens": 8, "logit_bias": {"151645": 100.0}, "min_new_tokens": 3},
        token_ids_logprob=[151645],
    )
    assert len(delayed.output_ids) == 4 and delayed.output_ids[-1] == 151645
    masked = [row[0][0] for row in delayed.meta_info["output_token_ids_logprobs"]]
    assert masked[:3] == [None, None, None] and masked[3] > -1e-3  # -inf is sent as null
    assert 151645 not in delayed.output_ids[:3]


async def test_top_logprobs_rank_the_greedy_token_first(client):
    response = await client.generate(
        prompt_ids(12, offset=7),
        {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True},
        top_logprobs_num=4,
        logprob_start_len=8,
    )
    input_rows = response.meta_info["input_top_logprobs"]
    assert len(input_rows) == 4 and input_rows[0] is None and all(len(row) == 4 for row in input_rows[1:])
    for row, tok, value in zip(
        response.meta_info["output_top_logprobs"], response.output_ids, response.output_logprobs, strict=True
    ):
        assert row[0][1] == tok and abs(row[0][0] - value) < TOLERANCE
        assert [entry[0] for entry in row] == sorted((entry[0] for entry in row), reverse=True)


async def test_concurrent_requests_and_abort(client, hf_server):
    prompts = [prompt_ids(32, offset=20 + i) for i in range(6)]  # 4 run, 2 wait
    tasks = [
        asyncio.create_task(client.generate(p, {"max_new_tokens": 400, "ignore_eos": True}, rid=f"hf-{i}"))
        for i, p in enumerate(prompts)
    ]
    await wait_until_on_server(
        hf_server,
        lambda server: (
            len(server.scheduler.live) == len(prompts)
            and all(
                request.output_ids
                for request in server.scheduler.live.values()
                if request.status == "running"
            )
        ),
    )
    await asyncio.gather(*(client.abort(f"hf-{i}") for i in range(len(prompts))))
    results = await asyncio.gather(*tasks)
    assert all(result.is_abort for result in results)
    partial = [result for result in results if result.prompt_tokens is not None]
    assert partial and all(0 < len(r.output_ids) < 400 for r in partial)
    assert all(len(r.output_logprobs) == len(r.output_ids) for r in results)


async def test_event_loop_stays_responsive_during_generation(model):
    """The model runs on its own thread: an in-process server must not stall its loop."""
    async with DevServer("hf", model=model) as server, SGLangClient(server.url, max_retries=0) as client:
        gaps: list[float] = []
        stop = asyncio.Event()

        async def ticker() -> None:
            last = time.perf_counter()
            while not stop.is_set():
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticking = asyncio.create_task(ticker())
        started = time.perf_counter()
        response = await client.generate(prompt_ids(1024), {"max_new_tokens": 8, "ignore_eos": True})
        elapsed = time.perf_counter() - started
        stop.set()
        await ticking
    assert response.completion_tokens == 8
    # The 1k-token prefill is most of the request's time: run on the loop, it would be one gap of
    # well over a third of it. Relative to the request's own duration, so a loaded machine, which
    # stretches both, cannot fail it.
    assert max(gaps) < elapsed / 3, (max(gaps), elapsed)


async def test_local_model_directory(tmp_path, model):
    model.save_pretrained(tmp_path / "tiny")
    async with DevServer("hf", model=str(tmp_path / "tiny")) as server:
        async with SGLangClient(server.url, max_retries=0) as client:
            prompt = prompt_ids(16, offset=8)
            response = await client.generate(prompt, {"max_new_tokens": 4, "ignore_eos": True})
            info = await client.model_info()
    assert info["model_type"] == "qwen3" and info["architectures"] == ["Qwen3ForCausalLM"]
    assert_close(response.output_logprobs, full_forward_logprobs(model, prompt + response.output_ids)[15:])


async def test_missing_model_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="never downloads"):
        async with DevServer("hf", model=str(tmp_path / "nope")):
            pass


@pytest.mark.slow
async def test_long_generation_logprobs_equal_a_full_forward_pass(client, model):
    prompt = prompt_ids(1024, offset=30)
    first = await client.generate(prompt, {"max_new_tokens": 256, "ignore_eos": True})
    turn2 = prompt + first.output_ids + prompt_ids(100, offset=31)
    second = await client.generate(turn2, {"max_new_tokens": 256, "ignore_eos": True})
    assert second.cached_tokens == len(prompt) + 255
    assert_close(first.output_logprobs, full_forward_logprobs(model, prompt + first.output_ids)[1023:])
    full = full_forward_logprobs(model, turn2 + second.output_ids)
    assert_close(second.output_logprobs, full[len(turn2) - 1 :])


def test_full_forward_logprobs_old_module_path_warns_and_works():
    import benchmarks.devserver_reference as reference

    with pytest.warns(
        DeprecationWarning, match=r"backends\.hf\.full_forward_logprobs moved .*devserver_reference"
    ):
        from strands_slime.devserver.backends.hf import full_forward_logprobs as old
    assert old is reference.full_forward_logprobs
