"""The token trajectory of one episode: ids, loss mask and rollout logprobs, append-only.

All invariants live here: the three arrays have equal length; prompt/tool tokens have mask 0 and
logprob 0.0; model output tokens have mask 1 and the server's logprobs; segments concatenate to the
token ids. Turns can be rolled back as a whole when Strands re-runs a model call.

The ids, mask and logprobs are ``array.array`` objects, not lists: a thousand live episodes of 8k-32k
tokens held as lists are tens of millions of slots (and a float object per logprob) that every full
pass of the cyclic garbage collector walks, pausing the event loop that all rollouts share. The
collector sees an array as one object with one reference (its type, CPython >= 3.10 tracks arrays for
that alone), whatever its length, and it stores 13 bytes per token. What leaves the trajectory (slime's
``Sample``, JSON, the viewer) is a plain list.

They are :class:`TokenArray` objects: arrays that also compare equal to a list or tuple of the same values
(and whose slices and copies are ``TokenArray`` too), so code written against the seed's list API
(``model.trajectory.token_ids == [...]``) keeps meaning what it says.
"""

from __future__ import annotations

import math
import struct
import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

SegmentKind = Literal["prompt", "output"]

REPLAY_META_KEYS = frozenset(
    {
        "id",
        "finish_reason",
        "weight_version",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "e2e_latency",
        "spec_accept_token_num",
        "spec_draft_token_num",
        "spec_verify_ct",
        "top_p_token_ids",
        "top_p_kept_token_ids",
        "top_p_token_offsets",
        "top_p_kept_token_offsets",
        "routed_experts",
        "routed_experts_start_len",
    }
)
"""The parts of a model call's SGLang ``meta_info`` that slime's ``Sample.append_response_tokens``
reads; kept per output segment so the sample can be rebuilt call by call (logprob lists are not)."""


@dataclass(slots=True)
class Segment:
    """A run of tokens from one source: the prompt renderer or the model."""

    kind: SegmentKind
    start: int
    length: int
    meta_info: dict[str, Any] | None = None
    """For an output segment: the replayable part of its model call's ``meta_info``."""

    @property
    def is_output(self) -> bool:
        """Whether the model produced these tokens (mask 1)."""
        return self.kind == "output"


@dataclass(slots=True)
class _Checkpoint:
    token_count: int
    segment_count: int


TOKEN_ID_TYPECODE = "i"
"""``array`` typecode of token ids: a 4-byte signed C int (vocabulary ids are below 2**31)."""
LOSS_MASK_TYPECODE = "b"
"""``array`` typecode of the loss mask: one signed byte per token (0 or 1)."""
LOGPROB_TYPECODE = "d"
"""``array`` typecode of logprobs: a C double, so the server's float64 values are kept exactly."""

MAX_TOKEN_ID = 2**31 - 1
"""The largest token id a trajectory stores (the range of :data:`TOKEN_ID_TYPECODE`)."""

_ZERO_LOGPROB_BYTES = array(LOGPROB_TYPECODE, [0.0]).tobytes()
_SIGN_BYTE = 3 if sys.byteorder == "little" else 0
"""Which byte of a 4-byte int holds its top (sign) bit."""
if array(TOKEN_ID_TYPECODE).itemsize != 4 or array("I").itemsize != 4:
    raise ImportError("strands_slime needs 4-byte C ints (array typecodes 'i' and 'I')")


