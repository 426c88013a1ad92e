"""A thin driver for headless Chromium over the DevTools protocol (a websocket, spoken by aiohttp).

Used by the viewer's browser tests: open a file, evaluate JavaScript, take screenshots. Chromium
comes from the Debian package (`apt-get install chromium`; `make chromium` installs it, as root; CI's
`.ci/run` calls it).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from waiting import wait_until

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    for name in BROWSER_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class Page:
    def __init__(self, browser: Browser, session_id: str) -> None:
        self.browser = browser
        self.session_id = session_id

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.browser.send(method, params, session_id=self.session_id)

    async def evaluate(self, expression: str) -> Any:
        reply = await self.send(
            "Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True}
        )
        if "exceptionDetails" in reply:
            raise AssertionError(f"JavaScript failed: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 10.0) -> Any:
        """Poll ``expression`` until it is truthy; its value, or AssertionError at the deadline."""
        return await wait_until(
            lambda: self.evaluate(expression), timeout=timeout, interval=0.05, what=expression
        )

    async def screenshot(self, path: Path, *, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        reply = await self.send("Page.captureScreenshot", params)
        path.write_bytes(base64.b64decode(reply["data"]))
        return path


class Browser:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(message.data)
            future = self._pending.pop(data.get("id", -1), None)
            if future is not None and not future.done():
                if "error" in data:
                    future.set_exception(AssertionError(f"DevTools error: {data['error']}"))
                else:
                    future.set_result(data.get("result", {}))
        for future in self._pending.values():
            if not future.done():
                future.set_exception(AssertionError("the browser closed the DevTools connection"))

    async def send(
        self, method: str, params: dict[str, Any] | None = None, *, session_id: str | None = None
    ) -> dict[str, Any]:
        message_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[message_id] = future
        message: dict[str, Any] = {"id": message_id, "method": method, "params": params or {}}
        if session_id:
            message["sessionId"] = session_id
        await self.ws.send_str(json.dumps(message))
        return await asyncio.wait_for(future, 60)

    async def open(self, url: str, *, width: int = 1400, height: int = 1000) -> Page:
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        page = Page(self, attached["sessionId"])
        await page.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        await page.send("Page.navigate", {"url": url})
        await page.wait_for("document.readyState === 'complete'", timeout=30)
        return page


@contextlib.asynccontextmanager
async def chromium(executable: str, profile_dir: Path) -> AsyncIterator[Browser]:
    """Start headless Chromium with a DevTools port; stop it (and wait for it) on exit."""
    process = await asyncio.create_subprocess_exec(
        executable,
        "--headless",
        "--no-sandbox",  # root in containers
        "--disable-gpu",
        "--no-first-run",
        "--hide-scrollbars",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile_dir}",
        "about:blank",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    try:

        async def endpoint() -> str:
            assert process.stderr is not None
            while line := await process.stderr.readline():
                match = re.search(rb"DevTools listening on (ws://\S+)", line)
                if match:
                    return match.group(1).decode()
            raise AssertionError(f"chromium exited ({await process.wait()}) before opening DevTools")

        url = await asyncio.wait_for(endpoint(), 60)
        drain = asyncio.create_task(process.stderr.read())  # keep the pipe from filling up
        async with aiohttp.ClientSession() as session, session.ws_connect(url, max_msg_size=0) as ws:
            browser = Browser(ws)
            try:
                yield browser
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(browser.send("Browser.close"), 5)
                browser._reader.cancel()
        drain.cancel()
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except asyncio.TimeoutError:
                process.kill()
                await process.wait()
