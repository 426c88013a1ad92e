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
