"""Several agents in one record against the real SGLang server: a main agent and a sub-agent, each with
its own ``SGLangModel`` built while the record is active (as inside an episode), the sub-agent run under
a tool call of the main agent; every reply SGLang sent is in exactly one agent's lane, after the very
ids it was sent, with SGLang's logprobs and mask 1. (A random model follows no format and rarely stops:
each reply runs to the token limit, which Strands reports as ``MaxTokensReachedException`` with the
reply recorded.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sglang_server import SGLangServer
from strands import Agent
from strands.types.exceptions import MaxTokensReachedException

from benchmarks.fault_injection import FaultProxy
from strands_slime.provider.model import SGLangModel
from strands_slime.provider.recorder import Recorder

pytestmark = pytest.mark.sglang


@pytest.fixture
async def recorder(sglang: SGLangServer) -> AsyncIterator[FaultProxy]:
    async with FaultProxy(sglang.url, record_replies=True) as proxy:
        yield proxy


async def test_two_agents_in_one_record_each_hold_exactly_sglangs_tokens(
    qwen3_tokenizer: Any, recorder: FaultProxy
) -> None:
    record = Recorder()
    with record.activate():
        agents = {}
        for name in ("main", "verifier"):
            model = SGLangModel(qwen3_tokenizer, base_url=recorder.url, name=name, max_response_tokens=24)
            agents[name] = Agent(
                model=model,
                name=name,
                system_prompt=f"You are the {name}.",
                callback_handler=None,
                plugins=[model.plugin()],
            )
        with pytest.raises(MaxTokensReachedException):
            await agents["main"].invoke_async("Solve 2 + 2.")
        record.lanes[0].tool_call_started("call_verify")  # as the main agent's plugin does for a tool call
        with pytest.raises(MaxTokensReachedException):
            await agents["verifier"].invoke_async("Is 4 right?")
        record.lanes[0].tool_call_ended("call_verify")
    assert [lane.name for lane in record.lanes] == ["main", "verifier"]
    assert [lane.segment_origins() for lane in record.lanes] == [[None], [("main", "call_verify")]]
    placed = []
    for entry in recorder.request_log:
        assert entry["status"] == 200, entry.get("reply")
        prompt, output = entry["json"]["input_ids"], entry["reply"]["output_ids"]
        logprobs = [e[0] for e in entry["reply"]["meta_info"]["output_token_logprobs"]]
        homes = []
        for lane in record.lanes:
            for segment in lane.segments():
                ids = segment.token_ids.tolist()
                end = len(prompt) + len(output)
                if ids[: len(prompt)] == prompt and ids[len(prompt) : end] == output:
                    assert segment.loss_mask.tolist()[len(prompt) : end] == [1] * len(output)
                    assert segment.logprobs.tolist()[len(prompt) : end] == logprobs
                    homes.append(lane.name)
        assert len(homes) == 1, f"a reply in {homes}: exactly one agent's lane holds it"
        placed.append(homes[0])
    assert sorted(set(placed)) == ["main", "verifier"]
    for lane in record.lanes:
        for segment in lane.segments():
            segment.check()
        assert sum(segment.loss_mask.count(1) for segment in lane.segments()) == sum(
            len(e["reply"]["output_ids"])
            for e, home in zip(recorder.request_log, placed, strict=True)
            if home == lane.name
        ), "mask 1 only on what SGLang sampled for this agent"
