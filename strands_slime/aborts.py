"""Waits that end within ~:data:`ABORT_POLL_S` once the rollout is aborted.

slime aborts a rollout by setting a plain attribute (``GenerateState(args).aborted``), which cannot
wake anyone. :func:`run_abortable` awaits anything (a request, a tool call, a one-time start-up) under
such a flag: one poller per event loop reads every distinct flag while something waits under it and
cancels what waits under a flag that became true. The client, the sandboxed tool, the rollout's
start-up and the episode executor all wait this way, so this module sits below all of them.

:func:`wait_for` bounds a wait by a deadline without ever losing the caller's cancellation.

A flag whose read raises is counted (``Runtime.counters["abort_check_failures"]``, logged as a rollout
metric) and reported once per process instead of once per poll.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from strands_slime.runtime import get_runtime

if sys.version_info >= (3, 11):
    from asyncio import timeout
else:  # pragma: no cover - aiohttp depends on async-timeout below 3.11
    from async_timeout import timeout

__all__ = [
    "ABORT_BATCH",
    "ABORT_POLL_S",
    "AbortedError",
    "abort_check_failures",
    "run_abortable",
    "wait_for",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

ABORT_POLL_S = 0.05
"""How often the shared watcher reads the abort flags of the waits in flight."""
ABORT_BATCH = 16
"""Waits cancelled per loop iteration after an abort: each then unwinds its episode and tears down
its connection (0.5-1 ms together on a loaded core), so 64 at once held the loop for 50-85 ms in the
soak. A request not yet cancelled still never reaches the server: the client reads the flag again
right before the first byte is written."""
ABORT_CHECK_FAILURES = "abort_check_failures"
"""The runtime counter of abort-flag reads that raised."""


class AbortedError(Exception):
    """The rollout was aborted: the work was not started, or was cut short."""


class _AbortWatch:
    """The tasks of one event loop that wait under abort flags, and the one task that polls them."""

    # No reference to the loop: it keys the WeakKeyDictionary holding this object.
    def __init__(self) -> None:
        self._waiting: dict[Callable[[], bool], set[asyncio.Task[Any]]] = {}
        self._aborted: set[asyncio.Task[Any]] = set()
        self._poller: asyncio.Task[None] | None = None
        self._poller_cancelled = False

    def add(self, check: Callable[[], bool], task: asyncio.Task[Any]) -> None:
        self._waiting.setdefault(check, set()).add(task)
        if self._poller is None or self._poller.done() or self._poller_cancelled:
            self._poller_cancelled = False
            self._poller = asyncio.get_running_loop().create_task(
                self._poll(), name="strands-slime-abort-watch"
            )

    def remove(self, check: Callable[[], bool], task: asyncio.Task[Any]) -> bool:
        """Forget ``task``; True when it was cancelled because its flag was set."""
        tasks = self._waiting.get(check)
        if tasks is not None:
            tasks.discard(task)
            if not tasks:
                del self._waiting[check]
                if not self._waiting and self._poller is not None:
                    self._poller.cancel()  # nothing waits: leave no idle poller behind
                    self._poller_cancelled = True  # a wait added before it unwinds needs a new one
        if task in self._aborted:
            self._aborted.discard(task)
            return True
        return False

    async def _poll(self) -> None:
        while self._waiting:
            await asyncio.sleep(ABORT_POLL_S)
            for check, tasks in list(self._waiting.items()):
                try:
                    fired = bool(check())
                except Exception as exc:  # a broken flag must not kill the watcher of every other wait
                    _count_abort_check_failure(check, exc)
                    continue
                if fired:
                    doomed = [task for task in tasks if not task.done() and task not in self._aborted]
                    self._aborted.update(doomed)
                    self._cancel(doomed)

    def _cancel(self, doomed: list[asyncio.Task[Any]]) -> None:
        for task in doomed[:ABORT_BATCH]:
            task.cancel()
        if len(doomed) > ABORT_BATCH:  # the rest in the next iteration, after these have unwound
            asyncio.get_running_loop().call_soon(self._cancel, doomed[ABORT_BATCH:])


def abort_check_failures() -> int:
    """Abort-flag reads that raised in this process so far (metric ``abort_detection/failed_checks``)."""
    return get_runtime().counters[ABORT_CHECK_FAILURES]


def _count_abort_check_failure(check: Callable[[], bool], exc: Exception) -> None:
    """Count a flag read that raised (its waits could not be aborted on that poll); the first one per
    process is a WARNING with the cause, not one line every :data:`ABORT_POLL_S`."""
    runtime = get_runtime()
    runtime.count(ABORT_CHECK_FAILURES)
    if runtime.first_time("abort detection failed"):
        logger.warning(
            "strands_slime abort detection failed: the abort check %r raised %s: %s; its requests go on "
            "as if not aborted while it fails (logged once per process; counted in "
            "abort_detection/failed_checks)",
            check,
            type(exc).__name__,
            exc,
            exc_info=exc,
        )


_ABORT_WATCHES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _AbortWatch] = (
    weakref.WeakKeyDictionary()
)


async def run_abortable(
    awaitable: Awaitable[T],
    abort_check: Callable[[], bool] | None,
    what: str = "the request",
    error: type[AbortedError] = AbortedError,
) -> T:
    """Await ``awaitable``, but raise ``error`` within ~``ABORT_POLL_S`` once ``abort_check()`` is true
    (the awaitable is cancelled). Flags are polled by one task per loop; pass the same callable for
    every wait of a rollout so it is read once per poll."""
    if abort_check is None:
        return await awaitable
    if abort_check():
        if asyncio.iscoroutine(awaitable):
            awaitable.close()
        raise error(f"{what} was not started: the rollout was aborted")
    loop = asyncio.get_running_loop()
    watch = _ABORT_WATCHES.get(loop)
    if watch is None:
        watch = _ABORT_WATCHES[loop] = _AbortWatch()
    task = asyncio.ensure_future(awaitable)
    watch.add(abort_check, task)
    try:
        return await task
    except asyncio.CancelledError:
        if watch.remove(abort_check, task):
            current = asyncio.current_task()
            cancelling = getattr(current, "cancelling", None)
            if cancelling is None or not cancelling():  # our own cancellation, not the caller's
                raise error(f"{what} was cut short: the rollout was aborted") from None
        raise
    finally:
        watch.remove(abort_check, task)


async def wait_for(awaitable: Awaitable[T], timeout_s: float | None) -> T:
    """``await awaitable`` within ``timeout_s`` (``asyncio.TimeoutError`` after it), in the calling task.

    ``asyncio.wait_for`` before Python 3.12 runs the awaitable in a task of its own and returns its
    result when a cancellation arrives just as it finishes: the cancellation is lost, and because
    ``Task.cancel`` hands it to what the task awaits, so is the cancellation of every task above (a
    Ctrl-C'd rollout waited forever on a tool call that finished that way). Here nothing sits in
    between: the cancellation reaches the caller whatever the awaitable did.
    """
    async with timeout(timeout_s):
        return await awaitable
