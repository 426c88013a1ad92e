"""Dev server: the meta_info RL trainers replay (top-p spans, routed experts, speculative counters)
and the weight-update endpoints that move ``weight_version``."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from strands_slime.devserver import DevServer
from strands_slime.provider.client import SGLangClient
from strands_slime.rollout.slime_compat import decode_int32_meta_array

pytestmark = pytest.mark.unit

SCRIPT = [{"match": "LONG", "replies": ["word " * 300]}, {"replies": ["The answer is 5.\n\nAnswer: 5"]}]
PROMPT = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]


async def post(server: DevServer, path: str, body: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(server.url + path, json=body) as reply:
            return reply.status, await reply.json(content_type=None)


async def test_top_p_spans_when_slime_asks_for_them() -> None:
    async with (
        DevServer("scripted", script=SCRIPT) as server,
        SGLangClient(server.url, max_retries=0) as client,
    ):
        asked = await client.generate(
            PROMPT, {"top_p": 0.95, "custom_params": {"return_top_p_token_ids": True}}
        )
        plain = await client.generate(PROMPT, {"top_p": 0.95})
    meta = asked.meta_info
    assert isinstance(meta["top_p_token_ids"], str) and isinstance(meta["top_p_token_offsets"], str)
    ids = decode_int32_meta_array(meta, ("top_p_token_ids", "top_p_kept_token_ids"))
    offsets = decode_int32_meta_array(meta, "top_p_token_offsets")
    assert ids is not None and offsets is not None
    assert len(offsets) == len(asked.output_ids) + 1 and offsets[0] == 0 and offsets[-1] == len(ids)
    for i, token in enumerate(asked.output_ids):
        span = ids[offsets[i] : offsets[i + 1]]
        assert span and span[0] == token, "every nucleus holds the sampled token"
    assert len({offsets[i + 1] - offsets[i] for i in range(len(asked.output_ids))}) > 1, "ragged spans"
    assert "top_p_token_ids" not in plain.meta_info and "top_p_token_offsets" not in plain.meta_info


async def test_routed_experts_rows_cover_the_sequence_from_start_len() -> None:
    async with (
        DevServer("scripted", script=SCRIPT, routed_experts=(3, 2, 16)) as server,
        SGLangClient(server.url, max_retries=0) as client,
    ):
        whole = await client.generate(PROMPT, {}, return_routed_experts=True)
        tail = await client.generate(PROMPT, {}, return_routed_experts=True, routed_experts_start_len=4)
        unasked = await client.generate(PROMPT, {})
    rows = len(PROMPT) + len(whole.output_ids) - 1
    full = decode_int32_meta_array(whole.meta_info, "routed_experts")
    part = decode_int32_meta_array(tail.meta_info, "routed_experts")
    assert full is not None and part is not None
    assert len(full) == rows * 3 * 2 and all(0 <= e < 16 for e in full)
    assert part == full[4 * 3 * 2 :], "the same prefix routes the same way; start_len skips known rows"
    assert "routed_experts" not in unasked.meta_info


async def test_routed_experts_need_the_server_option() -> None:
    async with (
        DevServer("scripted", script=SCRIPT) as server,
        SGLangClient(server.url, max_retries=0) as client,
    ):
        reply = await client.generate(PROMPT, {}, return_routed_experts=True)
    assert "routed_experts" not in reply.meta_info  # like SGLang without --enable-return-routed-experts


async def test_speculative_counters() -> None:
    async with (
        DevServer(
            "scripted", script=SCRIPT, speculative_algorithm="EAGLE", speculative_num_draft_tokens=4
        ) as server,
        SGLangClient(server.url, max_retries=0) as client,
    ):
        reply = await client.generate(PROMPT, {})
    meta, completion = reply.meta_info, len(reply.output_ids)
    verify = meta["spec_verify_ct"]
    assert verify == (completion + 1) // 2 and meta["spec_accept_length"] == pytest.approx(
        completion / verify
    )
    assert meta["spec_draft_token_num"] == meta["spec_num_proposed_drafts"] == verify * 3
    assert meta["spec_accept_token_num"] == meta["spec_num_correct_drafts"] == completion - verify
    with pytest.raises(ValueError, match="speculative_num_draft_tokens"):
        DevServer("scripted", speculative_algorithm="EAGLE", speculative_num_draft_tokens=1)
    with pytest.raises(ValueError, match="routed_experts"):
        DevServer("scripted", routed_experts=(2, 9, 8))


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/update_weights_from_disk", {"model_path": "/ckpt/step-7"}),
        ("/update_weights_from_tensor", {"serialized_named_tensors": []}),
        ("/update_weights_from_distributed", {"names": [], "dtypes": [], "shapes": []}),
    ],
)
async def test_weight_updates_move_the_version_and_abort_only_when_asked(
    path: str, body: dict, qwen3_tokenizer: Any
) -> None:
    long_prompt = qwen3_tokenizer.encode("<|im_start|>user\nLONG<|im_end|>\n<|im_start|>assistant\n")
    async with (
        DevServer("scripted", script=SCRIPT, token_latency=0.02) as server,
        SGLangClient(server.url, max_retries=0) as client,
    ):
        running = asyncio.create_task(client.generate(long_prompt, {}))
        status, reply = await post(server, path, {**body, "weight_version": "step-7"})
        assert (
            status == 200
            and reply["success"] is True
            and "Weight version updated to step-7" in reply["message"]
        )
        assert (await client.generate(PROMPT, {"max_new_tokens": 1})).weight_version == "step-7"
        assert not running.done(), "abort_all_requests defaults to false, as in SGLang"
        status, _ = await post(server, path, {**body, "abort_all_requests": True})
        assert status == 200
        aborted = await asyncio.wait_for(running, 30)
        assert aborted.is_abort and aborted.weight_version == "step-7"
        status, error = await post(server, path, {"weight_version": "x"})
        assert status == 400 and "Field required" in str(error)


@pytest.mark.slow
async def test_hf_backend_reports_the_nucleus_its_draw_used() -> None:
    from strands_slime.devserver import build_tiny_qwen3

    async with (
        DevServer("hf", model=build_tiny_qwen3(0)) as server,
        SGLangClient(server.url, max_retries=0) as client,
    ):
        params = {
            "max_new_tokens": 4,
            "top_k": 5,
            "top_p": 0.9,
            "sampling_seed": 3,
            "custom_params": {"return_top_p_token_ids": True},
        }
        reply = await client.generate(PROMPT, params, top_logprobs_num=5)
    ids = decode_int32_meta_array(reply.meta_info, "top_p_token_ids")
    offsets = decode_int32_meta_array(reply.meta_info, "top_p_token_offsets")
    assert ids is not None and offsets is not None and len(offsets) == len(reply.output_ids) + 1
    top5 = reply.meta_info["output_top_logprobs"]
    for i, token in enumerate(reply.output_ids):
        span = set(ids[offsets[i] : offsets[i + 1]])
        assert token in span and 1 <= len(span) <= 5
        assert span <= {entry[1] for entry in top5[i]}, "the nucleus lies inside the top-k"
