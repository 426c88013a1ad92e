"""SGLang's finishing and response-shaping rules, shared by every backend.

Finish precedence at one token: stop string, then EOS/``stop_token_ids``, then
length. ``output_ids`` keep the token that finished the request; the text trims it as the matrix in
docs/devserver.md says.
"""

from __future__ import annotations

import array
import base64
import math
import time
from typing import TYPE_CHECKING, Any

from strands_slime.devserver.request import (
    GenerationRequest,
    LogprobPairs,
    MoEShape,
    PrefillResult,
    TokenStep,
)

if TYPE_CHECKING:
    from strands_slime.devserver.tokens import TokenizerWorker

ABORTED_RUNNING = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
ABORTED_QUEUED = {"type": "abort", "message": "Abort in waiting queue"}


def encode_int32(values: list[int]) -> str:
    """SGLang's wire format for int32 arrays in ``meta_info``: base64 of the native int32 bytes."""
    return base64.b64encode(array.array("i", values).tobytes()).decode("ascii")


def routed_expert_ids(token_ids: list[int], start: int, shape: MoEShape) -> list[int]:
    """Deterministic routed experts for positions ``start..len-2`` (one row per forwarded token
    whose successor is known), flattened as SGLang sends ``[rows, num_layers, topk]``."""
    flat: list[int] = []
    for position in range(start, len(token_ids) - 1):
        seed = (token_ids[position] * 0x9E3779B1 + position * 0x85EBCA77) & 0xFFFFFFFF
        for layer in range(shape.num_layers):
            first = (seed + layer * 0xC2B2AE3D) % shape.num_experts
            flat.extend((first + k) % shape.num_experts for k in range(shape.topk))
    return flat


def scan_token_ids(request: GenerationRequest, steps: list[TokenStep]) -> tuple[int, dict[str, Any] | None]:
    """How many of ``steps`` to accept, and the id/length finish they hit (strings checked after)."""
    done = len(request.output_ids)
    stop_ids = request.stop_token_ids
    for index, step in enumerate(steps):
        if step.token_id in stop_ids:
            return index + 1, {"type": "stop", "matched": step.token_id}
        if done + index + 1 >= request.max_new_tokens:
            return index + 1, {"type": "length", "length": request.max_new_tokens}
    return len(steps), None


def scan_stop_text_sync(
    tokens: TokenizerWorker, request: GenerationRequest, new_ids: list[int]
) -> tuple[int, str] | None:
    """First of ``new_ids`` whose arrival completes a stop string: (tokens to accept, the string).

    Runs on the tokenizer thread.
    """
    stops = request.params.stop
    done = len(request.output_ids)
    all_ids = request.output_ids + new_ids
    # A stop string spans at most 4 bytes per character, each token holds at least one byte.
    window = 4 * max(len(stop) for stop in stops) + 2
    tail = tokens.decode_sync(all_ids[max(0, done - window) :])
    if any(stop in tail for stop in stops):
        for end in range(done + 1, len(all_ids) + 1):
            text = tokens.decode_sync(all_ids[max(0, end - window) : end])
            for stop in stops:
                if stop in text:
                    return end - done, stop
    return None


async def find_finish(
    tokens: TokenizerWorker, request: GenerationRequest, steps: list[TokenStep]
) -> tuple[int, dict[str, Any] | None]:
    """Accepted count and finish reason for a new batch of steps, with SGLang's precedence."""
    accepted, finish = scan_token_ids(request, steps)
    if request.params.stop:
        new_ids = [step.token_id for step in steps[:accepted]]
        hit = await tokens.run(scan_stop_text_sync, tokens, request, new_ids)
        if hit is not None:
            count, matched = hit
            return count, {"type": "stop", "matched": matched}
    return accepted, finish


