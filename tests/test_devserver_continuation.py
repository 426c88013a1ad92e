"""The scripted dev server goes on with a reply that was cut short (abort, length) when the next
prompt is exactly the cut prompt plus its output, as a model continues its own partial output; the
resumed partial-rollout tests (tests/test_resume.py) rely on it."""

from __future__ import annotations

from typing import Any

import pytest

from strands_slime.devserver import DevServer
from strands_slime.provider.client import SGLangClient

pytestmark = pytest.mark.unit

SCRIPT = [{"match": None, "replies": ["one two three four five six seven eight nine ten"]}]


def prompt(tokenizer: Any, user: str) -> list[int]:
    text = f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    return tokenizer.encode(text, add_special_tokens=False)


async def test_a_cut_reply_goes_on_with_the_same_tokens_and_logprobs(qwen3_tokenizer: Any) -> None:
    ids = prompt(qwen3_tokenizer, "count")
    async with DevServer("scripted", script=SCRIPT) as server:
        async with SGLangClient(server.url, max_retries=0) as client:
            whole = await client.generate(ids, {})
            cut = await client.generate(ids, {"max_new_tokens": 4})
            assert cut.finish_reason is not None and cut.finish_reason.type == "length"
            assert cut.output_ids == whole.output_ids[:4]
            rest = await client.generate(ids + cut.output_ids, {})
            assert cut.output_ids + rest.output_ids == whole.output_ids
            assert cut.output_logprobs + rest.output_logprobs == whole.output_logprobs
            # only that exact prompt goes on; the continuation was used up
            again = await client.generate(ids + cut.output_ids, {})
            assert again.output_ids == whole.output_ids
            other = await client.generate(ids + cut.output_ids[:3], {})
            assert other.output_ids == whole.output_ids
