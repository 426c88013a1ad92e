"""One bad token id takes real SGLang down; the client never sends one.

SGLang 0.5.23 does not range-check ``input_ids``: a negative id or one past the embedding table makes
its scheduler raise ``IndexError``, and the whole server exits. ``SGLangClient.generate`` checks the ids
against the model's vocabulary before anything is sent (``strands_slime.provider.request_check``), so
the same request through the client is one clear error and the server keeps serving.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy
import pytest
from sglang_server import SGLangServer

from strands_slime.provider.client import InvalidRequestError, SGLangClient
from strands_slime.provider.request_check import vocabulary_size
from strands_slime.provider.tokenizer import load_tokenizer

pytestmark = pytest.mark.sglang

EMBEDDING_ROWS = 151_936
"""The tiny Qwen3's ``vocab_size`` (its embedding table), as Qwen3-8B's."""
BAD_IDS = {"negative": [9707, 11, -3], "past the embedding table": [9707, 11, EMBEDDING_ROWS + 7]}


def _dead(server: SGLangServer) -> bool:
    assert server.process is not None
    if server.process.poll() is not None:
        return True
    try:
        status, _ = server.get("/health", timeout=5)
    except OSError:
        return True
    return status != 200


@pytest.mark.parametrize("name", list(BAD_IDS))
def test_a_bad_id_sent_raw_takes_sglang_down(name: str, checkpoints: dict[int, Path], lane_dir: Path) -> None:
    """What the client prevents: the raw request kills the scheduler, and the server with it."""
    slug = name.replace(" ", "-")
    with SGLangServer(checkpoints[0], lane_dir, name=f"bad-id-{slug}") as doomed:
        assert (
            doomed.post("/generate", {"input_ids": [9707, 11], "sampling_params": {"max_new_tokens": 2}})[0]
            == 200
        )
        try:
            doomed.post(
                "/generate", {"input_ids": BAD_IDS[name], "sampling_params": {"max_new_tokens": 2}}, 60
            )
        except OSError:
            pass  # the connection died with the server
        deadline = time.monotonic() + 120
        while not _dead(doomed) and time.monotonic() < deadline:
            time.sleep(1)
        assert _dead(doomed), f"SGLang still serves after input id {BAD_IDS[name][-1]}"
        assert "IndexError" in doomed.log_path.read_text(errors="replace"), doomed.log_tail()


async def test_the_client_refuses_bad_ids_and_the_server_lives(
    sglang: SGLangServer, checkpoints: dict[int, Path]
) -> None:
    tokenizer = load_tokenizer(str(checkpoints[0]))
    vocab = vocabulary_size(tokenizer)
    assert vocab == EMBEDDING_ROWS, "the model's embedding rows, from the config beside the tokenizer"
    async with SGLangClient(sglang.url, max_retries=0) as client:
        for ids in BAD_IDS.values():
            with pytest.raises(InvalidRequestError, match=rf"input_ids\[2\] = {ids[2]} is not a token id"):
                await client.generate(ids, {"max_new_tokens": 2}, vocab_size=vocab)
        # numbers from numpy: floats and numpy integers go out as the JSON integers SGLang accepts
        reply = await client.generate(
            numpy.array([9707.0, 11.0, 1879.0]),
            {"max_new_tokens": numpy.int64(3), "temperature": numpy.float32(0.0)},
            top_logprobs_num=2.0,
            vocab_size=vocab,
        )
        assert reply.completion_tokens == 3 and reply.meta_info["prompt_tokens"] == 3
        with pytest.raises(InvalidRequestError, match="return_logprob must be true or false"):
            await client.generate([9707, 11], {"max_new_tokens": 2}, return_logprob=1)  # type: ignore[arg-type]
    assert not _dead(sglang), "the shared server still serves"
