"""SGLang's per-request checks after parsing: tokenize, then the E3 rules in SGLang's order.

``protocol.parse_generate`` validates the JSON body (E1/E2 and the shape checks); this module turns a
parsed body into a :class:`GenerationRequest`, raising SGLang's 400 for what only the token ids,
the vocabulary or the context limits can tell.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from strands_slime.devserver.protocol import ContextLimits, ParsedGenerate, ProtocolError, new_rid
from strands_slime.devserver.request import GenerationRequest, MoEShape

if TYPE_CHECKING:
    from strands_slime.devserver.backends.base import Backend
    from strands_slime.devserver.protocol import SpeculativeDecoding

HIDDEN_STATES_DISABLED = (
    "The server is not configured to return hidden states. Please set "
    "`--return-hidden-states-mode last`, `--return-hidden-states-mode full`, or the legacy "
    "`--enable-return-hidden-states` flag."
)
CUSTOM_LOGIT_PROCESSOR_DISABLED = (
    "The server is not configured to enable custom logit processor. "
    "Please set `--enable-custom-logit-processor` to enable this feature."
)


async def build_generation_request(
    parsed: ParsedGenerate,
    *,
    backend: Backend,
    limits: ContextLimits,
    seed: int,
    moe: MoEShape | None,
    speculative: SpeculativeDecoding | None,
) -> GenerationRequest:
    """Tokenize ``parsed``, run SGLang's per-request checks in its order, then let the backend accept it
    (``moe``: the pretend MoE shape for ``return_routed_experts``, None when not enabled).

    Raises:
        ProtocolError: SGLang's 400 for the first rule the request breaks.
    """
    if parsed.input_ids is not None:
        ids = parsed.input_ids
    else:
        assert parsed.text is not None
        ids = await backend.tokens.encode(parsed.text, add_special_tokens=True)
        if not ids:
            raise ProtocolError.value("input_ids cannot be empty.")
    vocab = backend.vocab_size
    low, high = min(ids), max(ids)
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise ProtocolError.value(f"Token id {bad} in the input is outside the vocabulary [0, {vocab}).")
    params = parsed.params
    # SGLang's TokenizerManager._validate_one_request order: lengths, token_ids_logprob, hidden
    # states, custom logit processor; then SamplingParams.verify; then the scheduler's checks.
    limits.check_tokenizer_stage(len(ids), params)
    for token in parsed.token_ids_logprob or ():
        if not 0 <= token < vocab:
            raise ProtocolError.value(
                f"token_ids_logprob contains out-of-vocabulary token id {token}; valid range is [0, {vocab})."
            )
    if parsed.return_hidden_states:
        raise ProtocolError.value(HIDDEN_STATES_DISABLED)
    if parsed.custom_logit_processor:
        raise ProtocolError.value(CUSTOM_LOGIT_PROCESSOR_DISABLED)
    params.verify(vocab)
    limits.check_scheduler_stage(len(ids))
    if parsed.return_logprob and parsed.logprob_start_len > len(ids):
        raise ProtocolError.value(
            f"req.logprob_start_len={parsed.logprob_start_len} is higher than the number of input tokens "
            f"len(req.origin_input_ids)={len(ids)}. Please use a smaller logprob_start_len."
        )
    if parsed.return_routed_experts and parsed.routed_experts_start_len > len(ids):
        raise ProtocolError.value(
            f"recv_req.routed_experts_start_len={parsed.routed_experts_start_len} is higher than the number "
            f"of input tokens len(req.origin_input_ids)={len(ids)}. Please use a smaller routed_experts_start_len."
        )
    if parsed.return_routed_experts and parsed.routed_experts_start_len < 0:
        raise ProtocolError.value(
            f"routed_experts_start_len={parsed.routed_experts_start_len} must be at least 0."
        )
    custom = params.custom_params
    stop_ids = frozenset() if params.ignore_eos else backend.eos_token_ids | frozenset(params.stop_token_ids)
    request = GenerationRequest(
        rid=parsed.rid or new_rid(),
        input_ids=list(ids),
        params=params,
        max_new_tokens=limits.clip_max_new_tokens(len(ids), params.max_new_tokens),
        stop_token_ids=stop_ids,
        return_logprob=parsed.return_logprob,
        logprob_start_len=parsed.logprob_start_len,
        top_logprobs_num=parsed.top_logprobs_num,
        token_ids_logprob=parsed.token_ids_logprob,
        seed=seed,
        # slime's patched SGLang (no stock release) returns each token's top-p nucleus when asked so
        return_top_p_token_ids=isinstance(custom, dict) and bool(custom.get("return_top_p_token_ids")),
        routed_experts=moe if parsed.return_routed_experts else None,
        routed_experts_start_len=parsed.routed_experts_start_len,
        speculative=speculative,
    )
    await backend.prepare(request)
    return request
