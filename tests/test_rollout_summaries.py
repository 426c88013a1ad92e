"""slime's generate with ``fanout: {compaction: summarize}``: Strands' SummarizingConversationManager
compacts the episode when its context overflows, the summary call stays out of every trajectory, and
each context segment is one exact sample (the real sandbox runs the tool; the dev server runs on its
own loop, as Strands waits for a summary synchronously)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import SUMMARY, counting_script
from threaded_app import devserver_in_thread

from benchmarks.devserver_reference import scripted_output_logprobs
from strands_slime import generate
from strands_slime.cli import RolloutOptions, slime_args
from strands_slime.devserver import DevServer
from strands_slime.provider.tokenizer import load_tokenizer
from strands_slime.provider.trajectory import mask_runs
from strands_slime.rollout.offline import sampling_params
from strands_slime.rollout.slime_compat import Sample

pytestmark = pytest.mark.slow  # the sandbox starts cold: ~4 s idle, 15 s on the shared machine

SANDBOX = {"timeout_s": 5.0}


@pytest.fixture(scope="module")
def server() -> Iterator[DevServer]:
    with devserver_in_thread("scripted", script=counting_script()) as running:
        yield running


OPTIONS = RolloutOptions(data=Path("unused"), out=Path("unused"), max_response_len=2048)


def make_args(url: str, config: dict[str, Any]) -> Any:
    args = slime_args(OPTIONS, url, None)
    args.strands_slime = config
    return args


def new_sample() -> Sample:
    prompt = [{"role": "user", "content": "Count to four, one number per call."}]
    return Sample(prompt=prompt, label="4", index=7, group_index=0, session_id="session-summaries")


def sampled_outputs(sample: Sample, tokenizer: Any) -> list[str]:
    """Each output's text; each carries the logprobs the scripted server sampled it with right after
    the tokens before it in this sample."""
    prompt_length = len(sample.tokens) - sample.response_length
    texts = []
    for value, start, end in mask_runs(sample.loss_mask):  # type: ignore[arg-type]
        if value == 1:
            before, ids = (
                sample.tokens[: prompt_length + start],
                sample.tokens[prompt_length + start : prompt_length + end],
            )
            assert sample.rollout_log_probs[start:end] == pytest.approx(scripted_output_logprobs(before, ids))
            texts.append(tokenizer.decode(ids))
    return texts


async def test_summarizing_fanout_returns_one_exact_sample_per_context_segment(server: DevServer) -> None:
    tokenizer = load_tokenizer()
    server.clear_request_log()
    plain = await generate(
        make_args(server.url, {"sandbox": SANDBOX}), new_sample(), sampling_params(OPTIONS)
    )
    assert plain.status == Sample.Status.COMPLETED and plain.metadata["turns"] == 5
    prompts = [len(entry["json"]["input_ids"]) for entry in server.request_log]

    config = {
        "sandbox": SANDBOX,
        "fanout": {
            "enabled": True,
            "compaction": "summarize",
            "summary_ratio": 0.5,
            "preserve_recent_messages": 2,
        },
        "max_context_len": prompts[3] + 31,  # the fourth call would leave 31 tokens: less than a reply needs
        "min_reply_tokens": 32,
    }
    server.clear_request_log()
    samples = await generate(
        make_args(server.url, copy.deepcopy(config)), new_sample(), sampling_params(OPTIONS)
    )
    assert isinstance(samples, list) and len(samples) >= 2
    summaries = [
        e for e in server.request_log if "Please summarize" in tokenizer.decode(e["json"]["input_ids"])
    ]
    assert len(summaries) == len(samples) - 1, "one summary per compaction, each asked once"
    for position, sample in enumerate(samples):
        assert sample.status == Sample.Status.COMPLETED and sample.rollout_id == 7
        assert sample.metadata["fanout_segment"] == position and sample.metadata["fanout_segments"] == len(
            samples
        )
        assert len(sample.loss_mask) == len(sample.rollout_log_probs) == sample.response_length  # type: ignore[arg-type]
    # The first segment is the uninterrupted episode up to the overflow.
    first = samples[0]
    assert first.tokens == plain.tokens[: len(first.tokens)]
    assert first.loss_mask == plain.loss_mask[: first.response_length]  # type: ignore[index]
    # Every output of the episode is in exactly one segment, sampled in that segment's context; the
    # summary is in later segments' prompts, never trained.
    outputs = [text for sample in samples for text in sampled_outputs(sample, tokenizer)]
    assert outputs == sampled_outputs(plain, tokenizer)
    later = samples[-1]
    later_prompt = tokenizer.decode(later.tokens[: len(later.tokens) - later.response_length])
    assert SUMMARY in later_prompt and all(SUMMARY not in text for text in outputs)
