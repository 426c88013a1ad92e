"""The garbage-collector policy of a rollout process: short pauses with a thousand episodes in flight.

A collection's pause grows with what is alive, so at a thousand episodes in flight CPython's own full
collections held slime's loop for over 100 ms. With ``gc_tuning: true`` (the default) the long-lived
heap is frozen, young generations are small (:data:`GC_THRESHOLDS`), full collections run at quiet
points (the last live episode ended, or every :data:`FULL_COLLECTION_INTERVAL_S`), young ones after
every :data:`YOUNG_COLLECTION_EVERY` episodes and :data:`YOUNG_COLLECTION_EVERY_REPLIES` replies (their
frees lower CPython's allocation count, so the young generation would outgrow its threshold unseen),
and replies are decoded with collections deferred. The one place that decides what the collector
does; its state is held by the runtime (``Runtime.state``). Measurements: docs/soak.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from strands_slime.runtime import get_runtime

__all__ = [
    "FULL_COLLECTION_INTERVAL_S",
    "GC_THRESHOLDS",
    "YOUNG_COLLECTION_EVERY",
    "YOUNG_COLLECTION_EVERY_REPLIES",
    "GcPolicy",
    "gc_policy",
    "tune_gc_once",
]

logger = logging.getLogger(__name__)

GC_THRESHOLDS = (2_000, 1, 1_000_000)
"""Small young generations and no automatic full collection. A gen-1 collection after every second
gen-0 one walks each survivor once more, as a larger gen-1 threshold would, but in smaller pieces.
Measured in the soak with 1,024 episodes in flight: gen-1 pauses 111-140 ms and full ones up to
186 ms at (10,000, 20, 100), 70 ms at (6,000, 1), 13-27 ms here with the scheduled young collections;
CPU per turn +3 % (benchmarks/bench_provider.py)."""
YOUNG_COLLECTION_EVERY = 8
"""With the GC tuned, a young (gen-0) collection after this many episodes ended. Freeing an episode
frees hundreds of old objects, and CPython lowers its allocation count for each one, so while
episodes end the young generation outgrows its threshold unseen and its next collection is long."""
YOUNG_COLLECTION_EVERY_REPLIES = 32
"""With the GC tuned, a young (gen-0) collection after this many model replies were handled. A reply
frees what its request held since it was sent (old objects by then), and each one lowers CPython's
allocation count as above: when a wave of replies arrives at once, the young generation grows far
past its threshold before the count says so (35-38 ms gen-1 pauses at 1,024 episodes in flight)."""
FULL_COLLECTION_INTERVAL_S = 300.0
"""With the GC tuned, how long at most between full collections when the process never runs out of
live episodes (fully asynchronous rollouts); otherwise they run each time the last episode ends."""


class GcPolicy:
    """The process's collector policy and the counts it keeps (one per process: :func:`gc_policy`)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._saved_threshold: tuple[int, int, int] | None = None
        self.live_episodes = 0
        """Episodes running in this process now (:meth:`episode`)."""
        self.full_collections = 0
        """Full collections :meth:`episode` ran (the GC tuned), at quiet points or when overdue."""
        self.quiet_collections = 0
        """Those of them that ran with no episode live (at a quiet point)."""
        self.young_collections = 0
        """Young collections scheduled by :meth:`episode` and :meth:`reply_handled` (the GC tuned)."""
        self._last_full_collection = time.monotonic()
        self._ended_since_young_collection = 0
        self._replies_since_young_collection = 0

    # ------------------------------------------------------------------ tuning

    @property
    def tuned(self) -> bool:
        """Whether :meth:`tune` is in effect."""
        return self._saved_threshold is not None

    def tune(self, thresholds: tuple[int, int, int] = GC_THRESHOLDS) -> bool:
        """Freeze what is alive now, set the collector's thresholds and move full collections to quiet
        points. Give ``thresholds[2]`` large so CPython's own full collections stay out of the way.

        Once: later calls do nothing until :meth:`restore` (or the runtime's reset/close) undoes it.

        Returns:
            True when this call tuned the collector.
        """
        with self._lock:
            if self._saved_threshold is not None:
                return False
            self._saved_threshold = gc.get_threshold()
            gc.freeze()
            gc.set_threshold(*thresholds)
            self._last_full_collection = time.monotonic()
            return True

    def restore(self) -> None:
        """Undo :meth:`tune`: unfreeze the frozen objects and restore the thresholds it found."""
        with self._lock:
            saved, self._saved_threshold = self._saved_threshold, None
            if saved is None:
                return
            gc.unfreeze()
            gc.set_threshold(*saved)

    def reset(self) -> None:
        """What the runtime's reset/close does with this policy: the tuning is undone."""
        self.restore()

    # ------------------------------------------------------------------ scheduling

    @contextlib.contextmanager
    def episode(self) -> Iterator[None]:
        """Count one live episode for the block; with the GC tuned, the last one to end triggers the
        full collection and every :data:`YOUNG_COLLECTION_EVERY`-th a young one, run from the event
        loop right after the episode's own frame is gone, or at once outside a loop."""
        with self._lock:
            self.live_episodes += 1
        try:
            yield
        finally:
            with self._lock:
                self.live_episodes -= 1
                due = self._full_collection_due()
                self._ended_since_young_collection += 1
                young_due = (
                    self.tuned and not due and self._ended_since_young_collection >= YOUNG_COLLECTION_EVERY
                )
                if due or young_due:
                    self._ended_since_young_collection = 0
                    self._replies_since_young_collection = 0
            if due:
                _soon(self._full_collection)
            elif young_due:
                _soon(self._young_collection)

    def reply_handled(self) -> None:
        """Count one model reply handled; with the GC tuned, every
        :data:`YOUNG_COLLECTION_EVERY_REPLIES`-th schedules a young collection on the running loop."""
        if not self.tuned:
            return
        with self._lock:
            self._replies_since_young_collection += 1
            if self._replies_since_young_collection < YOUNG_COLLECTION_EVERY_REPLIES:
                return
            self._replies_since_young_collection = 0
        _soon(self._young_collection)

    @staticmethod
    @contextlib.contextmanager
    def collections_deferred() -> Iterator[None]:
        """No garbage collection while a reply is decoded and parsed: decoding makes one small list per
        token and parsing frees them, so a collection in between would walk them all, and everything
        else young, for nothing. Left as it is when the collector is off."""
        if not gc.isenabled():
            yield
            return
        gc.disable()
        try:
            yield
        finally:
            gc.enable()

    def _young_collection(self) -> None:
        """Collect the young generation, and the middle one when CPython would with it: an explicit
        ``gc.collect(0)`` counts toward the middle generation's threshold but never collects it, so
        young collections alone would let it grow without bound."""
        with self._lock:
            self.young_collections += 1
        gc.collect(1 if gc.get_count()[1] > gc.get_threshold()[1] else 0)

    def _full_collection_due(self) -> bool:
        """With the GC tuned: no episode is live, or the last full collection is overdue (call under
        the lock)."""
        return self.tuned and (
            self.live_episodes == 0
            or time.monotonic() - self._last_full_collection >= FULL_COLLECTION_INTERVAL_S
        )

    def _full_collection(self) -> None:
        """A full collection if still due (an episode may have started since it was scheduled);
        freeze what survived when no episode is live, so later collections skip it."""
        with self._lock:
            if not self._full_collection_due():
                return
            quiet = self.live_episodes == 0
            self._last_full_collection = time.monotonic()
            self.full_collections += 1
            self.quiet_collections += quiet
        started = time.perf_counter()
        found = gc.collect()
        with self._lock:
            if quiet and self.live_episodes == 0 and self.tuned:
                gc.freeze()
        logger.debug(
            "full garbage collection (%s): %d unreachable objects, %.1f ms",
            "quiet point" if quiet else "overdue",
            found,
            (time.perf_counter() - started) * 1000,
        )


def _soon(collect: Callable[[], Any]) -> None:
    """Run ``collect`` from the running loop once the current callback is done (its frames, and what
    only they held, gone), or at once outside a loop."""
    try:
        asyncio.get_running_loop().call_soon(collect)
    except RuntimeError:
        collect()


_STATE_KEY = "gc_policy"


def gc_policy() -> GcPolicy:
    """The process's :class:`GcPolicy` (held by the runtime, created on first use)."""
    runtime = get_runtime()
    return runtime.cached(runtime.state, _STATE_KEY, GcPolicy)


def tune_gc_once() -> None:
    """Tune the collector the rollout's way (:data:`GC_THRESHOLDS`), once per process; the runtime's
    ``reset``/``close`` undo it."""
    gc_policy().tune(GC_THRESHOLDS)
