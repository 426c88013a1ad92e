"""SGLang's ``/generate`` request validation and error bodies (see docs/devserver.md).

Validation runs in SGLang's order, each stage with its own error body: E1 pydantic parsing of the
top-level fields, E2 the schema contract for ``sampling_params`` (unknown keys and wrong JSON types
rejected with serde-style messages), E3 ``ValueError`` checks (ranges, lengths).
Batch requests (list-valued prompt fields) and streaming are not emulated: a 400 names the field.
"""

from __future__ import annotations

import math
import os
import random
import uuid
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

TOP_K_ALL = 1 << 30
"""SGLang's default ``top_k``: the whole vocabulary."""
UNLIMITED_NEW_TOKENS = 1 << 30
"""``max_new_tokens: null``: SGLang's ``Scheduler.init_req_max_new_tokens`` budget before clipping."""
GREEDY_TEMPERATURE = 1e-6
MAX_STOP_STRINGS = 32


class ProtocolError(Exception):
    """An HTTP error reply with SGLang's status and body for it."""

    def __init__(self, status: int, body: Any, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.message = message

    @classmethod
    def pydantic(cls, message: str) -> ProtocolError:
        """E1: request body did not parse into ``GenerateReqInput``."""
        body = {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}
        return cls(400, body, message)

    @classmethod
    def contract(cls, message: str) -> ProtocolError:
        """E2: the schema contract rejected ``sampling_params``."""
        return cls(400, {"error": message}, message)

    @classmethod
    def value(cls, message: str, status: int = 400) -> ProtocolError:
        """E3: a ``ValueError`` in request handling, or a scheduler abort carrying status 400."""
        return cls(status, {"error": {"message": message}}, message)

    @classmethod
    def http(cls, message: str, status: int = 503) -> ProtocolError:
        """E4: an ``HTTPException``, e.g. a scheduler abort carrying status 503."""
        body = {"object": "error", "message": message, "type": str(status), "param": None, "code": status}
        return cls(status, body, message)

    @classmethod
    def for_status(cls, status: int, message: str) -> ProtocolError:
        """The body SGLang uses for ``status``: E3 for 400, E4 for everything else."""
        return cls.value(message, status) if status == 400 else cls.http(message, status)


# --------------------------------------------------------------------------- E2: sampling_params

# Field name -> JSON type expected by the contract, in SGLang's order (``sglang/api/v1/api_types.py``
# ``_FIELDS_SamplingParams``, listed in the unknown-field message).
SAMPLING_PARAM_TYPES: dict[str, str] = {
    "max_new_tokens": "i64",
    "stop": "str_or_strs",
    "stop_token_ids": "i64_list",
    "stop_regex": "str_or_strs",
    "temperature": "f64",
    "top_p": "f64",
    "top_k": "i64",
    "min_p": "f64",
    "frequency_penalty": "f64",
    "presence_penalty": "f64",
    "repetition_penalty": "f64",
    "min_new_tokens": "i64",
    "n": "i64",
    "json_schema": "str",
    "regex": "str",
    "ebnf": "str",
    "structural_tag": "str",
    "ignore_eos": "bool",
    "skip_special_tokens": "bool",
    "spaces_between_special_tokens": "bool",
    "no_stop_trim": "bool",
    "stream_interval": "i64",
    "logit_bias": "f64_map",
    "sampling_seed": "i64",
    "custom_params": "any",
    "beam_width": "i64",
    "watermark": "watermark",
    "choice": "str_list",
}

GRAMMAR_KEYS = ("json_schema", "regex", "ebnf", "structural_tag")

_EXPECTED = {
    "i64": "i64",
    "f64": "f64",
    "bool": "a boolean",
    "str": "a string",
    "i64_list": "a sequence",
    "str_list": "a sequence",
    "f64_map": "a map",
    "str_or_strs": "a value or an array of values for StringOrList",
    "watermark": "struct WatermarkRequestConfig",
}


def _contract_unexpected(value: Any) -> str:
    """How the contract (``api_types._unexpected``, serde's wording) names a JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{'true' if value else 'false'}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    if isinstance(value, list):
        return "sequence"
    if isinstance(value, dict):
        return "map"
    return type(value).__name__


def _type_error(value: Any, expected: str) -> ProtocolError:
    return ProtocolError.contract(
        f"invalid type: {_contract_unexpected(value)}, expected {_EXPECTED[expected]}"
    )


def _check_type(value: Any, kind: str) -> None:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if kind == "i64":
        if not is_int:
            raise _type_error(value, kind)
    elif kind == "f64":
        if not (is_int or isinstance(value, float)):
            raise _type_error(value, kind)
    elif kind == "bool":
        if not isinstance(value, bool):
            raise _type_error(value, kind)
    elif kind == "str":
        if not isinstance(value, str):
            raise _type_error(value, kind)
    elif kind in ("i64_list", "str_list"):
        if not isinstance(value, list):
            raise _type_error(value, kind)
        for item in value:
            _check_type(item, "i64" if kind == "i64_list" else "str")
    elif kind == "f64_map":
        if not isinstance(value, dict):
            raise _type_error(value, kind)
        for item in value.values():
            _check_type(item, "f64")
    elif kind == "str_or_strs":
        if isinstance(value, list):
            _check_type(value, "str_list")
        elif not isinstance(value, str):
            raise _type_error(value, kind)
    elif kind == "watermark":
        if not isinstance(value, dict):
            raise _type_error(value, kind)
        fields = {"enabled": "bool", "key": "str", "context_window": "i64"}
        for key, item in value.items():
            if key not in fields:
                raise ProtocolError.contract(
                    f"unknown field `{key}`, expected one of `enabled`, `key`, `context_window`"
                )
            if item is not None:
                _check_type(item, fields[key])


def _as_list(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


@dataclass(slots=True)
class SamplingParams:
    """``sampling_params`` with SGLang's defaults; ``None``/absent keys take the default, except
    ``max_new_tokens``: absent is 128, ``null`` is no limit (generate until a stop or the context end)."""

    max_new_tokens: int | None = 128
    max_new_tokens_sent: bool = False
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    stop_regex: list[str] = field(default_factory=list)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_ALL
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_new_tokens: int = 0
    repetition_penalty: float = 1.0
    n: int = 1
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    logit_bias: dict[str, float] = field(default_factory=dict)
    sampling_seed: int | None = None
    custom_params: Any = None
    stream_interval: int | None = None
    beam_width: int | None = None
    watermark: Any = None
    choice: list[str] | None = None

    @classmethod
    def from_json(cls, obj: dict[str, Any] | None) -> SamplingParams:
        """Apply the E2 contract: unknown keys and wrongly typed values are rejected."""
        params = cls()
        for key, value in (obj or {}).items():
            kind = SAMPLING_PARAM_TYPES.get(key)
            if kind is None:
                expected = ", ".join(f"`{name}`" for name in SAMPLING_PARAM_TYPES)
                raise ProtocolError.contract(f"unknown field `{key}`, expected one of {expected}")
            if value is None:
                if key == "max_new_tokens":  # SamplingParams.__post_init__ keeps None: no limit
                    params.max_new_tokens = None
                continue
            _check_type(value, kind)
            if key in GRAMMAR_KEYS and not value:
                continue  # SamplingParams.__post_init__: an empty grammar means unset
            if key in ("stop", "stop_regex"):
                value = _as_list(value)
            elif key == "max_new_tokens":
                params.max_new_tokens_sent = True
            setattr(params, key, value)
        return params

    def verify(self, vocab_size: int) -> None:
        """SGLang's ``SamplingParams.normalize`` (stop counts) then ``verify`` (ranges), raised as E3."""
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ProtocolError.value(
                f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(self.stop)}"
            )
        if self.beam_width is not None and self.beam_width < 1:
            raise ProtocolError.value(f"beam_width must be at least 1, got {self.beam_width}.")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ProtocolError.value(
                f"temperature must be a non-negative finite number, got {self.temperature}."
            )
        if not 0 < self.top_p <= 1:
            raise ProtocolError.value(f"top_p must be in (0, 1], got {self.top_p}.")
        if not 0 <= self.min_p <= 1:
            raise ProtocolError.value(f"min_p must be in [0, 1], got {self.min_p}.")
        # SamplingParams.__post_init__ turns a greedy temperature into top_k = 1 before this check.
        if self.top_k < 1 and self.top_k != -1 and not self.greedy:
            raise ProtocolError.value(f"top_k must be -1 (disable) or at least 1, got {self.top_k}.")
        if not -2 <= self.frequency_penalty <= 2:
            raise ProtocolError.value(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.")
        if not -2 <= self.presence_penalty <= 2:
            raise ProtocolError.value(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.")
        if not 0 < self.repetition_penalty <= 2:
            raise ProtocolError.value(
                f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {self.repetition_penalty}."
            )
        if self.min_new_tokens < 0:
            raise ProtocolError.value(
                f"min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}."
            )
        if self.max_new_tokens is not None:
            if self.max_new_tokens < 0:
                raise ProtocolError.value(f"max_new_tokens must be at least 0, got {self.max_new_tokens}.")
            if self.min_new_tokens > self.max_new_tokens:
                raise ProtocolError.value(
                    f"min_new_tokens must be in [0, max_new_tokens({self.max_new_tokens})], "
                    f"got {self.min_new_tokens}."
                )
        for key in self.logit_bias:
            try:
                token = int(key)
            except ValueError as exc:
                raise ProtocolError.value(str(exc)) from None
            if not 0 <= token < vocab_size:
                raise ProtocolError.value(f"logit_bias must has keys in [0, {vocab_size - 1}], got {key}.")
        if self.sampling_seed is not None and not -(2**63) <= self.sampling_seed <= 2**63 - 1:
            raise ProtocolError.value(
                f"sampling_seed must be in [-2**63, 2**63 - 1], got {self.sampling_seed}."
            )
        grammars = [self.json_schema, self.regex, self.ebnf, self.structural_tag]
        if sum(grammar is not None for grammar in grammars) > 1:
            raise ProtocolError.value("Only one of json_schema, regex, ebnf, or structural_tag can be set.")
        # Checked by the dev server, not by SGLang: features it does not emulate fail loudly.
        # json_schema / regex / ebnf are compiled by the backend (devserver/grammar.py).
        if self.structural_tag is not None:
            raise ProtocolError.value(
                "The dev server does not implement constrained decoding (structural_tag); use a real SGLang server."
            )
        if self.beam_width is not None and self.beam_width > 1:
            raise ProtocolError.value("The dev server does not implement beam search (beam_width > 1).")
        if self.choice is not None:
            raise ProtocolError.value("The dev server does not implement choice (a /v1/systemone field).")
        if self.stop_regex:
            raise ProtocolError.value("The dev server does not implement stop_regex; use stop strings.")

    @property
    def greedy(self) -> bool:
        """Whether the temperature is below SGLang's greedy threshold."""
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def effective_top_k(self) -> int:
        """``top_k`` with -1 (no limit) mapped to the whole vocabulary."""
        return TOP_K_ALL if self.top_k == -1 else self.top_k


# --------------------------------------------------------------------------- E1: top-level fields


class GenerateReqInput(BaseModel):
    """The top-level fields of ``/generate``; unknown keys are ignored like SGLang does."""

    model_config = ConfigDict(extra="ignore")

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    input_embeds: Any = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    token_ids_logprob: list[int] | list[list[int]] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    return_prompt_token_ids: bool = False
    return_hidden_states: bool | str | list[bool | str] = False
    custom_logit_processor: str | list[str | None] | None = None
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0


def _pydantic_message(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        location = ".".join(str(part) for part in error.get("loc", ())) or "body"
        parts.append(f"{location}: {error.get('msg')}")
    count = len(parts)
    return f"{count} validation error{'s' if count != 1 else ''} for GenerateReqInput: " + "; ".join(parts)


BATCH_FIELDS = (
    "text",
    "input_ids",
    "sampling_params",
    "rid",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "token_ids_logprob",
)
"""Top-level fields whose list form makes a batch request (one value per prompt)."""


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
    return_hidden_states: bool = False
    custom_logit_processor: bool = False

    @property
    def n(self) -> int:
        """``sampling_params.n``: how many samples the prompt gets (a list reply when > 1)."""
        return self.params.n


def _batch_field(req: GenerateReqInput) -> str | None:
    """The first field whose value is a per-prompt list (a batch request), if any."""
    for name in BATCH_FIELDS:
        value = getattr(req, name)
        if name in ("input_ids", "token_ids_logprob"):
            if isinstance(value, list) and value and isinstance(value[0], list):
                return name
        elif isinstance(value, list):
            return name
    return None


def parse_generate(body: Any) -> ParsedGenerate:
    """Validate a decoded JSON body in SGLang's order (E1, then E2, then E3 shape checks).

    Raises:
        ProtocolError: with SGLang's status and body for the first rule the request breaks; batch
            requests and ``stream: true`` are refused with a 400 naming the field (not emulated).
    """
    try:
        req = GenerateReqInput.model_validate(body)
    except ValidationError as exc:
        raise ProtocolError.pydantic(_pydantic_message(exc)) from None
    batch_field = _batch_field(req)
    if batch_field is not None:
        raise ProtocolError.value(
            f"The dev server does not implement batch requests: {batch_field} is a list. "
            "Send one prompt per request."
        )
    # No field is a list past this point: the narrowing below only restates that for the reader.
    assert not isinstance(req.sampling_params, list) and not isinstance(req.rid, list)
    assert not isinstance(req.text, list) and not isinstance(req.return_logprob, list)
    assert not isinstance(req.logprob_start_len, list) and not isinstance(req.top_logprobs_num, list)
    input_ids = [int(token) for token in req.input_ids] if req.input_ids is not None else None
    token_ids_logprob = [int(token) for token in req.token_ids_logprob or []] or None
    params = SamplingParams.from_json(req.sampling_params)
    if req.stream:
        raise ProtocolError.value(
            "The dev server does not implement streaming (stream: true); send stream: false or omit it."
        )
    for flag in ("return_text_in_logprobs", "return_prompt_token_ids"):
        if getattr(req, flag):
            raise ProtocolError.value(f"The dev server does not implement {flag}; send false or omit it.")
    if req.input_embeds is not None:
        raise ProtocolError.value("The dev server does not accept input_embeds; send text or input_ids.")
    if (req.text is None) == (input_ids is None):
        raise ProtocolError.value("Either text, input_ids or input_embeds should be provided.")
    if input_ids is not None and not input_ids:
        raise ProtocolError.value("input_ids cannot be empty.")
    start = -1 if req.logprob_start_len is None else req.logprob_start_len
    if start < -1:
        raise ProtocolError.value(f"logprob_start_len must be -1 or at least 0, got {start}.")
    top = 0 if req.top_logprobs_num is None else req.top_logprobs_num
    if top < 0:
        raise ProtocolError.value(f"top_logprobs_num must be at least 0, got {top}.")
    hidden_modes = req.return_hidden_states
    for mode in hidden_modes if isinstance(hidden_modes, list) else [hidden_modes]:
        if not isinstance(mode, bool) and mode != "last":  # schedule_batch.get_return_hidden_states_mode
            raise ProtocolError.value("return_hidden_states must be a boolean or the string literal 'last'.")
    processors = req.custom_logit_processor
    return ParsedGenerate(
        rid=req.rid,
        text=req.text,
        input_ids=input_ids,
        params=params,
        return_logprob=bool(req.return_logprob),
        logprob_start_len=start,
        top_logprobs_num=top,
        token_ids_logprob=token_ids_logprob,
        return_routed_experts=req.return_routed_experts,
        routed_experts_start_len=req.routed_experts_start_len,
        return_hidden_states=(
            any(mode is not False for mode in hidden_modes)
            if isinstance(hidden_modes, list)
            else hidden_modes is not False
        ),
        custom_logit_processor=any(processors) if isinstance(processors, list) else bool(processors),
    )


_RID_RANDOM = random.Random(int.from_bytes(os.urandom(16), "little"))


def new_rid() -> str:
    """A uuid4 hex like SGLang's default rid (without an ``os.urandom`` call per request, which is
    slow on some VMs)."""
    return uuid.UUID(int=_RID_RANDOM.getrandbits(128), version=4).hex


# --------------------------------------------------------------------------- context limits

SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")
"""The speculative algorithms the dev server emulates: the EAGLE family, whose draft tokens SGLang
reserves in every request's context (NEXTN is MTP; SGLang resolves it to EAGLE)."""
DEFAULT_SPECULATIVE_NUM_DRAFT_TOKENS = 4
"""SGLang's automatic choice for most models: 3 steps, top-k 1, 4 draft tokens."""


@dataclass(frozen=True, slots=True)
class SpeculativeDecoding:
    """EAGLE-style speculative decoding as ``/server_info`` reports it: a chain draft (top-k 1) of
    ``num_draft_tokens - 1`` steps. Nothing is drafted; only its effect on the length limits is real."""

    algorithm: str
    num_draft_tokens: int = DEFAULT_SPECULATIVE_NUM_DRAFT_TOKENS

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
        draft = DEFAULT_SPECULATIVE_NUM_DRAFT_TOKENS if num_draft_tokens is None else num_draft_tokens
        if draft < 2:
            raise ValueError(f"speculative_num_draft_tokens must be at least 2, got {draft}")
        return cls("EAGLE" if name == "NEXTN" else name, draft)

    @property
    def num_steps(self) -> int:
        """Draft steps of the chain: ``num_draft_tokens - 1``."""
        return self.num_draft_tokens - 1

    @property
    def eagle_topk(self) -> int:
        """Draft tokens per step: always 1 (a chain)."""
        return 1

    @property
    def reserved_tokens(self) -> int:
        """SGLang's ``compute_num_reserved_tokens``: ``max(eagle_topk * num_steps, num_draft_tokens)``."""
        return max(self.eagle_topk * self.num_steps, self.num_draft_tokens)


def speculative_server_args(spec: SpeculativeDecoding | None) -> dict[str, Any]:
    """The ``/server_info`` keys of speculative decoding (all null without it, as in SGLang)."""
    return {
        "speculative_algorithm": spec.algorithm if spec else None,
        "speculative_num_steps": spec.num_steps if spec else None,
        "speculative_eagle_topk": spec.eagle_topk if spec else None,
        "speculative_num_draft_tokens": spec.num_draft_tokens if spec else None,
    }


@dataclass(frozen=True, slots=True)
class ContextLimits:
    """SGLang's length limits for a context length C and a KV capacity.

    ``reserved_tokens`` (speculative draft slots) count as prompt tokens in the tokenizer-stage checks.
    """

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
        if params.max_new_tokens_sent and params.max_new_tokens is not None and n + params.max_new_tokens > c:
            m = params.max_new_tokens
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
