"""The token trajectory of one episode: ids, loss mask and rollout logprobs, append-only.

All invariants live here: the three lists have equal length; prompt/tool tokens have mask 0 and
logprob 0.0; model output tokens have mask 1 and the server's logprobs; segments concatenate to the
token ids. Turns can be rolled back as a whole when Strands re-runs a model call.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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


@dataclass
class TokenTrajectory:
    """Token ids, loss mask and logprobs of one episode (``segments[0]`` is the initial prompt)."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    segment_info: list[Segment] = field(default_factory=list)
    missing_logprobs: int = 0
    """Output positions whose logprob the server returned as null (stored as ``-inf``)."""
    _turns: list[_Checkpoint] = field(default_factory=list, repr=False)

    # ------------------------------------------------------------------ views

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def segments(self) -> list[list[int]]:
        """Per-segment token lists (seed API)."""
        return [self.token_ids[s.start : s.start + s.length] for s in self.segment_info]

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
                return self.token_ids[segment.start : segment.start + segment.length]
        return []

    # ------------------------------------------------------------------ mutation

    def begin_turn(self) -> None:
        """Remember where a model turn starts so it can be rolled back as one unit."""
        self._turns.append(_Checkpoint(len(self.token_ids), len(self.segment_info)))

    def add_prompt(self, token_ids: list[int]) -> None:
        """Append prompt/tool tokens: mask 0, logprob 0.0. An empty list adds nothing."""
        if not token_ids:
            return
        self.segment_info.append(Segment("prompt", len(self.token_ids), len(token_ids)))
        self.token_ids.extend(token_ids)
        self.loss_mask.extend([0] * len(token_ids))
        self.logprobs.extend([0.0] * len(token_ids))

    def add_output(
        self,
        token_ids: list[int],
        logprobs: list[float | None],
        meta_info: Mapping[str, Any] | None = None,
    ) -> None:
        """Append the model's sampled tokens exactly as returned: mask 1, the server's logprobs, and
        the replayable part of the call's ``meta_info`` (see :data:`REPLAY_META_KEYS`)."""
        if len(logprobs) != len(token_ids):
            raise ValueError(f"{len(token_ids)} output tokens but {len(logprobs)} logprobs")
        if not token_ids:
            return
        if None not in logprobs and not math.isnan(sum(logprobs)):  # type: ignore[arg-type]
            clean = logprobs  # the common case, checked at C speed (a NaN makes the sum NaN)
        else:
            clean = []
            for value in logprobs:
                if value is None or math.isnan(value):
                    self.missing_logprobs += 1
                    clean.append(-math.inf)
                else:
                    clean.append(float(value))
        replay = None if meta_info is None else {k: v for k, v in meta_info.items() if k in REPLAY_META_KEYS}
        self.segment_info.append(Segment("output", len(self.token_ids), len(token_ids), replay))
        self.token_ids.extend(token_ids)
        self.loss_mask.extend([1] * len(token_ids))
        self.logprobs.extend(clean)

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
        self.token_ids = []
        self.loss_mask = []
        self.logprobs = []
        self.segment_info = []
        self.missing_logprobs = 0
        self._turns = []

    def copy(self) -> TokenTrajectory:
        """An independent copy (lists and checkpoints copied; ``meta_info`` dicts shared)."""
        return TokenTrajectory(
            token_ids=list(self.token_ids),
            loss_mask=list(self.loss_mask),
            logprobs=list(self.logprobs),
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
        cls, token_ids: list[int], logprobs: list[float], layout: Mapping[str, Any]
    ) -> TokenTrajectory:
        """A trajectory over ``token_ids`` with the structure :meth:`layout` saved.

        ``logprobs`` are the response's (after the first segment); output segments get mask 1 and
        their logprob, prompt segments mask 0 and 0.0. The restored segments carry no ``meta_info``
        (slime's sample already holds what it was used for).

        Raises:
            ValueError: the layout does not tile ``token_ids`` or is malformed."""
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
        trajectory = cls(token_ids=list(token_ids), segment_info=segments)
        trajectory.missing_logprobs = int(layout.get("missing_logprobs", 0))
        for segment in segments:
            end = segment.start + segment.length
            if segment.is_output:
                trajectory.loss_mask.extend([1] * segment.length)
                trajectory.logprobs.extend(
                    float(v) for v in logprobs[segment.start - prompt_len : end - prompt_len]
                )
            else:
                trajectory.loss_mask.extend([0] * segment.length)
                trajectory.logprobs.extend([0.0] * segment.length)
        for token_count, segment_count in layout["turns"]:
            if not 0 <= int(segment_count) <= len(segments) or not 0 <= int(token_count) <= position:
                raise ValueError(f"bad saved turn checkpoint ({token_count}, {segment_count})")
            trajectory._turns.append(_Checkpoint(int(token_count), int(segment_count)))
        return trajectory

    # ------------------------------------------------------------------ checks

    def check(self) -> None:
        """Raise AssertionError if any invariant is broken (cheap enough for tests and debugging)."""
        n = len(self.token_ids)
        assert len(self.loss_mask) == n == len(self.logprobs), "ids, mask and logprobs differ in length"
        position = 0
        for segment in self.segment_info:
            assert segment.start == position and segment.length > 0, "segments must tile the ids"
            mask = 1 if segment.is_output else 0
            end = segment.start + segment.length
            assert all(m == mask for m in self.loss_mask[segment.start : end]), "mask disagrees with segment"
            if not segment.is_output:
                assert all(lp == 0.0 for lp in self.logprobs[segment.start : end]), "prompt logprob != 0"
            position = end
        assert position == n, "segments do not cover the ids"
        assert not self.segment_info or not self.segment_info[0].is_output, "segment 0 must be the prompt"

    def response_slices(self) -> tuple[list[int], list[int], list[float]]:
        """``(response ids, loss mask, logprobs)`` after the initial prompt, for slime's Sample."""
        start = self.initial_prompt_length
        return self.token_ids[start:], self.loss_mask[start:], self.logprobs[start:]


def mask_runs(mask: list[int] | tuple[int, ...]) -> list[tuple[int, int, int]]:
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
