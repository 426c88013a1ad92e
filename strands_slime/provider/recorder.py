"""The record of an episode's model calls: the trajectories it trains on, and nothing else.

One :class:`Recorder` per episode. The rollout builds it and hands it to the models of the episode
(``SGLangModel(recorder=...)``); a model built alone makes its own. Every model call reports through one
seam, :class:`Lane` (one per model): a turn that continues its agent's history
(:meth:`Lane.record_turn`), a turn the server aborted (:meth:`Lane.record_cut_call`), or a side call
outside the history (:meth:`Lane.record_side_call`). The lane owns what follows from those reports: the
model's current trajectory and its closed context segments, the output of a call an abort cut short (the
next call goes on from it), and the counters. Nothing outside ``provider/`` writes a trajectory: the
rollout asks the lane (resume, fill, fan-out), it does not edit one.

**Several agents per episode.** While an episode runs, its recorder is the *active* one
(:meth:`Recorder.activate`, a context variable): an ``SGLangModel`` built without ``recorder=`` inside
the episode (in a tool that wraps a sub-agent, an agent used as a tool, a Swarm or Graph node) joins
it, with the episode's :attr:`Recorder.model_defaults` (its abort check, budget, ...). Each context
segment of a lane remembers the tool call it started under (:data:`Origin`: the calling agent's lane
name and the ``toolUseId``), which the model's plugin publishes while a tool runs
(:meth:`Lane.tool_call_started`). Reading it costs nothing per turn: once per context segment.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from typing import Any

from strands_slime.errors import TrajectoryDesyncError
from strands_slime.provider.trajectory import TokenTrajectory, token_array

CutCall = tuple[list[int], "array[int]", "array[float]"]
"""(prompt ids, output ids, logprobs) of a call an abort cut short."""

Origin = tuple[str, str]
"""``(calling agent's lane name, toolUseId)``: the tool call a context segment started under."""

MAIN = "main"
"""The lane name of the episode's own agent (role ``main``; every other lane's role is ``sub``)."""

_ACTIVE: ContextVar[Recorder | None] = ContextVar("strands_slime_active_recorder", default=None)
_TOOL_CALL: ContextVar[Origin | None] = ContextVar("strands_slime_tool_call", default=None)


@dataclass(slots=True)
class ModelStats:
    """Per-episode counters of one model (reset with its trajectory)."""

    model_calls: int = 0
    tool_calls: int = 0
    parse_errors: int = 0
    rolled_back_turns: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    generation_seconds: float = 0.0
    side_calls: int = 0
    """Calls served outside the episode (a conversation manager's summary, ...): not in the trajectory."""
    side_call_tokens: int = 0
    """Tokens the side calls sampled: never trained (see docs/provider.md, "What is trained")."""
    turn_seconds: list[float] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    parse_error_messages: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The counters as plain JSON (what ``dataclasses.asdict`` gives, without its deep copy)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: list(v) if isinstance(v, list) else v for name, v in values.items()}

    @property
    def last_finish_reason(self) -> str | None:
        """The finish reason of the latest model call, or None before the first call."""
        return self.finish_reasons[-1] if self.finish_reasons else None


