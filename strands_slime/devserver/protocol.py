"""Parsing a ``/generate`` body into one prompt's request, with SGLang's limits and error bodies.

Type errors (strict JSON types, as SGLang's schema contract) are refused by pydantic (the wording is pydantic's, not SGLang's: the SGLang lane compares
both servers' replies and docs/devserver.md lists the differences); the range checks of SGLang's
``SamplingParams.verify`` and its length limits keep SGLang's messages, which the client classifies.
Batch requests and streaming are not emulated: a 400 names the field.
"""

from __future__ import annotations

import math
import os
import random
import uuid
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, field_validator

TOP_K_ALL = 1 << 30
"""SGLang's default ``top_k``: the whole vocabulary."""
UNLIMITED_NEW_TOKENS = 1 << 30
"""``max_new_tokens: null``: SGLang's ``Scheduler.init_req_max_new_tokens`` budget before clipping."""
GREEDY_TEMPERATURE = 1e-6
MAX_STOP_STRINGS = 32
GRAMMAR_KEYS = ("json_schema", "regex", "ebnf", "structural_tag")


class ProtocolError(Exception):
    """An HTTP error reply with SGLang's status and body for it."""

    def __init__(self, status: int, body: Any, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.message = message

    @classmethod
    def pydantic(cls, message: str) -> ProtocolError:
        """A body that does not parse (SGLang's FastAPI/pydantic 400 body)."""
        body = {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}
        return cls(400, body, message)

    @classmethod
    def value(cls, message: str, status: int = 400) -> ProtocolError:
        """A ``ValueError`` in request handling, or a scheduler abort carrying status 400."""
        return cls(status, {"error": {"message": message}}, message)

    @classmethod
    def http(cls, message: str, status: int = 503) -> ProtocolError:
        """An ``HTTPException``, e.g. a scheduler abort carrying status 503."""
        body = {"object": "error", "message": message, "type": str(status), "param": None, "code": status}
        return cls(status, body, message)


def _invalid(message: str) -> ProtocolError:
    return ProtocolError.value(message)


def validation_error(exc: ValidationError, model: str) -> ProtocolError:
    """A 400 listing pydantic's errors for ``model`` (the wording is pydantic's, not FastAPI's)."""
    parts = [
        f"{'.'.join(str(p) for p in error.get('loc', ())) or 'body'}: {error.get('msg')}"
        for error in exc.errors(include_url=False)
    ]
    plural = "s" if len(parts) != 1 else ""
    return ProtocolError.pydantic(f"{len(parts)} validation error{plural} for {model}: " + "; ".join(parts))


def _json_number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("Input should be a valid number")
    return value


Number = Annotated[int | float, BeforeValidator(_json_number)]
"""A JSON number kept as sent: SGLang's messages print ``-1``, not ``-1.0``."""


class SamplingParams(BaseModel):
    """``sampling_params`` with SGLang's defaults and its field list (unknown keys and wrong JSON types
    are a 400); ``null`` means the default, except ``max_new_tokens``: absent is 128, ``null`` no limit."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_new_tokens: int | None = 128
    stop: list[str] = []
    stop_token_ids: list[int] = []
    stop_regex: list[str] = []
    temperature: Number = 1.0
    top_p: Number = 1.0
    top_k: int = TOP_K_ALL
    min_p: Number = 0.0
    frequency_penalty: Number = 0.0
    presence_penalty: Number = 0.0
    repetition_penalty: Number = 1.0
    min_new_tokens: int = 0
    n: int = 1
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    stream_interval: int | None = None
    logit_bias: dict[str, Number] = {}
    sampling_seed: int | None = None
    custom_params: Any = None
    beam_width: int | None = None
    watermark: dict[str, Any] | None = None
    choice: list[str] | None = None

    @field_validator("stop", "stop_regex", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator(*GRAMMAR_KEYS)
    @classmethod
    def _empty_grammar_is_unset(cls, value: str | None) -> str | None:
        return value or None

    @classmethod
    def from_json(cls, obj: Any) -> SamplingParams:
        """Parse ``sampling_params`` (None: all defaults); a null value takes the default."""
        if obj is None:
            return cls()
        if not isinstance(obj, dict):
            raise ProtocolError.pydantic("sampling_params: Input should be a valid dictionary")
        given = {k: v for k, v in obj.items() if v is not None or k == "max_new_tokens"}
        try:
            return cls.model_validate(given)
        except ValidationError as exc:
            raise validation_error(exc, "SamplingParams") from None

    @property
    def max_new_tokens_sent(self) -> bool:
        """Whether the request set a number (only then SGLang checks prompt + ``max_new_tokens``)."""
        return "max_new_tokens" in self.model_fields_set and self.max_new_tokens is not None

    def verify(self, vocab_size: int) -> None:
        """SGLang's ``SamplingParams.normalize`` (stop counts) then ``verify`` (ranges), with its messages."""
        if len(self.stop) > MAX_STOP_STRINGS:
            raise _invalid(f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(self.stop)}")
        if self.beam_width is not None and self.beam_width < 1:
            raise _invalid(f"beam_width must be at least 1, got {self.beam_width}.")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise _invalid(f"temperature must be a non-negative finite number, got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise _invalid(f"top_p must be in (0, 1], got {self.top_p}.")
        if not 0 <= self.min_p <= 1:
            raise _invalid(f"min_p must be in [0, 1], got {self.min_p}.")
        # SamplingParams.__post_init__ turns a greedy temperature into top_k = 1 before this check.
        if self.top_k < 1 and self.top_k != -1 and not self.greedy:
            raise _invalid(f"top_k must be -1 (disable) or at least 1, got {self.top_k}.")
        if not -2 <= self.frequency_penalty <= 2:
            raise _invalid(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.")
        if not -2 <= self.presence_penalty <= 2:
            raise _invalid(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.")
        if not 0 < self.repetition_penalty <= 2:
            raise _invalid(
                f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {self.repetition_penalty}."
            )
        if self.min_new_tokens < 0:
            raise _invalid(f"min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}.")
        if self.max_new_tokens is not None:
            if self.max_new_tokens < 0:
                raise _invalid(f"max_new_tokens must be at least 0, got {self.max_new_tokens}.")
            if self.min_new_tokens > self.max_new_tokens:
                raise _invalid(
                    f"min_new_tokens must be in [0, max_new_tokens({self.max_new_tokens})], "
                    f"got {self.min_new_tokens}."
                )
        for key in self.logit_bias:
            try:
                token = int(key)
            except ValueError as exc:
                raise _invalid(str(exc)) from None
            if not 0 <= token < vocab_size:
                raise _invalid(f"logit_bias must has keys in [0, {vocab_size - 1}], got {key}.")
        if self.sampling_seed is not None and not -(2**63) <= self.sampling_seed <= 2**63 - 1:
            raise _invalid(f"sampling_seed must be in [-2**63, 2**63 - 1], got {self.sampling_seed}.")
        if sum(getattr(self, key) is not None for key in GRAMMAR_KEYS) > 1:
            raise _invalid("Only one of json_schema, regex, ebnf, or structural_tag can be set.")
        # Not SGLang's checks: what the dev server does not emulate fails loudly.
        for feature, used in (
            ("structural_tag", self.structural_tag is not None),
            ("beam search (beam_width > 1)", (self.beam_width or 1) > 1),
            ("choice (a /v1/systemone field)", self.choice is not None),
            ("stop_regex", bool(self.stop_regex)),
        ):
            if used:
                raise _invalid(f"The dev server does not implement {feature}; use a real SGLang server.")

    @property
    def greedy(self) -> bool:
        """Whether the temperature is below SGLang's greedy threshold."""
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def effective_top_k(self) -> int:
        """``top_k`` with -1 (no limit) mapped to the whole vocabulary."""
        return TOP_K_ALL if self.top_k == -1 else self.top_k


class GenerateReqInput(BaseModel):
    """The top-level fields of ``/generate`` for one prompt; unknown keys are ignored like SGLang does.
    Strict, as SGLang's schema contract: ``1`` is no boolean, ``2.0`` and ``"3"`` are no integers."""

    model_config = ConfigDict(extra="ignore", strict=True)

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: Any = None
    rid: str | None = None
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    token_ids_logprob: list[int] | None = None
    stream: bool = False
    return_text_in_logprobs: bool = False
    return_prompt_token_ids: bool = False
    input_embeds: Any = None
    return_hidden_states: bool | str = False
    custom_logit_processor: str | None = None
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0


BATCH_FIELDS = ("text", "input_ids", "sampling_params", "rid", "return_logprob", "logprob_start_len")
BATCH_FIELDS += ("top_logprobs_num", "token_ids_logprob")
"""Top-level fields whose list form (a list of lists for ids) makes a batch request: not emulated."""
NOT_EMULATED = ("stream", "return_text_in_logprobs", "return_prompt_token_ids", "input_embeds")
"""Top-level options SGLang serves and the dev server refuses with a 400 naming them (nothing here sends
them)."""


@dataclass(slots=True)
class ParsedGenerate:
    """A validated ``/generate`` body: one prompt, before tokenization."""

    rid: str | None
    text: str | None
    input_ids: list[int] | None
    params: SamplingParams
    return_logprob: bool
    logprob_start_len: int
    top_logprobs_num: int
    token_ids_logprob: list[int] | None
    return_routed_experts: bool
    routed_experts_start_len: int
    return_hidden_states: bool
    custom_logit_processor: bool


def parse_generate(body: Any) -> ParsedGenerate:
    """Validate a decoded JSON body: batches first, then types, then the shape checks.

    Raises:
        ProtocolError: a 400 for the first rule the request breaks.
    """
    for name in BATCH_FIELDS if isinstance(body, dict) else ():
        value = body.get(name)
        ids = name in ("input_ids", "token_ids_logprob")
        if isinstance(value, list) and (not ids or (value and isinstance(value[0], list))):
            raise ProtocolError.value(
                f"The dev server does not implement batch requests: {name} is a list. "
                "Send one prompt per request."
            )
    try:
        req = GenerateReqInput.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc, "GenerateReqInput") from None
    params = SamplingParams.from_json(req.sampling_params)
    for flag in NOT_EMULATED:
        if getattr(req, flag) not in (None, False):
            raise ProtocolError.value(f"The dev server does not implement {flag}; send false or omit it.")
    if (req.text is None) == (req.input_ids is None):
        raise ProtocolError.value("Either text, input_ids or input_embeds should be provided.")
    if req.input_ids is not None and not req.input_ids:
        raise ProtocolError.value("input_ids cannot be empty.")
    start = -1 if req.logprob_start_len is None else req.logprob_start_len
    if start < -1:
        raise ProtocolError.value(f"logprob_start_len must be -1 or at least 0, got {start}.")
    top = req.top_logprobs_num or 0
    if top < 0:
        raise ProtocolError.value(f"top_logprobs_num must be at least 0, got {top}.")
    hidden = req.return_hidden_states
    if not isinstance(hidden, bool) and hidden != "last":  # schedule_batch.get_return_hidden_states_mode
        raise ProtocolError.value("return_hidden_states must be a boolean or the string literal 'last'.")
    return ParsedGenerate(
        rid=req.rid,
        text=req.text,
        input_ids=req.input_ids,
        params=params,
        return_logprob=bool(req.return_logprob),
        logprob_start_len=start,
        top_logprobs_num=top,
        token_ids_logprob=req.token_ids_logprob or None,
        return_routed_experts=req.return_routed_experts,
        routed_experts_start_len=req.routed_experts_start_len,
        return_hidden_states=hidden is not False,
        custom_logit_processor=bool(req.custom_logit_processor),
    )


_RID_RANDOM = random.Random(int.from_bytes(os.urandom(16), "little"))


def new_rid() -> str:
    """A uuid4 hex like SGLang's default rid (without an ``os.urandom`` call per request, which is
    slow on some VMs)."""
    return uuid.UUID(int=_RID_RANDOM.getrandbits(128), version=4).hex


SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")
"""The EAGLE family, whose draft tokens SGLang reserves in every request's context (NEXTN is MTP,
which SGLang resolves to EAGLE)."""


@dataclass(frozen=True, slots=True)
class SpeculativeDecoding:
    """EAGLE-style speculative decoding as ``/server_info`` reports it: a chain draft (top-k 1) of
    ``num_draft_tokens - 1`` steps. Nothing is drafted; only its effect on the length limits is real."""

    algorithm: str
    num_draft_tokens: int

    @classmethod
    def from_options(cls, algorithm: str | None, num_draft_tokens: int | None) -> SpeculativeDecoding | None:
        """Parse ``--speculative-algorithm``/``--speculative-num-draft-tokens`` (None: off).

        Raises:
            ValueError: an algorithm not emulated, draft tokens without an algorithm, or fewer than 2.
        """
        if algorithm is None:
            if num_draft_tokens is not None:
                raise ValueError("speculative_num_draft_tokens needs speculative_algorithm")
            return None
        name = algorithm.upper()
        if name not in SPECULATIVE_ALGORITHMS:
            raise ValueError(
                f"speculative_algorithm must be one of {', '.join(SPECULATIVE_ALGORITHMS)}, got {algorithm!r}"
            )
        draft = 4 if num_draft_tokens is None else num_draft_tokens  # SGLang's usual automatic choice
        if draft < 2:
            raise ValueError(f"speculative_num_draft_tokens must be at least 2, got {draft}")
        return cls("EAGLE" if name == "NEXTN" else name, draft)

    @property
    def reserved_tokens(self) -> int:
        """SGLang's ``compute_num_reserved_tokens``: ``max(eagle_topk * num_steps, num_draft_tokens)``,
        with top-k 1 and ``num_draft_tokens - 1`` steps."""
        return self.num_draft_tokens

    def server_args(self) -> dict[str, Any]:
        """The ``/server_info`` keys of speculative decoding."""
        return {
            "speculative_algorithm": self.algorithm,
            "speculative_num_steps": self.num_draft_tokens - 1,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": self.num_draft_tokens,
        }


@dataclass(frozen=True, slots=True)
class ContextLimits:
    """SGLang's length limits for a context length C and a KV capacity; ``reserved_tokens`` (speculative
    draft slots) count as prompt tokens in the tokenizer-stage checks."""

    context_length: int
    max_total_tokens: int
    reserved_tokens: int = 0

    @property
    def max_req_len(self) -> int:
        """SGLang's ``max_req_len``: ``min(C - 1, max_total_tokens - 1)``."""
        return min(self.context_length - 1, self.max_total_tokens - 1)

    @property
    def max_req_input_len(self) -> int:
        """SGLang's ``max_req_input_len``: ``max_req_len - 5``."""
        return self.max_req_len - 5

    def check_tokenizer_stage(self, prompt_tokens: int, params: SamplingParams) -> None:
        """``TokenizerManager._validate_one_request``: N + reserved >= C, then N + reserved + M > C
        when M was sent."""
        n, c = prompt_tokens + self.reserved_tokens, self.context_length
        if n >= c:
            raise ProtocolError.value(
                f"The input ({n} tokens) is longer than the model's context length ({c} tokens)."
            )
        if params.max_new_tokens_sent and n + (m := params.max_new_tokens or 0) > c:
            raise ProtocolError.value(
                f"Requested token count exceeds the model's maximum context length of {c} tokens. "
                f"You requested a total of {n + m} tokens: {n} tokens from the input messages and "
                f"{m} tokens for the completion. Please reduce the number of tokens in the input "
                "messages or the completion to fit within the limit."
            )

    def check_scheduler_stage(self, prompt_tokens: int) -> None:
        """The scheduler's check: the prompt must be shorter than ``max_req_input_len`` (else a 400)."""
        limit = self.max_req_input_len
        if prompt_tokens >= limit:
            raise ProtocolError.value(
                f"Input length ({prompt_tokens} tokens) exceeds the maximum allowed length ({limit} tokens). "
                "Use a shorter input or enable --allow-auto-truncate."
            )

    def clip_max_new_tokens(self, prompt_tokens: int, max_new_tokens: int | None) -> int:
        """SGLang silently clips the budget to what fits; ``finish_reason.length`` shows the result."""
        budget = UNLIMITED_NEW_TOKENS if max_new_tokens is None else max_new_tokens
        return max(0, min(budget, self.max_req_len - prompt_tokens - 1))
