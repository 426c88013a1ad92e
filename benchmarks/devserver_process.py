"""The dev server's command line as a child process, for benchmarks and tests: ``DevServerProcess``.

``python -m strands_slime.devserver ARGS --port 0`` (or another command that prints the same URL line),
ready once it prints ``DEVSERVER_URL=...``, stopped on exit. Moved out of the package
(``strands_slime.devserver.DevServerProcess`` warns): the package runs its dev server in-process.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence

from strands_slime.devserver.cli import URL_LINE_PREFIX


class DevServerProcess:
    """``python -m strands_slime.devserver ARGS --port 0`` as a child process: ``with DevServerProcess([...])``.

    Ready once it prints its URL line (after it started serving); killed on exit.
    """

    def __init__(
        self, args: Sequence[str] = (), *, start_timeout: float = 60.0, command: Sequence[str] | None = None
    ) -> None:
        self.command = list(command) if command is not None else ["-m", "strands_slime.devserver"]
        """What follows the interpreter (``["benchmarks/fault_injection.py"]`` serves with faults)."""
        self.args = list(args)
        if "--port" not in self.args and not any(arg.startswith("--port=") for arg in self.args):
            self.args += ["--port", "0"]
        self.start_timeout = start_timeout
        self.process: subprocess.Popen[str] | None = None
        self.url = ""
        self._stderr = tempfile.TemporaryFile("w+")

    def start(self) -> DevServerProcess:
        """Spawn the process and wait for its URL line (``start_timeout`` at most)."""
        if self.process is not None:
            raise RuntimeError("this DevServerProcess is already started")
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        process = self.process = subprocess.Popen(
            [sys.executable, *self.command, *self.args],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env={**env, **os.environ, "PYTHONUNBUFFERED": "1"},
        )
        printed = threading.Event()

        def read_url() -> None:
            assert process.stdout is not None
            for line in process.stdout:  # read to the end, so the child never blocks on a full pipe
                if line.startswith(URL_LINE_PREFIX) and not self.url:
                    self.url = line[len(URL_LINE_PREFIX) :].strip()
                    printed.set()
            printed.set()

        threading.Thread(target=read_url, name="devserver-stdout", daemon=True).start()
        if not printed.wait(self.start_timeout) or not self.url:
            code = process.poll()
            self.stop()
            what = (
                f"exited with code {code}"
                if code is not None
                else f"printed no URL in {self.start_timeout} s"
            )
            raise RuntimeError(f"the dev server {what}: {self.stderr_tail}")
        return self

    def stop(self) -> None:
        """Terminate the process (kill it after 10 s)."""
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    @property
    def stderr_tail(self) -> str:
        """The last 50 lines the process wrote to stderr."""
        self._stderr.seek(0)
        return "".join(self._stderr.readlines()[-50:])

    def __enter__(self) -> DevServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> DevServerProcess:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)
