"""Check that a Hugging Face checkpoint's config.json matches the Megatron model arguments we pass.

A checkpoint that does not match (Qwen3-4B in the 8B folder, a half-finished download) otherwise
fails minutes into a GPU job, after Ray, SGLang and Megatron have started. Standard library only:
this runs in slime's image before anything else.

    python3 check_hf_config.py /models/Qwen3-8B -- --num-layers 36 --hidden-size 4096 ...
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

# Megatron flag -> config.json key.
_VALUE_FLAGS = {
    "--num-layers": "num_hidden_layers",
    "--hidden-size": "hidden_size",
    "--ffn-hidden-size": "intermediate_size",
    "--num-attention-heads": "num_attention_heads",
    "--num-query-groups": "num_key_value_heads",
    "--kv-channels": "head_dim",
    "--vocab-size": "vocab_size",
    "--rotary-base": "rope_theta",
    "--norm-epsilon": "rms_norm_eps",
}


def _flag_values(model_args: list[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for index, token in enumerate(model_args):
        if token in _VALUE_FLAGS:
            if index + 1 >= len(model_args):
                raise ValueError(f"{token} has no value")
            values[token] = model_args[index + 1]
    return values


def _hf_value(config: dict[str, Any], key: str) -> Any:
    if key == "rope_theta" and key not in config:
        # transformers 5 moves rope_theta into rope_parameters.
        return (config.get("rope_parameters") or {}).get("rope_theta")
    return config.get(key)


def _same(expected: str, actual: Any) -> bool:
    try:
        return math.isclose(float(expected), float(actual), rel_tol=1e-9)
    except (TypeError, ValueError):
        return False


def mismatches(config: dict[str, Any], model_args: list[str]) -> list[str]:
    """Human-readable differences between config.json and the Megatron flags; empty if they agree."""
    problems = []
    for flag, expected in _flag_values(model_args).items():
        key = _VALUE_FLAGS[flag]
        actual = _hf_value(config, key)
        if not _same(expected, actual):
            problems.append(f"{flag} {expected} but config.json {key} = {actual!r}")
    untied = "--untie-embeddings-and-output-weights" in model_args
    tied = bool(config.get("tie_word_embeddings", False))
    if untied == tied:
        problems.append(
            f"tie_word_embeddings = {tied} in config.json but the model args "
            f"{'untie' if untied else 'tie'} the embeddings"
        )
    return problems


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] != "--":
        print(f"usage: {Path(__file__).name} HF_CHECKPOINT_DIR -- MODEL_ARGS...", file=sys.stderr)
        return 2
    config_path = Path(argv[0]) / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        print(f"error: {config_path} not found: is {argv[0]} a Hugging Face checkpoint?", file=sys.stderr)
        return 1
    except (OSError, json.JSONDecodeError) as error:
        print(f"error: cannot read {config_path}: {error}", file=sys.stderr)
        return 1
    if not isinstance(config, dict):
        print(f"error: {config_path} is not a JSON object", file=sys.stderr)
        return 1
    try:
        problems = mismatches(config, argv[2:])
    except ValueError as error:
        print(f"error: bad model arguments: {error}", file=sys.stderr)
        return 2
    if problems:
        print(f"error: {config_path} does not match the model arguments:", file=sys.stderr)
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