def _finite(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def _text_cut(text: str, request: GenerationRequest) -> str:
    finish = request.finish_reason or {}
    matched = finish.get("matched")
    if finish.get("type") != "stop" or not isinstance(matched, str):
        return text
    keep = request.params.no_stop_trim
    position = text.find(matched)
    if position == -1:
        return text
    return text[: position + len(matched)] if keep else text[:position]


class OutputRenderer:
    """Builds SGLang's response bodies; decoding runs on the tokenizer thread."""

    def __init__(self, tokens: TokenizerWorker) -> None:
        self.tokens = tokens

    def _text_sync(self, request: GenerationRequest) -> str:
        ids = request.output_ids
        finish = request.finish_reason or {}
        if (
            finish.get("type") == "stop"
            and isinstance(finish.get("matched"), int)
            and not request.params.no_stop_trim
        ):
            ids = ids[:-1]
        text = self.tokens.decode_sync(
            ids,
            skip_special_tokens=request.params.skip_special_tokens,
            spaces_between_special_tokens=request.params.spaces_between_special_tokens,
        )
        return _text_cut(text, request)

    @staticmethod
    def _entries(values: list[float | None], ids: list[int]) -> list[list[Any]]:
        return [[_finite(value), tok, None] for value, tok in zip(values, ids, strict=True)]

    @staticmethod
    def _pair_entries(rows: list[LogprobPairs | None]) -> list[list[list[Any]] | None]:
        return [None if row is None else [[_finite(value), tok, None] for value, tok in row] for row in rows]

    def _render_sync(self, request: GenerationRequest, *, weight_version: str) -> dict[str, Any]:
        text = self._text_sync(request)
        prefill = request.prefill or PrefillResult(cached_tokens=0)
        completion = len(request.output_ids)
        meta: dict[str, Any] = {
            "id": request.rid,
            "finish_reason": request.finish_reason,
            "prompt_tokens": request.prompt_tokens,
            "weight_version": weight_version,
            "num_retractions": 0,
        }
        if request.return_logprob:
            wants_input = request.wants_input_logprobs
            input_ids = request.input_ids[request.logprob_start_len :] if wants_input else []
            input_values = prefill.input_logprobs if wants_input else []
            meta["input_token_logprobs"] = self._entries(input_values, input_ids)
            meta["output_token_logprobs"] = self._entries(list(request.output_logprobs), request.output_ids)
            if request.top_logprobs_num:
                meta["input_top_logprobs"] = self._pair_entries(
                    prefill.input_top_logprobs or [] if wants_input else []
                )
                meta["output_top_logprobs"] = self._pair_entries(request.output_top_logprobs)
            if request.token_ids_logprob:
                meta["input_token_ids_logprobs"] = self._pair_entries(
                    prefill.input_token_ids_logprobs or [] if wants_input else []
                )
                meta["output_token_ids_logprobs"] = self._pair_entries(request.output_token_ids_logprobs)
            meta["output_token_logprobs_length"] = completion
        meta["reasoning_tokens"] = 0
        meta["completion_tokens"] = completion
        meta["cached_tokens"] = prefill.cached_tokens
        meta["weight_versions"] = [{"version": weight_version, "start": 0, "end": completion}]
        meta["cached_tokens_details"] = (
            {"device": prefill.cached_tokens, "host": 0} if prefill.cached_tokens else None
        )
        meta["dp_rank"] = None
        self._replay_meta(request, meta)
        meta["e2e_latency"] = time.perf_counter() - request.received_at
        meta["response_sent_to_client_ts"] = time.time()
        return {"text": text, "output_ids": list(request.output_ids), "meta_info": meta}

    @staticmethod
    def _replay_meta(request: GenerationRequest, meta: dict[str, Any]) -> None:
        """What RL trainers replay: top-p nucleus spans (slime's patched SGLang, requested with
        ``custom_params.return_top_p_token_ids``), routed experts and speculative-decoding counters."""
        completion = len(request.output_ids)
        if request.return_top_p_token_ids:
            offsets = [0]
            kept: list[int] = []
            for ids in request.output_top_p_ids:
                kept.extend(ids)
                offsets.append(len(kept))
            meta["top_p_token_ids"] = encode_int32(kept)
            meta["top_p_token_offsets"] = encode_int32(offsets)
        finish = request.finish_reason or {}
        if request.routed_experts is not None and finish.get("type") != "abort":
            sequence = request.input_ids + request.output_ids
            meta["routed_experts"] = encode_int32(
                routed_expert_ids(sequence, request.routed_experts_start_len, request.routed_experts)
            )
        if request.speculative is not None and completion > 0:
            verify_ct = (completion + 1) // 2
            proposed = verify_ct * (request.speculative.num_draft_tokens - 1)
            correct = completion - verify_ct
            meta["spec_accept_rate"] = correct / proposed if proposed else 0.0
            meta["spec_accept_length"] = completion / verify_ct
            meta["spec_num_correct_drafts"] = correct
            meta["spec_num_proposed_drafts"] = proposed
            meta["spec_verify_ct"] = verify_ct
            # the names slime's Sample.SpecInfo reads (slime's patched SGLang)
            meta["spec_accept_token_num"] = correct
            meta["spec_draft_token_num"] = proposed

    async def render(self, request: GenerationRequest, *, weight_version: str) -> dict[str, Any]:
        """The response body of a finished request (decoding runs on the tokenizer thread)."""
        return await self.tokens.run(self._render_sync, request, weight_version=weight_version)


def render_queued_abort(request: GenerationRequest, weight_version: str) -> dict[str, Any]:
    """The reply for a request aborted before it ran: no prompt_tokens/cached_tokens keys."""
    meta: dict[str, Any] = {
        "id": request.rid,
        "finish_reason": dict(ABORTED_QUEUED),
        "weight_version": weight_version,
        "e2e_latency": time.perf_counter() - request.received_at,
        "weight_versions": [{"version": weight_version, "start": 0, "end": 0}],
    }
    if request.return_logprob:  # TokenizerManager.add_logprob_to_meta_info, with nothing to report
        meta["input_token_logprobs"] = []
        meta["output_token_logprobs"] = []
        meta["output_token_logprobs_length"] = 0
        if request.top_logprobs_num > 0:
            meta["input_top_logprobs"] = []
            meta["output_top_logprobs"] = []
        if request.token_ids_logprob is not None:
            meta["input_token_ids_logprobs"] = []
            meta["output_token_ids_logprobs"] = []
    meta["completion_tokens"] = 0
    meta["response_sent_to_client_ts"] = time.time()
    return {"text": "", "output_ids": [], "meta_info": meta}
