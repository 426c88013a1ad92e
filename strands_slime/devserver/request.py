"""One request's state inside the dev server, and what a backend hands back for it.

Shared by the scheduler, the finishing rules (engine.py) and the backends; it imports none of them,
so backends and engine depend on it and never on each other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from strands_slime.devserver.protocol import SamplingParams, SpeculativeDecoding, new_rid

LogprobPairs = list[tuple[float, int]]
"""``[(logprob, token_id), ...]`` as used for top-k and requested-id logprobs."""


@dataclass(slots=True)
class TokenStep:
    """One generated token with its logprob (and the optional extra logprob views)."""

    token_id: int
    logprob: float
    top_logprobs: LogprobPairs | None = None
    token_ids_logprobs: LogprobPairs | None = None
    top_p_ids: list[int] | None = None
    """The token ids the top-p nucleus kept at this step (None: just ``token_id``)."""


@dataclass(slots=True)
class PrefillResult:
    """What the prompt pass reports: the prefix-cache hit and, when asked for, prompt logprobs.

    ``input_logprobs`` holds one value per token of ``prompt[logprob_start_len:]``; the first is None
    (SGLang never scores the first returned prompt token).
    """

    cached_tokens: int
    input_logprobs: list[float | None] = field(default_factory=list)
    input_top_logprobs: list[LogprobPairs | None] | None = None
    input_token_ids_logprobs: list[LogprobPairs | None] | None = None


@dataclass(frozen=True, slots=True)
class MoEShape:
    """What the dev server pretends its MoE looks like when asked for routed experts."""

    num_layers: int
    topk: int
    num_experts: int

    @classmethod
    def from_option(cls, value: tuple[int, ...] | None) -> MoEShape | None:
        """Parse ``--routed-experts L K [E]`` (E defaults to ``max(8, K)``); None leaves it off.

        Raises:
            ValueError: for a wrong arity, a non-positive value or ``K > E``.
        """
        if value is None:
            return None
        if len(value) not in (2, 3) or any(int(v) < 1 for v in value):
            raise ValueError(
                f"routed_experts must be (num_layers, topk[, num_experts]) of positive ints, got {value}"
            )
        layers, topk = int(value[0]), int(value[1])
        experts = int(value[2]) if len(value) == 3 else max(8, topk)
        if topk > experts:
            raise ValueError(f"routed_experts: topk {topk} exceeds num_experts {experts}")
        return cls(layers, topk, experts)


WARMUP: dict[str, Any] = {"max_new_tokens": 0, "return_logprob": False, "logprob_start_len": -1}
WARMUP |= {"top_logprobs_num": 0, "token_ids_logprob": None, "routed_experts": None}
"""What SGLang's hidden prefill-only request of an ``n > 1`` request changes: it samples nothing."""


@dataclass(eq=False)
class GenerationRequest:
    """One prompt being served (an ``n > 1`` request becomes several of these)."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    max_new_tokens: int
    stop_token_ids: frozenset[int]
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    token_ids_logprob: list[int] | None = None
    seed: int = 0
    received_at: float = field(default_factory=time.perf_counter)
    backend_state: Any = None
    return_top_p_token_ids: bool = False
    routed_experts: MoEShape | None = None
    routed_experts_start_len: int = 0
    speculative: SpeculativeDecoding | None = None
    grammar: Any = None
    """The compiled ``json_schema``/``regex``/``ebnf`` constraint (devserver/grammar.py), if any."""

    # What running the request fills in (not copied by sample_copy)
    status: str = field(default="new", init=False)  # new -> queued -> running -> finished
    abort_requested: bool = field(default=False, init=False)
    output_ids: list[int] = field(default_factory=list, init=False)
    output_logprobs: list[float] = field(default_factory=list, init=False)
    output_top_logprobs: list[LogprobPairs | None] = field(default_factory=list, init=False)
    output_token_ids_logprobs: list[LogprobPairs | None] = field(default_factory=list, init=False)
    output_top_p_ids: list[list[int]] = field(default_factory=list, init=False)
    prefill: PrefillResult | None = field(default=None, init=False)
    finish_reason: dict[str, Any] | None = field(default=None, init=False)
    future: asyncio.Future[dict[str, Any]] | None = field(default=None, init=False)

    @property
    def prompt_tokens(self) -> int:
        """Number of prompt tokens (``meta_info.prompt_tokens``)."""
        return len(self.input_ids)

    @property
    def wants_input_logprobs(self) -> bool:
        """Whether prompt-token logprobs were asked for (``logprob_start_len >= 0``)."""
        return self.return_logprob and self.logprob_start_len >= 0

    def accept(self, steps: list[TokenStep]) -> None:
        """Append the tokens the finishing rules accepted, with the logprob views asked for."""
        for step in steps:
            self.output_ids.append(step.token_id)
            self.output_logprobs.append(step.logprob)
            if self.top_logprobs_num:
                self.output_top_logprobs.append(step.top_logprobs)
            if self.token_ids_logprob:
                self.output_token_ids_logprobs.append(step.token_ids_logprobs)
            if self.return_top_p_token_ids:
                self.output_top_p_ids.append(step.top_p_ids or [step.token_id])

    def sample_copy(self, *, seed: int, warmup: bool = False) -> GenerationRequest:
        """A fresh request for one of ``n > 1`` samples, with a new uuid rid (so aborting the
        caller's rid misses it, as in SGLang); ``warmup`` is SGLang's hidden prefill-only request."""
        return dataclasses.replace(self, rid=new_rid(), seed=seed, **(WARMUP if warmup else {}))
