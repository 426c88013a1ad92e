"""Start-up work that must not stall the rollout's event loop.

slime starts every episode of a rollout at the same instant (``asyncio.gather`` over hundreds of
samples), so whatever an episode does before its first real wait runs back to back in one loop
iteration: 1,024 episodes x 0.5 ms of set-up is half a second in which no reply is read. Two tools
keep every iteration short:

* :func:`episode_turn` admits episodes in small batches, one batch per loop iteration, each sized
  to take about :data:`SLICE_S`;
* :func:`once_per_loop` runs the one-time start-up of the loop (shared by every episode that arrives
  meanwhile) before episodes are admitted, so none of them waits for it in the middle of its set-up
  and then resumes in the same iteration as hundreds of others;
* :func:`load_once` runs one-time blocking work (loading a tokenizer, compiling a chat template) in
  a worker thread, once per process, however many episodes ask for it at the same time.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

from strands_slime.provider.client import run_abortable
from strands_slime.runtime import get_runtime

T = TypeVar("T")

SLICE_S = 0.005
"""Set-up time admitted per loop iteration (the goal is no iteration over 50 ms)."""


class _StartGate:
    """Admits episode set-ups in batches of about :data:`SLICE_S` per loop iteration, in arrival order."""

    # No reference to the loop: it keys the WeakKeyDictionary holding this object.
    def __init__(self) -> None:
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._slice_started: float | None = None
        self._admitting = False
        self._batch = 0
        self._batch_started = 0.0
        self._cost_s = SLICE_S  # per set-up, learned from each batch; starts pessimistic

    async def turn(self) -> None:
        if not self._waiting and not self._admitting and self._fits_this_iteration():
            return
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._waiting.append(future)
        if not self._admitting:
            self._admitting = True
            self._batch = 0
            # A new burst: the cost learned in the last one says little (aborted episodes cost
            # nothing), so start pessimistic again instead of waking a huge first batch.
            self._cost_s = SLICE_S
            loop.call_soon(self._admit)
        await future

    def _fits_this_iteration(self) -> bool:
        """Episodes arriving while nobody waits go at once until this iteration spent SLICE_S."""
        now = time.perf_counter()
        if self._slice_started is None:
            self._slice_started = now
            asyncio.get_running_loop().call_soon(self._end_slice)  # runs in the next iteration
            return True
        return now - self._slice_started < SLICE_S

    def _end_slice(self) -> None:
        self._slice_started = None

    def _admit(self) -> None:
        """Wake the next batch. Scheduled right behind the batch it woke, so it runs once that batch
        has done its synchronous set-up, and times it."""
        now = time.perf_counter()
        if self._batch:
            self._cost_s = max((now - self._batch_started) / self._batch, 1e-5)
        size = max(1, int(SLICE_S / self._cost_s))
        woken = 0
        while self._waiting and woken < size:
            future = self._waiting.popleft()
            if not future.done():  # skip cancelled waiters
                future.set_result(None)
                woken += 1
        self._batch, self._batch_started = woken, now
        if self._waiting or woken:
            asyncio.get_running_loop().call_soon(self._admit)
        else:
            self._admitting = False


_GATES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _StartGate] = weakref.WeakKeyDictionary()


async def episode_turn() -> None:
    """Wait until this episode may do its synchronous set-up (returns at once when the loop is idle)."""
    loop = asyncio.get_running_loop()
    gate = _GATES.get(loop)
    if gate is None:
        gate = _GATES[loop] = _StartGate()
    await gate.turn()


_RUNNING: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, asyncio.Future[Any]]] = (
    weakref.WeakKeyDictionary()
)


async def load_once(key: Hashable, function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` in a worker thread, once per process for ``key``; concurrent callers share the
    call. A failure is not remembered: the next caller tries again.

    Returns:
        ``function``'s result, remembered for ``key`` for the rest of the process (kept by the runtime).

    Raises:
        Exception: whatever ``function`` raised, to every caller sharing that call.
    """
    runtime = get_runtime()
    with runtime.lock:
        if key in runtime.loaded:
            return runtime.loaded[key]
    running = _RUNNING.setdefault(asyncio.get_running_loop(), {})
    future = running.get(key)
    if future is None:
        future = asyncio.ensure_future(asyncio.to_thread(function, *args))
        running[key] = future

        def finished(done: asyncio.Future[Any]) -> None:
            running.pop(key, None)
            if not done.cancelled() and done.exception() is None:
                with runtime.lock:
                    runtime.loaded[key] = done.result()

        future.add_done_callback(finished)
    return await asyncio.shield(future)


class _Ready:
    """A finished start-up's result (a done future would keep its loop, this dict's weak key, alive)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


_LOOP_ONCE: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, Any]] = (
    weakref.WeakKeyDictionary()
)


async def once_per_loop(
    key: Hashable, start: Callable[[], Awaitable[T]], abort_check: Callable[[], bool] | None = None
) -> T:
    """``await start()`` once per event loop for ``key``, shared by concurrent callers; a failure is
    raised to every caller waiting for it and the next caller tries again. ``abort_check`` ends the
    wait, not the shared start.

    Raises:
        SGLangAbortedError: ``abort_check`` became true while this caller waited.
        Exception: whatever ``start()`` raised, to every caller waiting for it.
    """
    entries = _LOOP_ONCE.setdefault(asyncio.get_running_loop(), {})
    entry = entries.get(key)
    if isinstance(entry, _Ready):
        return entry.value
    if entry is None:
        entry = entries[key] = asyncio.ensure_future(start())

        def settle(done: asyncio.Future[Any]) -> None:
            if entries.get(key) is not done:
                return
            if done.cancelled() or done.exception() is not None:
                del entries[key]  # the next caller starts again
            else:
                entries[key] = _Ready(done.result())

        entry.add_done_callback(settle)
    return await run_abortable(asyncio.shield(entry), abort_check, "the rollout's start-up")