class Lane:
    """One model's part of the episode: its trajectory, closed segments, cut call and counters."""

    __slots__ = (
        "closed",
        "closed_origins",
        "continuation",
        "cut_call",
        "first_prompt_ids",
        "name",
        "origin",
        "outer_calls",
        "server",
        "stats",
        "trajectory",
    )

    def __init__(self, name: str, server: str | None = None) -> None:
        self.name = name
        self.server = server
        """The base URL of the server this lane's model samples from (what decides whether it trains)."""
        self.trajectory = TokenTrajectory()
        self.closed: list[TokenTrajectory] = []
        """Earlier context segments (``new_segment_on_context_change``), oldest first."""
        self.origin: Origin | None = None
        """The tool call the current trajectory started under (None: not under another agent's tool)."""
        self.closed_origins: list[Origin | None] = []
        """:attr:`origin` of each closed segment."""
        self.outer_calls: dict[str, Origin | None] = {}
        """toolUseId of each running tool call of this lane's agent -> the call it replaced in its context."""
        self.stats = ModelStats()
        self.continuation: CutCall | None = None
        """A call an abort cut short: the next call goes on from its output."""
        self.cut_call: TokenTrajectory | None = None
        """The trajectory with the call the server aborted in this attempt (adopted only on request)."""
        self.first_prompt_ids: array[int] | None = None
        """The ids of the episode's first prompt (system, tools, history), once rendered."""

    def reset(self) -> None:
        """A new episode for this model."""
        self.__init__(self.name, self.server)  # type: ignore[misc]

    def tool_call_started(self, tool_use_id: str) -> None:
        """A tool call of this lane's agent runs in this context (Strands runs a call's hooks and its
        tool in one task): a model that starts a context under it records it as its origin."""
        outer = _TOOL_CALL.get()
        _TOOL_CALL.set((self.name, tool_use_id))
        self.outer_calls.setdefault(tool_use_id, outer)  # a hook that retries the call: keep the first

    def tool_call_ended(self, tool_use_id: str) -> None:
        """The tool call ended: the context is back under the call it replaced."""
        if tool_use_id in self.outer_calls:
            _TOOL_CALL.set(self.outer_calls.pop(tool_use_id))

    def begin_context(self, prompt_ids: array[int]) -> None:
        """A trajectory starts from these prompt ids (the episode's first, or a new context segment's):
        it remembers the tool call of another agent it started under."""
        self.first_prompt_ids = prompt_ids
        caller = _TOOL_CALL.get()
        self.origin = caller if caller is not None and caller[0] != self.name else None

    # ------------------------------------------------------------------ what a call reports

    def record_turn(self, prompt_ids: Sequence[int], response: Any, cut: CutCall | None = None) -> None:
        """A call that continues the history: its new prompt ids (mask 0), then what it sampled (mask 1):
        the output of the cut call it goes on from, if any, and the server's reply (with its meta)."""
        _append_turn(self.trajectory, prompt_ids, response, cut)

    def record_cut_call(
        self, prompt_ids: Sequence[int], response: Any, cut: CutCall | None = None
    ) -> TokenTrajectory:
        """A call the server aborted: the trajectory with it is held apart (:meth:`keep_cut_call` adopts
        it) and returned, what :class:`~strands_slime.errors.GenerationAborted` reports."""
        partial = self.trajectory.copy()
        _append_turn(partial, prompt_ids, response, cut)
        self.cut_call = partial
        return partial

    def record_side_call(self, response: Any) -> None:
        """A call outside the history (a summary, the deprecated structured output): counted, never trained."""
        self.stats.side_calls += 1
        self.stats.side_call_tokens += len(response.output_ids)

    def rollback(self, keep: int) -> None:
        """Strands runs a call again: the turns after the first ``keep`` leave the trajectory."""
        if keep < self.trajectory.turn_count:
            self.stats.rolled_back_turns += self.trajectory.turn_count - keep
            self.trajectory.rollback_turns(keep)

    def close_segment(self) -> None:
        """The history changed under the trajectory (fan-out): it becomes a closed segment."""
        if self.trajectory.num_outputs:
            self.closed.append(self.trajectory)
            self.closed_origins.append(self.origin)
        self.trajectory = TokenTrajectory()
        self.origin = None

    def segments(self) -> list[TokenTrajectory]:
        """What this model trains on, oldest first: the closed segments and the current trajectory
        (left out when it is a compacted history that ended before its first output)."""
        if self.closed and not self.trajectory.num_outputs:
            return list(self.closed)
        return [*self.closed, self.trajectory]

    def segment_origins(self) -> list[Origin | None]:
        """The tool call each of :meth:`segments` started under, in the same order."""
        closed = [*self.closed_origins, *[None] * (len(self.closed) - len(self.closed_origins))]
        if self.closed and not self.trajectory.num_outputs:
            return closed[: len(self.closed)]
        return [*closed[: len(self.closed)], self.origin]

    @property
    def role(self) -> str:
        """``main`` for the episode's own agent, ``sub`` for every other."""
        return "main" if self.name == MAIN else "sub"

    # ------------------------------------------------------------------ a call an abort cut short

    def continue_output(self, prompt_ids: Sequence[int], output_ids: Any, logprobs: Any) -> None:
        """Make the next call go on from an output an abort cut short: its new messages must render to
        ``prompt_ids`` again, and the server continues after ``output_ids`` (as slime's generate does)."""
        self.continuation = (list(prompt_ids), token_array(output_ids), array("d", logprobs))

    def take_continuation(self) -> CutCall | None:
        """The continuation no call used yet, or None; it is cleared."""
        continuation, self.continuation = self.continuation, None
        return continuation

    def continuation_for(self, prompt_ids: list[int]) -> CutCall | None:
        """The continuation a call with these prompt ids goes on from (taken), or None. Its prompt must
        render to the very ids it was sent with."""
        continuation = self.take_continuation()
        if continuation is not None and continuation[0] != prompt_ids:
            raise TrajectoryDesyncError(
                "the resumed call's prompt renders to other ids than the call the abort cut short"
            )
        return continuation

    def keep_cut_call(self) -> bool:
        """Keep the output of the call the server aborted in the trajectory (the sample then holds it and
        a resumed episode goes on from it, as slime's own generate does). False when there is none."""
        partial, self.cut_call = self.cut_call, None
        current = self.trajectory
        if (
            partial is None
            or not partial.ends_with_output
            or partial.turn_count != current.turn_count + 1
            or partial.token_ids[: len(current)] != current.token_ids
        ):
            return False
        self.trajectory = partial
        return True

    def cut_call_meta(self) -> dict[str, Any] | None:
        """The ``meta_info`` of the call the server aborted (what replay needs of it), None if it sampled nothing."""
        partial = self.cut_call
        if partial is None or not partial.ends_with_output:
            return None
        return partial.segment_info[-1].meta_info or {}

    def restore(self, trajectory: TokenTrajectory, recorded_outputs: int) -> None:
        """Go on with a saved trajectory. A last turn with no output recorded in the history is a call
        an abort cut short: it leaves the trajectory and the next call goes on from its output."""
        self.trajectory = trajectory
        self.first_prompt_ids = trajectory.token_ids[: trajectory.initial_prompt_length]
        if trajectory.turn_count <= recorded_outputs:
            return
        start = trajectory.turn_start(trajectory.turn_count - 1)
        prompt = [
            token
            for segment in trajectory.segment_info[start.segment_count :]
            if not segment.is_output
            for token in trajectory.token_ids[segment.start : segment.start + segment.length].tolist()
        ]
        first_output = start.token_count + len(prompt)
        self.continue_output(prompt, trajectory.token_ids[first_output:], trajectory.logprobs[first_output:])
        trajectory.rollback_turns(trajectory.turn_count - 1)

    def settle(self) -> None:
        """The episode ended before the call that would go on from a cut call: that call's output goes
        back into the trajectory, which again holds everything the sample does."""
        continuation = self.take_continuation()
        if continuation is not None:
            prompt_ids, output, logprobs = continuation
            self.trajectory.begin_turn()
            self.trajectory.add_prompt(prompt_ids)
            self.trajectory.add_output(output, logprobs)


