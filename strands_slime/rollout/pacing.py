"""Pacing of synchronous work on a busy event loop.

asyncio runs every ready callback of an iteration before it reads sockets again, so hundreds of
episodes resuming together run their synchronous stretches back to back (1,024 episodes x 0.5 ms is
half a second in which no reply is read). :func:`turn` is the gate each stretch passes first: it admits
work in batches of about :data:`SLICE_S` of CPU per iteration, in arrival order, and is free while the
loop is not busy. Start-up and every model call share the loop's one gate, so together they stay
within the budget. This module imports nothing of the package.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque

__all__ = ["MAX_BATCH", "SLICE_S", "turn"]

SLICE_S = 0.005
"""Gated work admitted per loop iteration (the goal is no iteration over 50 ms)."""
MAX_BATCH = 16
"""At most this many waiters woken per loop iteration, whatever the learned cost says: the stretches
that share the gate differ (an episode's set-up, handling a model reply), so a batch sized by cheap
ones must not wake hundreds of dear ones at once."""


class _Gate:
    """Admits gated work in batches of about :data:`SLICE_S` per loop iteration, in arrival order."""

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
        size = max(1, min(MAX_BATCH, int(SLICE_S / self._cost_s)))
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


_GATES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Gate] = weakref.WeakKeyDictionary()


async def turn() -> None:
    """Wait until this task may run its next stretch of synchronous work; returns at once (without
    suspending) while this loop iteration has spent less than :data:`SLICE_S` on gated work and no
    one is queued."""
    loop = asyncio.get_running_loop()
    gate = _GATES.get(loop)
    if gate is None:
        gate = _GATES[loop] = _Gate()
    await gate.turn()
