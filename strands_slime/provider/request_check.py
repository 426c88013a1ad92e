"""What a ``/generate`` request may carry, checked before it leaves the client.

SGLang 0.5.23 does not range-check ``input_ids`` (one outside the embedding table crashes its scheduler
and the whole server) and answers 400 to numbers of the wrong JSON type, which numpy values become. So
what has one meaning is converted and the rest refused with :class:`InvalidRequestError` before anything
is sent; ids only where the caller says they may come from outside (``check``). docs/provider.md,
"What the client will not send".
"""

from __future__ import annotations

import array
import contextlib
import json
import math
import numbers
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from strands_slime.provider.client_errors import SGLangClientError

__all__ = ["InvalidRequestError", "checked_payload", "checked_token_ids", "vocabulary_size"]

INT_PARAMS = frozenset({"max_new_tokens", "min_new_tokens", "top_k", "n", "sampling_seed", "stream_interval"})
FLOAT_PARAMS = frozenset(
    {"temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"}
)
BOOL_PARAMS = frozenset(
    {"ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"}
)
INT_FIELDS = frozenset({"logprob_start_len", "top_logprobs_num", "routed_experts_start_len"})
BOOL_FIELDS = frozenset(
    {"return_logprob", "return_routed_experts", "return_hidden_states", "return_text_in_logprobs", "stream"}
)
"""SGLang 0.5.23's JSON types for the ``sampling_params`` keys and top-level fields that take plain
numbers or booleans (its schema contract refuses any other JSON type with a 400)."""


class InvalidRequestError(SGLangClientError, ValueError):
    """A request the client will not send: an id outside the vocabulary, or a value of a type SGLang
    refuses. Raised before anything goes on the wire; retrying cannot help."""


_SIZES: weakref.WeakKeyDictionary[Any, int | None] = weakref.WeakKeyDictionary()


def vocabulary_size(tokenizer: Any) -> int | None:
    """How many token ids the model behind ``tokenizer`` has: the tokenizer's own count (added tokens
    included), or the model's embedding rows (``vocab_size`` in the ``config.json`` beside the tokenizer
    files, e.g. 151,936 for Qwen3 against 151,669 tokenizer ids) when that is larger; None for an
    object with neither. Remembered per tokenizer (every episode's model asks).
    """
    try:
        return _SIZES[tokenizer]
    except (KeyError, TypeError):
        pass
    size = _vocabulary_size(tokenizer)
    with contextlib.suppress(TypeError):  # not weak-referenceable: computed each time
        _SIZES[tokenizer] = size
    return size


def _vocabulary_size(tokenizer: Any) -> int | None:
    size = max(_int_or_zero(_safe_len(tokenizer)), _int_or_zero(getattr(tokenizer, "vocab_size", 0)))
    directory = getattr(tokenizer, "name_or_path", None)
    if isinstance(directory, str) and directory:
        try:
            config = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            config = None
        if isinstance(config, Mapping):
            size = max(size, _int_or_zero(config.get("vocab_size")))
    return size if size > 0 else None


def _safe_len(value: Any) -> Any:
    try:
        return len(value)
    except TypeError:
        return 0


