"""Start and stop real SGLang 0.5.23 servers on the CPU for the SGLang lane (``make test-sglang``).

Each server is ``python -m sglang.launch_server`` from ``.venv-sglang`` (or ``SGLANG_PYTHON``) in its
own process group, on a free loopback port, with the flags SGLang's CPU engine needs here: the variable
``SGLANG_USE_CPU_ENGINE=1`` and ``--device cpu`` (without them it looks for ``vllm``), ``--dtype float32``
(the default runs float16, whose logprobs differ from an fp32 forward pass) and
``--attention-backend torch_native``. ``sgl_kernel`` comes from the import shim beside this file; every
server's shim log is checked when it stops: it must show the shim imported and no shim function called.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
from waiting import wait_until_sync

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIM_DIR = Path(__file__).resolve().parent / "sgl_kernel_shim"
DEFAULT_PYTHON = REPO_ROOT / ".venv-sglang" / "bin" / "python"
START_TIMEOUT_S = 600.0
"""A hang guard only: start-up takes 20-60 s on an idle 2-core box, minutes when it is shared."""
STOP_TIMEOUT_S = 60.0

CONTEXT_LENGTH = 4096
"""Small on purpose: the length limits are reached with prompts of a few thousand ids."""
MAX_TOTAL_TOKENS = 65536
"""The KV pool (fp32, 512 B a token for the tiny Qwen3). Without a cap SGLang sizes it from free RAM
(29M tokens, 14 GB here)."""

CPU_ENGINE_FLAGS = ("--device", "cpu", "--dtype", "float32", "--attention-backend", "torch_native")


def sglang_python() -> Path:
    """The interpreter of the SGLang venv (``SGLANG_PYTHON`` overrides ``.venv-sglang/bin/python``)."""
    return Path(os.environ.get("SGLANG_PYTHON") or DEFAULT_PYTHON)


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SGLangServer:
    """One real SGLang server: ``start()`` returns once ``/health`` answers 200, ``stop()`` ends its
    process group by its id and checks the ``sgl_kernel`` shim log."""

    def __init__(
        self,
        model_dir: Path,
        log_dir: Path,
        *,
        name: str = "sglang",
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        context_length: int = CONTEXT_LENGTH,
        max_total_tokens: int = MAX_TOTAL_TOKENS,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.name = name
        self.log_path = Path(log_dir) / f"{name}.log"
        self.shim_log_path = Path(log_dir) / f"{name}.sgl_kernel_shim.log"
        self.context_length = context_length
        self.max_total_tokens = max_total_tokens
        self.args = tuple(args)
        self.extra_env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.url = ""
        self.startup_s = 0.0

    def command(self) -> list[str]:
        """The launch command line."""
        return [
            str(sglang_python()),
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(self.model_dir),
            *CPU_ENGINE_FLAGS,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--context-length",
            str(self.context_length),
            "--max-total-tokens",
            str(self.max_total_tokens),
            "--random-seed",
            "0",
            *self.args,
        ]

    def start(self, timeout: float = START_TIMEOUT_S) -> SGLangServer:
        """Launch and wait until ``/health`` answers 200.

        Raises:
            RuntimeError: the SGLang venv is missing, or the server exited during start-up (the log's
                tail is in the message).
            AssertionError: it did not become healthy within ``timeout`` seconds.
        """
        if not sglang_python().exists():
            raise RuntimeError(f"no SGLang venv at {sglang_python()}: run `make test-sglang`")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.shim_log_path.unlink(missing_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "SGLANG_USE_CPU_ENGINE": "1",
            "PYTHONPATH": str(SHIM_DIR),
            "SGL_KERNEL_SHIM_LOG": str(self.shim_log_path),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            **self.extra_env,
        }
        began = time.monotonic()
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # its scheduler and detokenizer are stopped with it
            )
        wait_until_sync(self._healthy, timeout=timeout, interval=0.5, what=f"{self.name} to answer /health")
        self.startup_s = time.monotonic() - began
        return self

    def _healthy(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited with status {self.process.returncode} during start-up:\n{self.log_tail()}"
            )
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as reply:
                return reply.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server's log."""
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def rss_bytes(self) -> int:
        """Resident memory of the server's whole process tree (HTTP server, scheduler, detokenizer)."""
        assert self.process is not None
        root = psutil.Process(self.process.pid)
        total = 0
        for proc in (root, *root.children(recursive=True)):
            try:
                total += proc.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

    def shim_events(self) -> list[str]:
        """The ``sgl_kernel`` shim's log lines (``imported pid=…``, ``called NAME pid=…``)."""
        if not self.shim_log_path.exists():
            return []
        return self.shim_log_path.read_text().splitlines()

    def check_shim(self) -> None:
        """Raise unless SGLang imported the shim and called none of its functions.

        Raises:
            AssertionError: the shim was not imported, or a shim function was called.
        """
        events = self.shim_events()
        assert any(e.startswith("imported") for e in events), (
            f"{self.name}: SGLang did not import the sgl_kernel shim ({self.shim_log_path})"
        )
        called = [e for e in events if e.startswith("called")]
        assert not called, f"{self.name}: sgl_kernel shim functions were called: {called}"

    def stop(self) -> None:
        """SIGTERM to the server's process group (by its id), SIGKILL after ``STOP_TIMEOUT_S``; then
        check the shim log.

        Raises:
            AssertionError: see :meth:`check_shim`.
        """
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(STOP_TIMEOUT_S)
            except ProcessLookupError:
                pass
        try:  # children that outlived the group leader (none expected)
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.startup_s:  # a failed start already raised with the server's log
            self.check_shim()

    def __enter__(self) -> SGLangServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ plain HTTP (sync, for fixtures)

    def post(self, path: str, body: Any, timeout: float = 120.0) -> tuple[int, Any]:
        """``POST path`` with a JSON body; returns (status, decoded JSON or text or None)."""
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                return reply.status, _decode(reply.read())
        except urllib.error.HTTPError as error:
            return error.code, _decode(error.read())

    def get(self, path: str, timeout: float = 60.0) -> tuple[int, Any]:
        """``GET path``; returns (status, decoded JSON or text or None)."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as reply:
                return reply.status, _decode(reply.read())
        except urllib.error.HTTPError as error:
            return error.code, _decode(error.read())


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")