class TokenArray(array):  # type: ignore[type-arg]
    """An ``array.array`` of per-token values that behaves like the list it stands for where a list user
    would notice: it equals a list or tuple holding the same values (``[1, 2] == TokenArray("i", [1, 2])``),
    and its slices, copies and concatenations are ``TokenArray`` again. Everything else is ``array``'s
    (``.tolist()``, the buffer protocol, pickling)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        """Equal to an array of equal values, or to a list/tuple of the same values in the same order."""
        if isinstance(other, array):
            return array.__eq__(self, other)
        if isinstance(other, (list, tuple)):
            return len(self) == len(other) and self.tolist() == list(other)
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        """The negation of :meth:`__eq__`."""
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # type: ignore[assignment]

    def __getitem__(self, index: Any) -> Any:
        """An item, or for a slice a ``TokenArray``."""
        item = array.__getitem__(self, index)
        return TokenArray(self.typecode, item) if isinstance(index, slice) else item

    def __add__(self, other: Any) -> TokenArray:
        """The concatenation with an array, list or tuple, as a ``TokenArray``."""
        joined = TokenArray(self.typecode, self)
        joined.extend(other)
        return joined

    def __copy__(self) -> TokenArray:
        """A ``TokenArray`` copy."""
        return TokenArray(self.typecode, self)

    def __deepcopy__(self, memo: Any) -> TokenArray:
        """A ``TokenArray`` copy (the values are plain numbers)."""
        return TokenArray(self.typecode, self)


def _empty(typecode: str) -> TokenArray:
    return TokenArray(typecode)


def token_array(token_ids: Iterable[int]) -> array[int]:
    """``token_ids`` as an ``array('i')``, checked before anything is stored.

    Raises:
        ValueError: an id is negative or above :data:`MAX_TOKEN_ID`.
        TypeError: an id is not an integer."""
    if isinstance(token_ids, array) and token_ids.typecode == TOKEN_ID_TYPECODE:
        unsigned = token_ids  # a copy is made below: the caller's array stays the caller's
    else:
        if not isinstance(token_ids, Sequence):
            token_ids = list(token_ids)  # the error message walks the ids a second time
        try:  # 'I' converts ~3x faster than 'i' and refuses negative ids itself
            unsigned = array("I", token_ids)
        except OverflowError:
            raise ValueError(_out_of_range(token_ids)) from None
        except TypeError as exc:
            raise TypeError(f"token ids must be integers: {exc}") from None
    raw = unsigned.tobytes()
    if not raw[_SIGN_BYTE::4].isascii():  # a top bit is set: an id >= 2**31 (or < 0)
        raise ValueError(_out_of_range(token_ids))
    ids = array(TOKEN_ID_TYPECODE)
    ids.frombytes(raw)  # the same bits: every id is below 2**31
    return ids


def _out_of_range(token_ids: Iterable[int]) -> str:
    bad = [int(i) for i in token_ids if not 0 <= int(i) <= MAX_TOKEN_ID][:5]
    return f"token ids must be in [0, {MAX_TOKEN_ID}]; got {bad}"


def _logprob_array(values: Iterable[float]) -> array[float]:
    """``values`` as an ``array('d')``.

    Raises:
        TypeError: a value is not a real number."""
    try:
        return array(LOGPROB_TYPECODE, values)
    except TypeError as exc:
        raise TypeError(f"logprobs must be real numbers: {exc}") from None


def _packed_logprobs(logprobs: Sequence[float | None]) -> array[float] | None:
    """The common case at C speed: ``logprobs`` as an ``array('d')`` when every value is a number
    (NaN included), None when one is not (a null: see :func:`_logprobs_with_gaps`). Packing with
    ``struct`` is ~2x faster than ``array('d', values)``."""
    try:
        packed = struct.pack(f"{len(logprobs)}d", *logprobs)
    except struct.error:
        return None
    values = array(LOGPROB_TYPECODE)
    values.frombytes(packed)
    return values


def _logprobs_with_gaps(logprobs: Iterable[float | None]) -> tuple[array[float], int]:
    """``logprobs`` with each null or NaN stored as ``-inf``, and how many there were.

    Raises:
        TypeError: a value is neither a real number nor null."""
    cleaned: list[float] = []
    missing = 0
    try:
        for value in logprobs:
            if value is None or math.isnan(value):
                missing += 1
                cleaned.append(-math.inf)
            else:
                cleaned.append(value)
    except TypeError as exc:
        raise TypeError(f"logprobs must be real numbers or null: {exc}") from None
    return array(LOGPROB_TYPECODE, cleaned), missing


@dataclass
class TokenTrajectory:
    """Token ids, loss mask and logprobs of one episode (``segments[0]`` is the initial prompt).

    ``token_ids`` is a :class:`TokenArray` of typecode ``'i'``, ``loss_mask`` of ``'b'`` and ``logprobs``
    of ``'d'`` (lists given to the constructor are converted): the garbage collector does not walk their
    elements, and each equals the list of its values. The views that hand data out (:attr:`segments`,
    :meth:`last_output_ids`, :meth:`response_slices`) return lists."""

    token_ids: TokenArray = field(default_factory=lambda: _empty(TOKEN_ID_TYPECODE))
    loss_mask: TokenArray = field(default_factory=lambda: _empty(LOSS_MASK_TYPECODE))
    logprobs: TokenArray = field(default_factory=lambda: _empty(LOGPROB_TYPECODE))
    segment_info: list[Segment] = field(default_factory=list)
    missing_logprobs: int = 0
    """Output positions whose logprob the server returned as null (stored as ``-inf``)."""
    _turns: list[_Checkpoint] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        """Store what was given as the three arrays (lists from older callers are converted); the ids are
        checked (and copied) even when given as an array."""
        self.token_ids = TokenArray(TOKEN_ID_TYPECODE, token_array(self.token_ids))
        if not (isinstance(self.loss_mask, array) and self.loss_mask.typecode == LOSS_MASK_TYPECODE):
            try:
                self.loss_mask = array(LOSS_MASK_TYPECODE, self.loss_mask)
            except (OverflowError, TypeError) as exc:
                raise ValueError(f"the loss mask must hold 0s and 1s: {exc}") from None
        if not isinstance(self.loss_mask, TokenArray):
            self.loss_mask = TokenArray(LOSS_MASK_TYPECODE, self.loss_mask)
        if not (isinstance(self.logprobs, array) and self.logprobs.typecode == LOGPROB_TYPECODE):
            self.logprobs = _logprob_array(self.logprobs)
        if not isinstance(self.logprobs, TokenArray):
            self.logprobs = TokenArray(LOGPROB_TYPECODE, self.logprobs)

    # ------------------------------------------------------------------ views

    def __len__(self) -> int:
        """Tokens in the trajectory."""
        return len(self.token_ids)

    @property
    def segments(self) -> list[list[int]]:
        """Per-segment token lists (seed API)."""
        return [self.token_ids[s.start : s.start + s.length].tolist() for s in self.segment_info]

    @property
    def initial_prompt_length(self) -> int:
        """Tokens of the first prompt (segment 0)."""
        return self.segment_info[0].length if self.segment_info else 0

    @property
    def response_length(self) -> int:
        """Tokens after the initial prompt (what slime's ``response_length`` counts)."""
        return len(self.token_ids) - self.initial_prompt_length

    @property
    def output_token_count(self) -> int:
        """Tokens the model produced, over all output segments."""
        return sum(s.length for s in self.segment_info if s.is_output)

    @property
    def num_outputs(self) -> int:
        """Output segments (one per model call)."""
        return sum(1 for s in self.segment_info if s.is_output)

    @property
    def ends_with_output(self) -> bool:
        """Whether the last segment is model output."""
        return bool(self.segment_info) and self.segment_info[-1].is_output

    def last_output_ids(self) -> list[int]:
        """The ids of the last output segment (empty when there is none)."""
        for segment in reversed(self.segment_info):
            if segment.is_output:
                return self.token_ids[segment.start : segment.start + segment.length].tolist()
        return []

    # ------------------------------------------------------------------ mutation

    def begin_turn(self) -> None:
        """Remember where a model turn starts so it can be rolled back as one unit."""
        self._turns.append(_Checkpoint(len(self.token_ids), len(self.segment_info)))

    def add_prompt(self, token_ids: Sequence[int]) -> None:
        """Append prompt/tool tokens: mask 0, logprob 0.0. An empty sequence adds nothing.

        Raises:
            ValueError, TypeError: an id is not an integer in ``[0, MAX_TOKEN_ID]`` (nothing is added)."""
        if not len(token_ids):
            return
        ids = token_array(token_ids)
        count = len(ids)
        self.segment_info.append(Segment("prompt", len(self.token_ids), count))
        self.token_ids.extend(ids)
        self.loss_mask.frombytes(bytes(count))
        self.logprobs.frombytes(_ZERO_LOGPROB_BYTES * count)

    def add_output(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float | None],
        meta_info: Mapping[str, Any] | None = None,
    ) -> None:
        """Append the model's sampled tokens exactly as returned: mask 1, the server's logprobs, and
        the replayable part of the call's ``meta_info`` (see :data:`REPLAY_META_KEYS`). A null or NaN
        logprob is stored as ``-inf`` and counted in :attr:`missing_logprobs`.

        Raises:
            ValueError: the lengths differ, or an id is outside ``[0, MAX_TOKEN_ID]`` (nothing is added).
            TypeError: an id is not an integer or a logprob not a number (nothing is added)."""
        if len(logprobs) != len(token_ids):
            raise ValueError(f"{len(token_ids)} output tokens but {len(logprobs)} logprobs")
        if not len(token_ids):
            return
        ids = token_array(token_ids)
        missing = 0
        values = _packed_logprobs(logprobs)
        if values is None or math.isnan(sum(logprobs)):  # type: ignore[arg-type]
            values, missing = _logprobs_with_gaps(logprobs)
        replay = None if meta_info is None else {k: v for k, v in meta_info.items() if k in REPLAY_META_KEYS}
        self.segment_info.append(Segment("output", len(self.token_ids), len(ids), replay))
        self.token_ids.extend(ids)
        self.loss_mask.frombytes(b"\x01" * len(ids))
        self.logprobs.extend(values)
        self.missing_logprobs += missing

    def rollback_turns(self, keep: int) -> int:
        """Drop every turn after the first ``keep`` turns; return how many tokens were removed."""
        if keep >= len(self._turns):
            return 0
        checkpoint = self._turns[keep]
        removed = len(self.token_ids) - checkpoint.token_count
        del self.token_ids[checkpoint.token_count :]
        del self.loss_mask[checkpoint.token_count :]
        del self.logprobs[checkpoint.token_count :]
        del self.segment_info[checkpoint.segment_count :]
        del self._turns[keep:]
        return removed

    def turn_start(self, turn: int) -> _Checkpoint:
        """Where turn ``turn`` (0-based) starts: ``token_count`` and ``segment_count`` before it."""
        return self._turns[turn]

    @property
    def turn_count(self) -> int:
        """Model turns begun (see :meth:`begin_turn`)."""
        return len(self._turns)

    def reset(self) -> None:
        """Empty the trajectory for a new episode."""
        self.token_ids = _empty(TOKEN_ID_TYPECODE)
        self.loss_mask = _empty(LOSS_MASK_TYPECODE)
        self.logprobs = _empty(LOGPROB_TYPECODE)
        self.segment_info = []
        self.missing_logprobs = 0
        self._turns = []

    def copy(self) -> TokenTrajectory:
        """An independent copy (arrays and checkpoints copied; ``meta_info`` dicts shared)."""
        return TokenTrajectory(
            token_ids=self.token_ids[:],
            loss_mask=self.loss_mask[:],
            logprobs=self.logprobs[:],
            segment_info=[Segment(s.kind, s.start, s.length, s.meta_info) for s in self.segment_info],
            missing_logprobs=self.missing_logprobs,
            _turns=[_Checkpoint(t.token_count, t.segment_count) for t in self._turns],
        )

    # ------------------------------------------------------------------ resume

    def layout(self) -> dict[str, Any]:
        """The segment and turn structure as plain JSON (no ids, no logprobs, no ``meta_info``): what
        :meth:`from_layout` needs, next to the ids and logprobs a slime ``Sample`` already holds, to
        rebuild the trajectory of an aborted episode (partial rollout)."""
        return {
            "segments": [[s.kind, s.length] for s in self.segment_info],
            "turns": [[t.token_count, t.segment_count] for t in self._turns],
            "missing_logprobs": self.missing_logprobs,
        }

    @classmethod
    def from_layout(
        cls, token_ids: Sequence[int], logprobs: Sequence[float], layout: Mapping[str, Any]
    ) -> TokenTrajectory:
        """A trajectory over ``token_ids`` with the structure :meth:`layout` saved.

        ``logprobs`` are the response's (after the first segment); output segments get mask 1 and
        their logprob, prompt segments mask 0 and 0.0. The restored segments carry no ``meta_info``
        (slime's sample already holds what it was used for).

        Raises:
            ValueError: the layout does not tile ``token_ids`` or is malformed, or an id is out of range.
            TypeError: an id is not an integer or a logprob not a number."""
        segments = [Segment(str(kind), 0, int(length)) for kind, length in layout["segments"]]
        position = 0
        for segment in segments:
            if segment.kind not in ("prompt", "output") or segment.length <= 0:
                raise ValueError(f"bad saved segment {segment.kind!r} of length {segment.length}")
            segment.start = position
            position += segment.length
        if position != len(token_ids) or not segments or segments[0].is_output:
            raise ValueError(f"the saved layout covers {position} tokens, the sample has {len(token_ids)}")
        prompt_len = segments[0].length
        if len(logprobs) != len(token_ids) - prompt_len:
            raise ValueError(f"{len(logprobs)} logprobs for {len(token_ids) - prompt_len} response tokens")
        response_logprobs = _logprob_array(logprobs)
        trajectory = cls(token_ids=token_array(token_ids), segment_info=segments)
        trajectory.missing_logprobs = int(layout.get("missing_logprobs", 0))
        for segment in segments:
            if segment.is_output:
                first = segment.start - prompt_len
                trajectory.loss_mask.frombytes(b"\x01" * segment.length)
                trajectory.logprobs.extend(response_logprobs[first : first + segment.length])
            else:
                trajectory.loss_mask.frombytes(bytes(segment.length))
                trajectory.logprobs.frombytes(_ZERO_LOGPROB_BYTES * segment.length)
        for token_count, segment_count in layout["turns"]:
            if not 0 <= int(segment_count) <= len(segments) or not 0 <= int(token_count) <= position:
                raise ValueError(f"bad saved turn checkpoint ({token_count}, {segment_count})")
            trajectory._turns.append(_Checkpoint(int(token_count), int(segment_count)))
        return trajectory

    # ------------------------------------------------------------------ checks

    def check(self) -> None:
        """Raise AssertionError if any invariant is broken (cheap enough for tests and debugging)."""
        for values, typecode in (
            (self.token_ids, TOKEN_ID_TYPECODE),
            (self.loss_mask, LOSS_MASK_TYPECODE),
            (self.logprobs, LOGPROB_TYPECODE),
        ):
            assert isinstance(values, array) and values.typecode == typecode, f"not an array({typecode!r})"
        n = len(self.token_ids)
        assert len(self.loss_mask) == n == len(self.logprobs), "ids, mask and logprobs differ in length"
        position = 0
        for segment in self.segment_info:
            assert segment.start == position and segment.length > 0, "segments must tile the ids"
            mask = 1 if segment.is_output else 0
            end = segment.start + segment.length
            assert self.loss_mask[segment.start : end].count(mask) == segment.length, (
                "mask disagrees with segment"
            )
            if not segment.is_output:
                assert self.logprobs[segment.start : end].count(0.0) == segment.length, "prompt logprob != 0"
            position = end
        assert position == n, "segments do not cover the ids"
        assert not self.segment_info or not self.segment_info[0].is_output, "segment 0 must be the prompt"

    def response_slices(self) -> tuple[list[int], list[int], list[float]]:
        """``(response ids, loss mask, logprobs)`` after the initial prompt as lists, for slime's Sample."""
        start = self.initial_prompt_length
        return (
            self.token_ids[start:].tolist(),
            self.loss_mask[start:].tolist(),
            self.logprobs[start:].tolist(),
        )


def mask_runs(mask: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(value, start, end)`` for each run of equal loss-mask values: model outputs are the 1-runs."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((mask[start], start, i))
            start = i
    return runs


TokenManager = TokenTrajectory
"""Seed name (strands-sglang 0.2.x ``model.token_manager``)."""