class Recorder:
    """Every model call of one episode, one :class:`Lane` per model, in the order the models joined."""

    __slots__ = ("lanes", "model_defaults")

    def __init__(self, model_defaults: dict[str, Any] | None = None) -> None:
        self.lanes: list[Lane] = []
        self.model_defaults: dict[str, Any] = model_defaults or {}
        """``SGLangModel`` settings a model that joins through :meth:`active` gets unless it sets them
        (the episode's abort check, response budget, ...)."""

    def join(self, name: str | None = None, server: str | None = None) -> Lane:
        """A lane for a model of this episode: named ``name`` (``model-N`` without one; a name already
        taken gets ``-2``, ``-3``, ... appended, so that every lane's name is unique)."""
        base = name or f"model-{len(self.lanes)}"
        taken = {lane.name for lane in self.lanes}
        unique, suffix = base, 2
        while unique in taken:
            unique, suffix = f"{base}-{suffix}", suffix + 1
        lane = Lane(unique, server)
        self.lanes.append(lane)
        return lane

    @staticmethod
    def active() -> Recorder | None:
        """The recorder of the episode running in this context (:meth:`activate`), or None."""
        return _ACTIVE.get()

    @contextmanager
    def activate(self) -> Iterator[Recorder]:
        """Make this the active recorder here and in the tasks started from here (tool calls,
        sub-agents): models built without ``recorder=`` join it."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)


def _append_turn(
    trajectory: TokenTrajectory, prompt_ids: Sequence[int], response: Any, cut: CutCall | None
) -> None:
    trajectory.begin_turn()
    trajectory.add_prompt(prompt_ids)
    if cut is not None and len(cut[1]):  # a resumed call: the output it had before the abort, then the rest
        trajectory.add_output(cut[1], cut[2])
    trajectory.add_output(
        response.output_ids, response.output_logprobs or [None] * len(response.output_ids), response.meta_info
    )
