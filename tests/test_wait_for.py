"""``aborts.wait_for``: a deadline on a wait that never loses the caller's cancellation.

``asyncio.wait_for`` before Python 3.12 returns the result of an awaitable that finishes just as the
caller is cancelled, and since ``Task.cancel`` hands a cancellation to what the task awaits, a task
awaiting such a wait loses its own cancellation too: a Ctrl-C'd rollout then waited forever on a
Strands tool task that had finished its sandbox call at that instant (issue 37)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from strands_slime.aborts import wait_for

pytestmark = pytest.mark.unit


async def _cancel_as_it_finishes(wait: object) -> asyncio.Task[int]:
    """A task awaiting a task that waits on ``done`` through ``wait``; ``done`` finishes in the same loop
    iteration as the outer task is cancelled (a sandbox call ending as Strands cancels its tool task)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()

    async def tool_call() -> int:
        return await wait(asyncio.shield(done), 10.0)  # type: ignore[operator]

    async def tool_task() -> int:
        return await asyncio.ensure_future(tool_call())  # run_abortable's own task

    outer = asyncio.ensure_future(tool_task())
    for _ in range(3):
        await asyncio.sleep(0)
    done.set_result(7)
    outer.cancel()
    await asyncio.wait([outer])
    return outer


async def test_a_cancellation_that_meets_the_result_is_kept() -> None:
    outer = await _cancel_as_it_finishes(wait_for)
    assert outer.cancelled()


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="asyncio.wait_for keeps it from Python 3.12 on")
async def test_asyncio_wait_for_loses_it_before_python_3_12() -> None:
    """The flaw itself, so the test above is not vacuous on the Pythons we support."""
    outer = await _cancel_as_it_finishes(asyncio.wait_for)
    assert not outer.cancelled() and outer.result() == 7


async def test_the_deadline_still_ends_the_wait() -> None:
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    with pytest.raises(asyncio.TimeoutError):
        await wait_for(never, 0.01)
    assert await wait_for(asyncio.sleep(0, "ok"), None) == "ok"
