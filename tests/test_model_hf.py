"""Rollout logprobs from a real model equal a full forward pass over the final token ids."""

from __future__ import annotations

from typing import Any

import pytest
from strands import Agent
from strands.agent.conversation_manager import NullConversationManager
from strands.types.exceptions import MaxTokensReachedException

from benchmarks.devserver_reference import full_forward_logprobs
from strands_slime.devserver import DevServer, build_tiny_qwen3
from strands_slime.provider.model import SGLangModel

pytestmark = pytest.mark.slow


async def test_rollout_logprobs_match_full_forward(qwen3_tokenizer: Any) -> None:
    async with DevServer(backend="hf", seed=1234) as server:
        model = SGLangModel(
            tokenizer=qwen3_tokenizer,
            base_url=server.url,
            sampling_params={"max_new_tokens": 12, "temperature": 1.0, "top_p": 1.0},
        )
        agent = Agent(
            model=model,
            callback_handler=None,
            conversation_manager=NullConversationManager(),
            retry_strategy=None,
        )
        for question in ("Hello there.", "And then?", "One more: 2+2?"):
            try:
                await agent.invoke_async(question)
            except MaxTokensReachedException:
                pass  # random weights rarely emit <|im_end|>; the next user turn closes the turn
        trajectory = model.trajectory
        await model.client.close()
    trajectory.check()
    assert trajectory.num_outputs == 3 and sum(trajectory.loss_mask) > 3
    reference = full_forward_logprobs(build_tiny_qwen3(0), trajectory.token_ids.tolist())
    for position, (mask, logprob) in enumerate(zip(trajectory.loss_mask, trajectory.logprobs, strict=True)):
        if mask:
            assert abs(logprob - reference[position - 1]) <= 1e-5, position
    assert len(server.request_log) == 3
    assert model.stats.cached_tokens > 0, "later turns reuse the prefix cache (no input logprobs requested)"
