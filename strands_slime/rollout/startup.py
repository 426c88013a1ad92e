"""Start-up work that must not stall the rollout's event loop.

slime starts every episode of a rollout at the same instant (``asyncio.gather`` over hundreds of
samples), so whatever an episode does before its first real wait runs back to back in one loop
iteration: 1,024 episodes x 0.5 ms of set-up is half a second in which no reply is read. Two tools
keep every iteration short:

* :func:`episode_turn` admits episodes in small batches, one batch per loop iteration, each sized
  to take about ``SLICE_S`` (the loop's pacing gate, :mod:`strands_slime.pacing`);
* :func:`once_per_loop` runs the one-time start-up of the loop (shared by every episode that arrives
  meanwhile) before episodes are admitted, so none of them waits for it in the middle of its set-up
  and then resumes in the same iteration as hundreds of others;
* :func:`load_once` runs one-time blocking work (loading a tokenizer, compiling a chat template) in
  a worker thread, once per process, however many episodes ask for it at the same time.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

from strands_slime import pacing
from strands_slime.provider.client import run_abortable
from strands_slime.runtime import get_runtime

T = TypeVar("T")


async def episode_turn() -> None:
    """Wait until this episode may do its synchronous set-up (returns at once when the loop is idle):
    the loop's pacing gate (:func:`strands_slime.pacing.turn`)."""
    await pacing.turn()


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
