"""What ``strands_slime.generate`` gives every episode, for a process that drives the provider itself.

Building an :class:`~strands_slime.provider.model.SGLangModel` changes no global state, so a
hand-written ``Agent(model=SGLangModel(...))`` gets none of the generate path's process-wide savings
(tracer, GC policy, pacing) unless it asks: :func:`rollout_settings` is that one explicit request,
made once at start-up; the caller wires what it returns. The wiring and what each saving does:
README's snippet and docs/provider.md, "Driving many agents yourself".
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from strands_slime.provider import telemetry
from strands_slime.rollout import pacing
from strands_slime.rollout.gc_policy import GcPolicy, gc_policy, tune_gc_once

__all__ = ["RolloutSettings", "pace", "rollout_settings"]


async def pace(stage: str) -> None:
    """A model's pace callback in the rollout: replies count toward the GC policy's young collections
    (when it is tuned), and every synchronous stretch of a model call passes the loop's pacing gate."""
    if stage == "reply":
        gc_policy().reply_handled()
    await pacing.turn()


@dataclass(frozen=True)
class RolloutSettings:
    """What :func:`rollout_settings` turned on, and the pieces a client, a model and each episode take."""

    gc_tuned: bool
    """Whether the collector runs the rollout's policy (False: ``gc_tuning=False`` was asked for)."""
    tracer_guarded: bool
    """Whether Strands' tracer skips unrecorded spans (False on a Strands release it was not verified for)."""
    decode_scope: Callable[[], AbstractContextManager[Any]]
    """For ``SGLangClient(decode_scope=...)``: replies decoded and parsed with collections deferred."""
    pace: Callable[[str], Any]
    """For ``SGLangModel(pace=...)``: replies counted for the collector, model calls paced on the loop."""

    @contextlib.contextmanager
    def episode(self) -> Iterator[None]:
        """Around each episode: with the collector tuned, the last live episode to end runs its full
        collection (none runs otherwise but every five minutes) and every eighth a young one."""
        if not self.gc_tuned:
            yield
            return
        with gc_policy().episode():
            yield


def rollout_settings(*, gc_tuning: bool = True) -> RolloutSettings:
    """Turn on, for this process, what ``strands_slime.generate`` gives its episodes: Strands' tracer
    skipping unrecorded spans and (``gc_tuning``, the rollout config's default) the rollout's collector
    policy. Idempotent; the runtime's ``reset``/``close`` undo the collector tuning."""
    tracer_guarded = telemetry.skip_messages_of_unrecorded_spans()
    if gc_tuning:
        tune_gc_once()
    return RolloutSettings(
        gc_tuned=gc_tuning,
        tracer_guarded=tracer_guarded,
        decode_scope=GcPolicy.collections_deferred if gc_tuning else nullcontext,
        pace=pace,
    )
