"""What we use of slime, with faithful stand-ins when slime is not installed (CLI, tests).

slime is never a dependency: in its GPU image the real classes are used; elsewhere the stand-ins
below mirror the fields, the ``Status`` enum and ``to_dict``/``from_dict`` of ``slime.utils.types``.
"""

from __future__ import annotations

import array
import base64
import dataclasses
import functools
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from strands_slime.runtime import get_runtime

logger = logging.getLogger(__name__)

_TOP_P_TOKEN_ID_META_KEYS = ("top_p_token_ids", "top_p_kept_token_ids")
_TOP_P_TOKEN_OFFSET_META_KEYS = ("top_p_token_offsets", "top_p_kept_token_offsets")


def decode_int32_meta_array(meta_info: Mapping[str, Any], keys: str | Iterable[str]) -> list[int] | None:
    """slime's ``decode_int32_meta_array`` without torch: the first of ``keys`` in ``meta_info`` as ints.

    SGLang sends these arrays as base64 of native int32 bytes (or as plain JSON lists)."""
    for key in (keys,) if isinstance(keys, str) else keys:
        if key in meta_info:
            value = meta_info[key]
            break
    else:
        return None
    if value is None:
        return None
    if isinstance(value, str):
        value = base64.b64decode(value.encode("ascii"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        decoded = array.array("i")
        if decoded.itemsize != 4:  # pragma: no cover - every platform slime runs on has 4-byte int
            raise RuntimeError("array('i') is not 32-bit on this platform")
        decoded.frombytes(bytes(value))
        return decoded.tolist()
    return _int_list(value)


def flatten(items: Iterable[Any]) -> list[Any]:
    """The leaves of nested lists and tuples: the samples of a batch or a group (a fanned-out episode
    is a list of samples), or the values of a nested array."""
    flat: list[Any] = []
    for item in items:
        if isinstance(item, (list, tuple)):
            flat.extend(flatten(item))
        else:
            flat.append(item)
    return flat


def _int_list(values: Any) -> list[int]:
    if values is None:
        return []
    if hasattr(values, "tolist"):
        values = values.tolist()
    return [int(item) for item in flatten([values])]


def _top_p_span_data(
    meta_info: Mapping[str, Any], new_token_count: int
) -> tuple[list[int], list[int]] | None:
    token_ids = decode_int32_meta_array(meta_info, _TOP_P_TOKEN_ID_META_KEYS)
    offsets = decode_int32_meta_array(meta_info, _TOP_P_TOKEN_OFFSET_META_KEYS)
    if token_ids is None and offsets is None:
        return None
    if token_ids is None or offsets is None:
        raise ValueError("SGLang top-p token replay must include both token ids and offsets.")
    if not offsets or offsets[0] != 0:
        raise ValueError(f"SGLang top-p token offsets must start with 0, got {offsets[:1]}.")
    if offsets[-1] != len(token_ids):
        raise ValueError(
            f"SGLang top-p token ids/offsets mismatch: offsets[-1]={offsets[-1]}, len(token_ids)={len(token_ids)}."
        )
    if len(offsets) != new_token_count + 1:
        raise ValueError(
            "SGLang top-p token offsets length must equal generated token count + 1: "
            f"len(offsets)={len(offsets)}, generated={new_token_count}."
        )
    return token_ids, offsets


class _Counters:
    """``to_dict``/``from_dict`` of slime's per-sample counter dataclasses."""

    def to_dict(self) -> dict[str, int]:
        """The fields as slime serialises them."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        """Rebuild from ``to_dict``'s output (missing counters read as 0)."""
        return cls(**{key: data.get(key, 0) for key in cls.__dataclass_fields__})


@dataclass
class SpecInfo(_Counters):
    """``Sample.SpecInfo``: speculative-decoding counters summed over the episode's model calls."""

    spec_accept_token_num: int = 0
    spec_draft_token_num: int = 0
    spec_verify_ct: int = 0
    completion_token_num: int = 0

    @property
    def spec_accept_rate(self) -> float:
        """Accepted draft tokens per draft token (slime's ``SpecInfo``); 0 without speculation."""
        return (
            self.spec_accept_token_num / self.spec_draft_token_num if self.spec_draft_token_num > 0 else 0.0
        )

    @property
    def spec_accept_length(self) -> float:
        """Completion tokens per verify step (slime's ``SpecInfo``); 0 without speculation."""
        return self.completion_token_num / self.spec_verify_ct if self.spec_verify_ct > 0 else 0.0

    def add(self, meta_info: Mapping[str, Any]) -> None:
        """Add one ``/generate`` reply's ``meta_info`` counters, as slime's own generate does."""
        self.spec_accept_token_num += meta_info.get("spec_accept_token_num", 0)
        self.spec_draft_token_num += meta_info.get("spec_draft_token_num", 0)
        self.spec_verify_ct += meta_info.get("spec_verify_ct", 0)
        self.completion_token_num += meta_info.get("completion_tokens", 0)


@dataclass
class PrefixCacheInfo(_Counters):
    """``Sample.PrefixCacheInfo``: prompt and prefix-cache-hit tokens summed over the model calls."""

    cached_tokens: int = 0
    total_prompt_tokens: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Cached prompt tokens per prompt token; 0 before the first request."""
        return self.cached_tokens / self.total_prompt_tokens if self.total_prompt_tokens > 0 else 0.0

    def add(self, meta_info: Mapping[str, Any]) -> None:
        """Add one ``/generate`` reply's ``meta_info`` counters, as slime's own generate does."""
        self.cached_tokens += meta_info.get("cached_tokens", 0)
        self.total_prompt_tokens += meta_info.get("prompt_tokens", 0)


@dataclass
class Sample:
    """Stand-in for ``slime.utils.types.Sample``: the same fields, ``Status``, ``to_dict``/``from_dict``
    and ``append_response_tokens`` rules, with lists where slime uses torch tensors."""

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    SpecInfo = SpecInfo
    PrefixCacheInfo = PrefixCacheInfo

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: list[int] | None = None
    rollout_top_p_token_offsets: list[int] | None = None
    rollout_routed_experts: list[list[list[int]]] | None = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None
    status: Sample.Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict[str, Any] | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0
    spec_info: SpecInfo = field(default_factory=SpecInfo)
    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    def to_dict(self) -> dict[str, Any]:
        """The fields as slime serialises them."""
        value = self.__dict__.copy()
        value["status"] = self.status.value
        value["spec_info"] = self.spec_info.to_dict()
        value["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        return value

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Sample:
        """Rebuild from ``to_dict``'s output (missing counters read as 0)."""
        data = dict(data)
        data["status"] = Sample.Status(data.get("status", "pending"))
        data["spec_info"] = SpecInfo.from_dict(data.get("spec_info") or {})
        data["prefix_cache_info"] = PrefixCacheInfo.from_dict(data.get("prefix_cache_info") or {})
        names = set(Sample.__dataclass_fields__)
        sample = Sample(**{k: v for k, v in data.items() if k in names})
        for key, value in data.items():
            if key not in names:
                setattr(sample, key, value)
        return sample

    def get_reward_value(self, args: Any) -> Any:
        """The reward, or ``reward[args.reward_key]`` when slime's ``--reward-key`` is set (as slime's ``Sample``)."""
        key = getattr(args, "reward_key", None)
        return self.reward[key] if key and isinstance(self.reward, dict) else self.reward

    @property
    def effective_response_length(self) -> int:
        """Tokens that train (the loss mask's sum), as slime's ``Sample`` counts them."""
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length

    def append_response_tokens(
        self,
        args: Any = None,
        *,
        tokens: Any = None,
        log_probs: Any = None,
        trainable: bool = True,
        meta_info: Mapping[str, Any] | None = None,
        text: str | None = None,
        update_terminal_info: bool = True,
    ) -> None:
        """slime's rule: model tokens (``trainable``) carry logprobs and SGLang ``meta_info``; tool and
        template tokens get mask 0, logprob 0.0 and an empty top-p span. Lengths are checked after."""
        tokens = _int_list(tokens)
        if log_probs is not None:
            log_probs = [
                float(value) for value in (log_probs.tolist() if hasattr(log_probs, "tolist") else log_probs)
            ]
        if log_probs is not None and len(log_probs) != len(tokens):
            raise ValueError(f"log_probs length {len(log_probs)} != tokens length {len(tokens)}")
        if tokens and trainable and log_probs is None:
            raise ValueError("trainable response tokens require rollout log probabilities.")
        if tokens and not trainable:
            if log_probs is not None:
                raise ValueError("non-trainable response tokens should not pass rollout log probabilities.")
            log_probs = [0.0] * len(tokens)
        if text is not None:
            self.response += text
        previous = self.response_length
        if tokens:
            self.tokens += tokens
            self.response_length += len(tokens)
            if self.loss_mask is None:
                self.loss_mask = [1] * previous
            self.loss_mask += [1 if trainable else 0] * len(tokens)
        if log_probs is not None:
            if self.rollout_log_probs is None:
                if trainable and previous:
                    raise ValueError(
                        "Cannot append trainable rollout log probabilities to a sample with existing response "
                        "tokens but no existing rollout_log_probs."
                    )
                self.rollout_log_probs = [0.0] * previous
            self.rollout_log_probs += log_probs
        pad_top_p = bool(tokens and not trainable)
        if meta_info is not None or pad_top_p:
            self._apply_meta_info(
                args,
                meta_info or {},
                new_token_count=len(tokens),
                pad_missing_top_p=pad_top_p,
                update_terminal_info=update_terminal_info,
            )
        self._validate_response_metadata_lengths()

    def _apply_meta_info(
        self,
        args: Any,
        meta_info: Mapping[str, Any],
        *,
        new_token_count: int = 0,
        pad_missing_top_p: bool = False,
        update_terminal_info: bool = True,
    ) -> None:
        applied_top_p = False
        if new_token_count:
            top_p = _top_p_span_data(meta_info, new_token_count)
            if top_p is not None:
                applied_top_p = True
                ids, offsets = top_p
                if self.rollout_top_p_token_ids is None and self.rollout_top_p_token_offsets is None:
                    self.rollout_top_p_token_ids, self.rollout_top_p_token_offsets = ids, offsets
                else:
                    base_ids = _int_list(self.rollout_top_p_token_ids)
                    base_offsets = _int_list(self.rollout_top_p_token_offsets) or [0]
                    shift = base_offsets[-1]
                    self.rollout_top_p_token_ids = base_ids + ids
                    self.rollout_top_p_token_offsets = base_offsets + [shift + o for o in offsets[1:]]
        if (
            pad_missing_top_p
            and new_token_count
            and self.rollout_top_p_token_offsets is not None
            and not applied_top_p
        ):
            if self.rollout_top_p_token_ids is None:
                raise ValueError("Cannot append empty top-p spans without existing token ids and offsets.")
            offsets = _int_list(self.rollout_top_p_token_offsets)
            if not offsets:
                raise ValueError("Cannot append empty top-p spans to empty offsets.")
            self.rollout_top_p_token_ids = _int_list(self.rollout_top_p_token_ids)
            self.rollout_top_p_token_offsets = offsets + [offsets[-1]] * new_token_count

        routed = decode_int32_meta_array(meta_info, "routed_experts")
        if routed is not None:
            self._apply_routed_experts(args, meta_info, routed)

        if not update_terminal_info or "finish_reason" not in meta_info:
            return
        if getattr(args, "sglang_speculative_algorithm", False):
            self.spec_info.add(meta_info)
        self.prefix_cache_info.add(meta_info)
        if "weight_version" in meta_info:
            self.weight_versions.append(meta_info["weight_version"])
        finish = meta_info["finish_reason"]["type"]
        if finish in _FINISH_STATUS:
            self.status = getattr(Sample.Status, _FINISH_STATUS[finish])

    def _apply_routed_experts(self, args: Any, meta_info: Mapping[str, Any], routed: list[int]) -> None:
        if args is None:
            raise ValueError("args is required to decode routed experts metadata.")
        start = int(meta_info.get("routed_experts_start_len", 0) or 0)
        if start < 0:
            raise ValueError(f"SGLang routed_experts_start_len must be non-negative, got {start}.")
        layers, topk = int(args.num_layers), int(args.moe_router_topk)
        rows = max(0, len(self.tokens) - 1 - start)
        if len(routed) != rows * layers * topk:
            raise ValueError(
                "SGLang routed_experts element count does not match sample tokens: "
                f"got={len(routed)}, expected={rows * layers * topk} (tokens={len(self.tokens)}, "
                f"routed_experts_start_len={start}, num_layers={layers}, moe_router_topk={topk})."
            )
        per_row = layers * topk
        shaped = [
            [routed[r * per_row + layer * topk : r * per_row + (layer + 1) * topk] for layer in range(layers)]
            for r in range(rows)
        ]
        if start == 0:
            self.rollout_routed_experts = shaped
            return
        existing = self.rollout_routed_experts
        if existing is None:
            raise ValueError(
                "Cannot append partial routed experts without existing routed experts "
                f"(routed_experts_start_len={start})."
            )
        existing = existing.tolist() if hasattr(existing, "tolist") else list(existing)
        if len(existing) < start:
            raise ValueError(
                "Existing routed experts shorter than routed_experts_start_len: "
                f"existing_rows={len(existing)}, routed_experts_start_len={start}."
            )
        self.rollout_routed_experts = existing[:start] + shaped

    def _validate_response_metadata_lengths(self) -> None:
        if self.loss_mask is not None and len(self.loss_mask) != self.response_length:
            raise ValueError(
                f"loss_mask length {len(self.loss_mask)} != response_length {self.response_length}"
            )
        if self.rollout_log_probs is not None and len(self.rollout_log_probs) != self.response_length:
            raise ValueError(
                f"rollout_log_probs length {len(self.rollout_log_probs)} != response_length {self.response_length}"
            )
        if self.rollout_top_p_token_ids is None and self.rollout_top_p_token_offsets is None:
            return
        if self.rollout_top_p_token_ids is None or self.rollout_top_p_token_offsets is None:
            raise ValueError("rollout top-p replay must include both token ids and offsets.")
        offsets = _int_list(self.rollout_top_p_token_offsets)
        if len(offsets) != self.response_length + 1:
            raise ValueError(
                "rollout_top_p_token_offsets length must equal response_length + 1: "
                f"len(offsets)={len(offsets)}, response_length={self.response_length}."
            )
        count = len(_int_list(self.rollout_top_p_token_ids))
        if offsets[-1] != count:
            raise ValueError(
                f"rollout top-p token ids/offsets mismatch: offsets[-1]={offsets[-1]}, len(token_ids)={count}."
            )


_FINISH_STATUS = {"length": "TRUNCATED", "abort": "ABORTED", "stop": "COMPLETED"}


@functools.lru_cache(maxsize=1)
def sample_class() -> type:
    """slime's ``Sample`` when slime is importable, else our stand-in."""
    try:
        from slime.utils.types import Sample as SlimeSample
    except ImportError:
        return Sample
    return SlimeSample


def status(sample: Any, name: str) -> Any:
    """The ``Status`` member ``name`` of the sample's own class (slime's or ours)."""
    enum = getattr(type(sample), "Status", None) or Sample.Status
    return getattr(enum, name)


def status_name(sample: Any) -> str:
    """A sample's status as a plain name (``completed``, ``aborted``, ...), for slime's or our ``Sample``."""
    value = getattr(sample, "status", None)
    return str(getattr(value, "value", value) or "pending")


_IMPORT_ERROR = "slime_compat: GenerateState import error"
"""``Runtime.state`` key: why slime's ``GenerateState`` could not be imported (absent: not tried, or imported)."""
_DETACHED = "slime_compat: detached from GenerateState"
"""``Runtime.state`` key, present in an episode executor's worker process."""
_TRACING = "slime_compat: tracing helpers"
"""``Runtime.state`` key: slime's tracing helpers once looked up (None: slime has none)."""


def _generate_state_class() -> Any | None:
    """slime's ``GenerateState``. A failed import costs ~0.1 ms, too much per episode: it is tried once,
    and again only if someone imported (or stubbed) slime's module since."""
    module = sys.modules.get("slime.rollout.sglang_rollout")
    if module is not None:
        return getattr(module, "GenerateState", None)
    state = get_runtime().state
    if _IMPORT_ERROR in state:
        return None
    try:
        from slime.rollout.sglang_rollout import GenerateState
    except ImportError as exc:
        state[_IMPORT_ERROR] = f"cannot import slime.rollout.sglang_rollout: {type(exc).__name__}: {exc}"
        return None
    return GenerateState


def detach_from_generate_state() -> None:
    """Never use slime's ``GenerateState`` in this process (an episode executor's worker): building it
    here would load a second tokenizer and give a flag slime never sets; the worker's own abort flag
    (``args.abort_event``) and tokenizer stand in."""
    get_runtime().state[_DETACHED] = True


def _slime_generate_state(args: Any) -> Any | None:
    if _DETACHED in get_runtime().state:
        return None
    state_class = _generate_state_class()
    if state_class is None:
        return None
    try:
        return state_class(args)
    except Exception as exc:  # slime present but not set up (e.g. outside a rollout actor)
        _warn_abort_off_once(f"slime's GenerateState(args) raised {type(exc).__name__}: {exc}")
        return None


@dataclass(frozen=True)
class AbortFlag:
    """The abort flag an episode watches, and where it comes from.

    Attributes:
        check: True once the rollout is aborted.
        source: ``slime`` (``GenerateState(args).aborted``), ``abort_event`` (``args.abort_event``) or
            ``off`` (nothing can abort the episode; logged once per process with the cause).
    """

    check: Callable[[], bool]
    source: str


def _never_aborted() -> bool:
    return False


def _abort_off_key(cause: str) -> str:
    return f"abort detection off: {cause}"


def _warn_abort_off_once(cause: str, *, level: int = logging.WARNING) -> None:
    """One log line per process and cause: without a flag, slime's abort cannot stop an episode."""
    if not get_runtime().first_time(_abort_off_key(cause)):
        return
    logger.log(
        level,
        "strands_slime abort detection is off: %s; an aborted rollout's episodes run to their end "
        "(metadata.abort_detection = 'off')",
        cause,
    )


def abort_flag(args: Any) -> AbortFlag:
    """The flag that is True once slime aborted this rollout, and its source.

    slime's flag is ``GenerateState(args).aborted``. Without slime, ``args.abort_event`` (a
    ``threading.Event``/``asyncio.Event`` or a zero-argument callable) plays that role for the CLI
    and tests. Without either, detection is ``off``: logged once per process (a WARNING when slime is
    installed but its flag cannot be read) and counted in ``metadata.abort_detection``.

    Raises:
        TypeError: ``args.abort_event`` is neither an event nor a callable.
    """
    state = _slime_generate_state(args)
    if state is not None:
        if hasattr(state, "aborted"):
            return AbortFlag(_state_aborted(state), "slime")
        _warn_abort_off_once(
            f"slime's {type(state).__name__} has no 'aborted' attribute (strands_slime targets THUDM/slime "
            "624b824 or later)"
        )
    event = getattr(args, "abort_event", None)
    if event is None:
        if state is None:
            _log_missing_slime_flag()
        return AbortFlag(_never_aborted, "off")
    if isinstance(event, threading.Event) or hasattr(event, "is_set"):
        return AbortFlag(event.is_set, "abort_event")
    if callable(event):
        return AbortFlag(lambda: bool(event()), "abort_event")
    raise TypeError(f"args.abort_event must be an Event or a callable, got {type(event).__name__}")


def _log_missing_slime_flag() -> None:
    """Say once why slime's flag is missing: a WARNING when slime is installed (its import or its
    ``GenerateState`` is broken), an INFO line when it is not (an offline run without an abort event)."""
    module = sys.modules.get("slime.rollout.sglang_rollout")
    if module is not None and getattr(module, "GenerateState", None) is None:
        _warn_abort_off_once("slime.rollout.sglang_rollout has no GenerateState")
        return
    import_error = get_runtime().state.get(_IMPORT_ERROR)
    if import_error is not None and _abort_off_key(import_error) not in get_runtime().logged:
        slime_installed = importlib.util.find_spec("slime") is not None
        _warn_abort_off_once(import_error, level=logging.WARNING if slime_installed else logging.INFO)


def abort_check(args: Any) -> Callable[[], bool]:
    """``abort_flag(args).check``: a callable that is True once slime aborted this rollout."""
    return abort_flag(args).check


@functools.lru_cache(maxsize=8)
def _state_aborted(state: Any) -> Callable[[], bool]:
    """One callable per ``GenerateState``: the client's abort watcher reads each distinct flag once."""
    return lambda: bool(getattr(state, "aborted", False))


def slime_tokenizer(args: Any) -> Any | None:
    """The tokenizer slime itself uses (``GenerateState(args).tokenizer``), when slime is there."""
    state = _slime_generate_state(args)
    return getattr(state, "tokenizer", None) if state is not None else None


def _slime_tracing() -> tuple[type, Any, Any] | None:
    """slime's tracing helpers, looked up once slime's ``Sample`` type is loaded (before that no slime
    sample can exist, and a failed import would search ``sys.path`` again on every episode); a slime
    without them is remembered as such."""
    state = get_runtime().state
    if _TRACING not in state:
        if "slime.utils.types" not in sys.modules:
            return None
        try:
            from slime.observability.trace_utils import build_sglang_meta_trace_attrs, trace_span
            from slime.utils.types import Sample as SlimeSample
        except ImportError:
            state[_TRACING] = None
        else:
            state[_TRACING] = (SlimeSample, trace_span, build_sglang_meta_trace_attrs)
    return state[_TRACING]


def request_trace(sample: Any) -> Callable[[Mapping[str, Any]], Any] | None:
    """A ``request_trace`` for :class:`~strands_slime.provider.model.SGLangModel` recording each ``/generate``
    call as slime's own generate does (a ``sglang_generate`` span on the sample, which slime's
    ``perf/request/*`` metrics read); None without slime or for a stand-in sample."""
    tracing = _slime_tracing()
    if tracing is None or not isinstance(sample, tracing[0]):
        return None
    _, trace_span, meta_attrs = tracing

    @contextmanager
    def span(params: Mapping[str, Any]) -> Iterator[Callable[[Mapping[str, Any]], None]]:
        with trace_span(
            sample, "sglang_generate", attrs={"max_new_tokens": params.get("max_new_tokens")}
        ) as ctx:
            update = getattr(ctx, "update", None)
            yield lambda meta: update(meta_attrs(dict(meta))) if update is not None else None

    return span
