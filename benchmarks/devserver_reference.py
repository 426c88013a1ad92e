"""What the tests check the dev server's logprobs against: test tools, not part of the package.

``full_forward_logprobs`` scores a sequence with one full forward pass of a transformers model (the hf
backend's logprobs at temperature 1 equal it, and so do real SGLang's on the same checkpoint);
``scripted_output_logprobs`` recomputes the scripted backend's synthetic logprobs.
``strands_slime.devserver.full_forward_logprobs`` and ``scripted_output_logprobs`` warn and name this
module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from strands_slime.devserver.backends.scripted import prompt_key, scripted_logprob


def full_forward_logprobs(model: Any, token_ids: Sequence[int], *, chunk: int = 256) -> list[float]:
    """Logprob of ``token_ids[i]`` given ``token_ids[:i]`` for i >= 1, from one full forward pass of
    ``model`` (a transformers causal LM).

    The LM head runs in chunks of positions so memory stays bounded on long sequences.
    """
    import torch

    if len(token_ids) < 2:
        return []
    with torch.inference_mode():
        ids = torch.tensor([list(token_ids)], dtype=torch.long)
        hidden = model.base_model(input_ids=ids, use_cache=False).last_hidden_state[0]
        head = model.get_output_embeddings()
        targets = ids[0, 1:]
        values: list[float] = []
        for start in range(0, len(token_ids) - 1, chunk):
            stop = min(len(token_ids) - 1, start + chunk)
            logits = head(hidden[start:stop]).float()
            picked = logits.gather(1, targets[start:stop, None])[:, 0]
            values.extend((picked - torch.logsumexp(logits, dim=-1)).tolist())
    return values


def scripted_output_logprobs(prompt_ids: Sequence[int], output_ids: Sequence[int]) -> list[float]:
    """The output logprobs the scripted backend returns for ``output_ids`` after ``prompt_ids``."""
    key = prompt_key(prompt_ids)
    return [scripted_logprob(key, position, tok) for position, tok in enumerate(output_ids)]
