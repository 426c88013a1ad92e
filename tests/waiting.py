"""Waiting in tests: poll a condition until a deadline, never sleep a fixed time and hope.

A fixed ``sleep`` is either too short on a loaded machine (a flaky failure) or too long everywhere
(wasted time); an unbounded ``while not done`` hangs the suite until the global timeout. These helpers
return as soon as the condition holds and fail with a message naming what did not happen.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 30.0
"""Generous on purpose: a passing test returns at once, only a failing one waits the whole deadline."""


async def wait_until(
    condition: Callable[[], T | Awaitable[T]],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.01,
    what: str = "the condition",
) -> T:
    """Poll ``condition()`` (plain or async) on the running loop until it is truthy; return its value.

    Raises:
        AssertionError: ``condition`` was still falsy after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)


def wait_until_sync(
    condition: Callable[[], T],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.05,
    what: str = "the condition",
) -> T:
    """Blocking :func:`wait_until` for synchronous tests (subprocesses, threads, files).

    Raises:
        AssertionError: ``condition`` was still falsy after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
