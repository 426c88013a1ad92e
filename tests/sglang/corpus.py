"""The differential corpus: ``/generate`` requests sent to the dev server's hf backend and to SGLang.

Every field and value the package (and slime) sends, the invalid ones, length limits, grammars,
``n > 1`` and the logprob options. Each case has an id (``family/name``); greedy cases must agree token
for token, sampled ones in shape (each server's logprobs are checked against a forward pass instead).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

CONTEXT = 4096
IM_END, END_OF_TEXT = 151645, 151643
PROMPTS = {
    "p1": [9707],
    "p5": [9707, 11, 1879, 0, 220],
    "p40": [(1000 + 37 * i) % 150000 for i in range(40)],
    "chat": [151644, 872, 198, 64, 8251, 389, 264, 97982, 151645, 198, 151644, 77091, 198],
}


@dataclass(frozen=True)
class Case:
    """One request. ``greedy``: the output must be the same ids and logprobs on both servers."""

    id: str
    body: dict[str, Any]
    greedy: bool = True
    needs: dict[str, Any] = field(default_factory=dict)


def _req(prompt: str, params: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"input_ids": PROMPTS[prompt], "return_logprob": True}
    if params is not None:
        body["sampling_params"] = params
    body.update(top)
    return body


GREEDY = {"temperature": 0, "max_new_tokens": 6}

SAMPLING_VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "max0": {"max_new_tokens": 0},
    "max1": {"max_new_tokens": 1},
    "max12": {"max_new_tokens": 12},
    "ignore-eos": {"ignore_eos": True},
    "min-new": {"min_new_tokens": 4},
    "top-k1": {"temperature": 1.0, "top_k": 1},
    "top-p-tiny": {"temperature": 1.0, "top_p": 1e-9},
    "top-k-all": {"top_k": -1},
    "min-p": {"min_p": 0.5},
    "rep-penalty": {"repetition_penalty": 1.5},
    "freq-penalty": {"frequency_penalty": 1.0},
    "pres-penalty": {"presence_penalty": 1.0},
    "bias-token": {"logit_bias": {"40": 100.0}},
    "stop-absent": {"stop": ["zzzz-never"]},
    "stop-ids-absent": {"stop_token_ids": [3]},
    # a stop id that is not an end of sequence, and stop strings, that fire (the bias makes "I" = 40 sure)
    "stop-ids-fire": {"logit_bias": {"40": 100.0}, "stop_token_ids": [40]},
    "stop-ids-fire-no-trim": {"logit_bias": {"40": 100.0}, "stop_token_ids": [40], "no_stop_trim": True},
    "stop-str-fire": {"logit_bias": {"40": 100.0}, "stop": ["II"]},
    "stop-str-fire-no-trim": {"logit_bias": {"40": 100.0}, "stop": ["zz", "II"], "no_stop_trim": True},
    "no-skip-special": {"skip_special_tokens": False},
    "no-spaces-special": {"spaces_between_special_tokens": False},
    "no-stop-trim": {"no_stop_trim": True},
    "slime": {"no_stop_trim": True, "spaces_between_special_tokens": False, "skip_special_tokens": False},
    "nulls": {"stop": None, "top_k": None, "logit_bias": None},
    "seed": {"sampling_seed": 7},
    "custom-params": {"custom_params": {"anything": 1}},
}

IM_END_MATRIX = {
    f"skip{int(skip)}-trim{int(not no_trim)}": {
        "logit_bias": {str(IM_END): 100.0},
        "skip_special_tokens": skip,
        "no_stop_trim": no_trim,
    }
    for skip in (True, False)
    for no_trim in (False, True)
}

LOGPROB_VARIANTS: dict[str, dict[str, Any]] = {
    "no-logprob": {"return_logprob": False},
    "start-0": {"logprob_start_len": 0},
    "start-2": {"logprob_start_len": 2},
    "start-n": {"logprob_start_len": "N"},
    "top-1": {"top_logprobs_num": 1},
    "top-3": {"top_logprobs_num": 3},
    "top-3-start-0": {"top_logprobs_num": 3, "logprob_start_len": 0},
    "token-ids": {"token_ids_logprob": [1, 2, IM_END]},
    "token-ids-start-0": {"token_ids_logprob": [1, 2], "logprob_start_len": 0},
    "text-in-logprobs": {"return_text_in_logprobs": True},
    "rid": {"rid": "conformance-rid"},
    "unknown-top-level": {"lora_path": None, "priority": None, "whatever": 1},
    "routed-experts": {"return_routed_experts": True},
    "prompt-ids": {"return_prompt_token_ids": True},
}

GRAMMARS: dict[str, dict[str, Any]] = {
    "regex": {"regex": "(yes|no)!", "max_new_tokens": 10},
    "ebnf": {"ebnf": 'root ::= "A" [0-9] [0-9] "."', "max_new_tokens": 10},
    "json-enum": {"json_schema": json.dumps({"enum": ["calm", "angry"]}), "max_new_tokens": 10},
    "json-int": {
        "json_schema": json.dumps({"type": "integer", "minimum": 10, "maximum": 99}),
        "max_new_tokens": 10,
    },
    "json-any": {"json_schema": "$$ANY$$", "max_new_tokens": 4},
    "regex-short": {"regex": "[a-z]+", "max_new_tokens": 3},
}

ERRORS: dict[str, dict[str, Any]] = {
    # E1: pydantic
    "rid-int": {"input_ids": [1, 2], "rid": 5},
    "stream-not-bool": {"input_ids": [1, 2], "stream": "x"},
    # E2: the schema contract on sampling_params and top-level types (ids start with e2-)
    "e2-unknown-param": {"input_ids": [1, 2], "sampling_params": {"foo": 1}},
    "e2-max-float": {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1.5}},
    "e2-max-str": {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": "5"}},
    "e2-temp-str": {"input_ids": [1, 2], "sampling_params": {"temperature": "hot"}},
    "e2-ignore-eos-int": {"input_ids": [1, 2], "sampling_params": {"ignore_eos": 1}},
    "e2-stop-int": {"input_ids": [1, 2], "sampling_params": {"stop": 5}},
    "e2-stop-ids-str": {"input_ids": [1, 2], "sampling_params": {"stop_token_ids": ["a"]}},
    "e2-bias-list": {"input_ids": [1, 2], "sampling_params": {"logit_bias": [1]}},
    "e2-regex-int": {"input_ids": [1, 2], "sampling_params": {"regex": 5}},
    "e2-watermark-str": {"input_ids": [1, 2], "sampling_params": {"watermark": "x"}},
    "e2-return-logprob-str": {"input_ids": [1, 2], "return_logprob": "yes"},
    # numbers of another JSON type (numpy arrays through JSON give floats): no coercion
    "e2-ids-float": {"input_ids": [9707.0, 11.0]},
    "e2-ids-str": {"input_ids": ["9707", "11"]},
    "e2-start-str": {"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": "1"},
    "e2-return-logprob-int": {"input_ids": [1, 2], "return_logprob": 1},
    "e2-top-logprobs-float": {"input_ids": [1, 2], "return_logprob": True, "top_logprobs_num": 2.0},
    "sampling-params-list": {"input_ids": [1, 2], "sampling_params": [1]},
    # E3: ValueError checks
    "no-prompt": {"sampling_params": {"max_new_tokens": 2}},
    "empty-ids": {"input_ids": []},
    "temp-negative": {"input_ids": [1, 2], "sampling_params": {"temperature": -1}},
    "top-p-zero": {"input_ids": [1, 2], "sampling_params": {"top_p": 0}},
    "top-p-big": {"input_ids": [1, 2], "sampling_params": {"top_p": 1.5}},
    "top-k-zero": {"input_ids": [1, 2], "sampling_params": {"top_k": 0}},
    "min-p-big": {"input_ids": [1, 2], "sampling_params": {"min_p": 2}},
    "max-negative": {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -1}},
    "min-new-negative": {"input_ids": [1, 2], "sampling_params": {"min_new_tokens": -1}},
    "min-new-over-max": {"input_ids": [1, 2], "sampling_params": {"min_new_tokens": 5, "max_new_tokens": 2}},
    "rep-zero": {"input_ids": [1, 2], "sampling_params": {"repetition_penalty": 0}},
    "rep-big": {"input_ids": [1, 2], "sampling_params": {"repetition_penalty": 3}},
    "freq-big": {"input_ids": [1, 2], "sampling_params": {"frequency_penalty": 3}},
    "pres-big": {"input_ids": [1, 2], "sampling_params": {"presence_penalty": -3}},
    "two-grammars": {"input_ids": [1, 2], "sampling_params": {"regex": "a", "ebnf": 'root ::= "a"'}},
    "bad-regex": {"input_ids": [1, 2], "sampling_params": {"regex": "("}},
    "bad-ebnf": {"input_ids": [1, 2], "sampling_params": {"ebnf": "root ::= "}},
    "bad-json": {"input_ids": [1, 2], "sampling_params": {"json_schema": "{not json"}},
    "json-unique-items": {
        "input_ids": [1, 2],
        "sampling_params": {"json_schema": json.dumps({"type": "array", "uniqueItems": True})},
    },
    "json-not": {
        "input_ids": [1, 2],
        "sampling_params": {
            "json_schema": json.dumps({"anyOf": [{"type": "integer"}, {"not": {"const": 1}}]})
        },
    },
    "json-format-unknown": {
        "input_ids": [1, 2],
        "sampling_params": {
            "json_schema": json.dumps({"properties": {"p": {"type": "string", "format": "path"}}})
        },
    },
    "json-pattern-and-length": {
        "input_ids": [1, 2],
        "sampling_params": {"json_schema": json.dumps({"type": "string", "pattern": "a+", "maxLength": 3})},
    },
    "too-many-stops": {"input_ids": [1, 2], "sampling_params": {"stop": [f"s{i}" for i in range(33)]}},
    "start-past-prompt": {"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 3},
    "bias-out-of-range": {"input_ids": [1, 2], "sampling_params": {"logit_bias": {"999999": 1.0}}},
    "token-ids-out-of-range": {"input_ids": [1, 2], "return_logprob": True, "token_ids_logprob": [999999]},
    "hidden-states": {"input_ids": [1, 2], "return_hidden_states": True},
    "custom-logit-processor": {"input_ids": [1, 2], "custom_logit_processor": "x"},
    "structural-tag": {"input_ids": [1, 2], "sampling_params": {"structural_tag": "{}"}},
    "n-zero": {"input_ids": [1, 2], "sampling_params": {"n": 0, "temperature": 0, "max_new_tokens": 4}},
    "routed-start-past": {"input_ids": [1, 2], "return_routed_experts": True, "routed_experts_start_len": 5},
    # length limits (C = 4096; max_req_len = C - 1, max_req_input_len = C - 6)
    "prompt-at-context": {"input_ids": [7] * CONTEXT},
    "prompt-over-context": {"input_ids": [7] * (CONTEXT + 10)},
    "prompt-plus-max-over": {"input_ids": [7] * 100, "sampling_params": {"max_new_tokens": CONTEXT}},
    "prompt-over-req-input": {"input_ids": [7] * (CONTEXT - 3)},
    # what the dev server does not emulate
    "stream": {"input_ids": [1, 2], "stream": True, "sampling_params": {"max_new_tokens": 2}},
    "batch-ids": {"input_ids": [[1, 2], [3, 4]], "sampling_params": {"max_new_tokens": 2}},
    "batch-text": {"text": ["a", "b"], "sampling_params": {"max_new_tokens": 2}},
    "stop-regex": {"input_ids": [1, 2], "sampling_params": {"stop_regex": "x", "max_new_tokens": 2}},
}

LENGTHS: dict[str, dict[str, Any]] = {
    "clip-to-context": {
        "input_ids": [7] * (CONTEXT - 10),
        "sampling_params": {"max_new_tokens": None, "temperature": 0, "ignore_eos": True},
    },
    "fits-exactly": {
        "input_ids": [7] * 100,
        "sampling_params": {"max_new_tokens": CONTEXT - 100, "temperature": 0, "ignore_eos": True},
    },
    "long-prompt": {
        "input_ids": [(11 * i + 5) % 150000 for i in range(1500)],
        "sampling_params": GREEDY,
        "return_logprob": True,
    },
    "text-input": {"text": "Hello, world! 123", "sampling_params": GREEDY, "return_logprob": True},
    "text-special": {
        "text": "<|im_start|>user\nHi<|im_end|>\n",
        "sampling_params": GREEDY,
        "return_logprob": True,
    },
    "n2-greedy": {"input_ids": PROMPTS["p40"], "sampling_params": {**GREEDY, "n": 2}, "return_logprob": True},
    "n3-greedy-text": {"text": "Count:", "sampling_params": {**GREEDY, "n": 3}},
}


def build() -> list[Case]:
    """Every case, in a fixed order."""
    cases: list[Case] = []
    for prompt in PROMPTS:
        for name, variant in SAMPLING_VARIANTS.items():
            cases.append(Case(f"sampling/{name}/{prompt}", _req(prompt, {**GREEDY, **variant})))
        for name, variant in IM_END_MATRIX.items():
            cases.append(Case(f"im-end/{name}/{prompt}", _req(prompt, {**GREEDY, **variant})))
        for name, variant in LOGPROB_VARIANTS.items():
            extra = {k: (len(PROMPTS[prompt]) if v == "N" else v) for k, v in variant.items()}
            cases.append(Case(f"logprobs/{name}/{prompt}", {**_req(prompt, dict(GREEDY)), **extra}))
    for prompt in ("p5", "chat"):
        for name, params in GRAMMARS.items():
            cases.append(Case(f"grammar/{name}/{prompt}", _req(prompt, {"temperature": 0, **params})))
        for name, params in (
            ("t1", {"temperature": 1.0}),
            ("t07-top-p", {"temperature": 0.7, "top_p": 0.9}),
            ("top-k-20", {"temperature": 1.0, "top_k": 20}),
            ("n2", {"temperature": 1.0, "n": 2}),
            ("grammar", {"temperature": 1.0, "regex": "[a-z]{3}"}),
        ):
            cases.append(
                Case(f"sampled/{name}/{prompt}", _req(prompt, {"max_new_tokens": 8, **params}), greedy=False)
            )
    for name, body in ERRORS.items():
        cases.append(Case(f"error/{name}", body))
    for name, body in LENGTHS.items():
        cases.append(Case(f"length/{name}", body))
    return cases


CASES = build()
