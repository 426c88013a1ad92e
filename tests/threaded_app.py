"""An aiohttp app on its own event loop in a thread, for tests whose clients run on several loops."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web


@contextmanager
def serve_app_in_thread(build_app: Callable[[], web.Application]) -> Iterator[str]:
    """Serve ``build_app()`` (built on the server's own loop) on a free loopback port; yields its URL.

    The server stops and its loop closes when the block ends.
    """
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def serve() -> None:
        loop = asyncio.new_event_loop()
        holder["loop"] = loop

        async def start() -> None:
            runner = web.AppRunner(build_app(), handle_signals=False)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            holder["runner"] = runner
            holder["url"] = f"http://127.0.0.1:{runner.addresses[0][1]}"
            ready.set()

        loop.run_until_complete(start())
        loop.run_forever()
        loop.run_until_complete(holder["runner"].cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10), "the threaded test server did not start in 10 s"
    try:
        yield holder["url"]
    finally:
        holder["loop"].call_soon_threadsafe(holder["loop"].stop)
        thread.join(10)


@contextmanager
def devserver_in_thread(*args: Any, **options: Any) -> Iterator[Any]:
    """A started :class:`~strands_slime.devserver.DevServer` (``DevServer(*args, **options)``) on its own
    event loop in a thread: for code that blocks the test's loop while it waits for a reply (Strands
    runs a conversation manager's summary call in a thread and waits for it synchronously)."""
    from strands_slime.devserver import DevServer

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = DevServer(*args, **options)
    try:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
        yield server
    finally:
        try:
            asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()