def _int_or_zero(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def checked_token_ids(ids: Any, vocab_size: int | None = None, check: slice | None = None) -> Any:
    """``ids`` ready for the JSON encoder, with ``ids[check]`` (default: all) verified to be integers in
    ``[0, vocab_size)`` (only ``>= 0`` without a ``vocab_size``).

    A list or ``array`` comes back as it is when nothing needed converting; a numpy array comes back
    as an int64 array; a list holding numpy integers or integral floats comes back as a new list of
    ``int``. Ids outside ``check`` are trusted (sent before, or produced by the server).

    Raises:
        InvalidRequestError: the first bad id, with its position.
    """
    window = check if check is not None else slice(None)
    if isinstance(ids, array.array):
        if ids.typecode in "fd":
            return checked_token_ids(ids.tolist(), vocab_size, check)
        start, stop, step = window.indices(len(ids))
        if start < stop and step > 0:  # an empty window (a model's usual turn) costs no numpy call
            numpy = _numpy()
            _check_range(numpy.frombuffer(ids, dtype=numpy.dtype(ids.typecode)), vocab_size, window)
        return ids
    if type(ids).__module__ == "numpy":
        return _checked_numpy(ids, vocab_size, window)
    if not isinstance(ids, Sequence) or isinstance(ids, (str, bytes)):
        raise InvalidRequestError(f"input_ids must be a sequence of token ids, got {type(ids).__name__}")
    start, stop, step = window.indices(len(ids))
    converted: list[int] | None = None
    for position in range(start, stop, step):
        value = ids[position]
        if type(value) is not int:
            value = _integer(value, f"input_ids[{position}]")
            if converted is None:
                converted = list(ids)
            converted[position] = value
        if value < 0 or (vocab_size is not None and value >= vocab_size):
            raise _out_of_range(position, value, vocab_size)
    return ids if converted is None else converted


def _checked_numpy(ids: Any, vocab_size: int | None, window: slice) -> Any:
    numpy = _numpy()
    values = numpy.asarray(ids)
    if values.ndim != 1:
        raise InvalidRequestError(
            f"input_ids must be one flat sequence of token ids, got shape {values.shape}"
        )
    if values.dtype.kind == "f":
        part = values[window]
        bad = ~numpy.isfinite(part) | (part != numpy.floor(part))
        if bad.any():
            position = range(len(values))[window][int(numpy.argmax(bad))]
            raise InvalidRequestError(
                f"input_ids[{position}] is {float(values[position])!r}: a token id must be an integer"
            )
    elif values.dtype.kind not in "iu":
        raise InvalidRequestError(f"input_ids must hold integers, got a numpy array of {values.dtype}")
    values = values.astype(numpy.int64)
    _check_range(values, vocab_size, window)
    return values


def _check_range(values: Any, vocab_size: int | None, window: slice) -> None:
    numpy = _numpy()
    part = values[window]
    if not len(part) or (part.min() >= 0 and (vocab_size is None or part.max() < vocab_size)):
        return  # every turn: two reductions, no temporary arrays
    bad = part < 0
    if vocab_size is not None:
        bad |= part >= vocab_size
    if bad.any():
        position = range(len(values))[window][int(numpy.argmax(bad))]
        raise _out_of_range(position, int(values[position]), vocab_size)


def _out_of_range(position: int, value: int, vocab_size: int | None) -> InvalidRequestError:
    bound = f"[0, {vocab_size})" if vocab_size is not None else "0 or more"
    return InvalidRequestError(
        f"input_ids[{position}] = {value} is not a token id of this model (must be {bound}); not sent: "
        "SGLang does not check input ids, and an id outside the embedding table crashes its scheduler"
    )


def _numpy() -> Any:
    import numpy  # a dependency of the package; imported on first use only

    return numpy


def _integer(value: Any, where: str) -> int:
    """``value`` as an ``int`` when it is one in another type (numpy integer, integral float)."""
    if isinstance(value, bool) or _is_numpy_bool(value):
        raise InvalidRequestError(f"{where} must be an integer, got the boolean {value!r}")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    raise InvalidRequestError(f"{where} must be an integer, got {value!r} ({type(value).__name__})")


def _real(value: Any, where: str) -> float | int:
    if isinstance(value, bool) or _is_numpy_bool(value) or not isinstance(value, numbers.Real):
        raise InvalidRequestError(f"{where} must be a number, got {value!r} ({type(value).__name__})")
    return value if type(value) in (int, float) else float(value)


def _boolean(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if _is_numpy_bool(value):
        return bool(value)
    raise InvalidRequestError(f"{where} must be true or false, got {value!r} ({type(value).__name__})")


def _is_numpy_bool(value: Any) -> bool:
    return type(value).__name__ in ("bool_", "bool") and type(value).__module__ == "numpy"


def _checked_value(kind: str, value: Any, where: str) -> Any:
    if value is None:
        return None  # null means the default, for SGLang
    if kind == "int":
        return value if type(value) is int else _integer(value, where)
    if kind == "float":
        return _real(value, where)
    if kind == "bool":
        return _boolean(value, where)
    if kind == "ints":  # a list of ids: stop_token_ids, token_ids_logprob
        listlike = isinstance(value, (Sequence, array.array)) or type(value).__module__ == "numpy"
        if isinstance(value, (str, bytes)) or not listlike:
            raise InvalidRequestError(f"{where} must be a list of integers, got {type(value).__name__}")
        return [
            item if type(item) is int else _integer(item, f"{where}[{i}]") for i, item in enumerate(value)
        ]
    if kind == "bias" and isinstance(value, Mapping):  # logit_bias: token id -> a number
        return {str(key): _real(bias, f"{where}[{key!r}]") for key, bias in value.items()}
    return value


_BODY_KINDS = {
    **dict.fromkeys(INT_FIELDS, "int"),
    **dict.fromkeys(BOOL_FIELDS, "bool"),
    "token_ids_logprob": "ints",
}
_PARAM_KINDS = {
    **dict.fromkeys(INT_PARAMS, "int"),
    **dict.fromkeys(FLOAT_PARAMS, "float"),
    **dict.fromkeys(BOOL_PARAMS, "bool"),
    "stop_token_ids": "ints",
    "logit_bias": "bias",
}
"""What each field of the body and of its ``sampling_params`` holds, as :func:`_checked_value` checks it."""
_EXACT_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,)}
"""The Python types a kind takes as they are (``bool`` is not an ``int`` here); lists and biases are
always checked."""


def _plain(values: Mapping[str, Any], kinds: Mapping[str, str]) -> bool:
    """Whether every typed field of ``values`` already has its exact type or is None: the usual request,
    checked without a copy."""
    for name, value in values.items():
        kind = kinds.get(name)
        if kind is not None and value is not None and type(value) not in _EXACT_TYPES.get(kind, ()):
            return False
    return True


def checked_payload(payload: Mapping[str, Any]) -> dict[str, Any]:
    """``payload`` (the ``/generate`` body less ``input_ids``) with numbers of another type converted to
    the JSON type SGLang accepts, and ``logit_bias`` values made floats.

    Raises:
        InvalidRequestError: a value that is not of its field's type (e.g. ``return_logprob=1``,
            ``max_new_tokens=2.5``), naming the field.
    """
    params = payload.get("sampling_params")
    nested = isinstance(params, Mapping)
    if _plain(payload, _BODY_KINDS) and (not nested or _plain(params, _PARAM_KINDS)):
        return dict(payload)
    out = dict(payload)
    for name, value in payload.items():
        kind = _BODY_KINDS.get(name)
        if kind is not None:
            out[name] = _checked_value(kind, value, name)
    if nested:
        out["sampling_params"] = checked_sampling_params(params)
    return out


def checked_sampling_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """``sampling_params`` converted as :func:`checked_payload` describes."""
    out = dict(params)
    for name, value in params.items():
        kind = _PARAM_KINDS.get(name)
        if kind is not None:
            out[name] = _checked_value(kind, value, f"sampling_params.{name}")
    return out
