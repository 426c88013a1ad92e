"""math-verify equivalence checks in worker processes with a hard deadline.

math-verify's own timeouts use ``signal.alarm``, which only works on a main thread, and sympy can hang
on inputs like ``10^{10^{10}}``; so each check runs in a warm child process
(``python -m strands_slime.reward.math_answer --worker``, JSON lines over pipes) that is killed past its
deadline. The shared verifiers are kept by the runtime (:mod:`strands_slime.runtime`), which stops
their workers on reset, close and interpreter exit.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

from strands_slime.runtime import get_runtime

__all__ = ["MathVerifier", "VerifyOutcome", "get_math_verifier", "math_verify_available", "worker_main"]

logger = logging.getLogger(__name__)

VerifyOutcome = Literal["equal", "different", "timeout", "error", "unavailable"]
_STARTUP_TIMEOUT_S = 120.0
_CACHE_SIZE = 8192
_RETRY_START_AFTER_S = 60.0


@functools.cache
def math_verify_available() -> bool:
    """Whether the optional ``math-verify`` package is importable (``pip install 'strands-slime[verify]'``).

    Cached: ``find_spec`` costs ~75 µs, more than scoring an answer.
    """
    return importlib.util.find_spec("math_verify") is not None


def _as_latex(text: str) -> str:
    """Wrap bare answers in ``$...$`` so math-verify reads ``34 or 35`` as a set, not as ``34``."""
    stripped = text.strip()
    if "$" in stripped or "\\(" in stripped or "\\[" in stripped:
        return stripped
    return f"${stripped}$"


class _WorkerProcess:
    """One ``python -m strands_slime.reward.math_answer --worker`` child speaking JSON lines."""

    def __init__(self) -> None:
        package_root = str(Path(__file__).resolve().parents[3])  # the directory holding strands_slime/
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "strands_slime.reward.math_answer", "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        self._buffer = b""
        try:
            line = self._read_line(time.monotonic() + _STARTUP_TIMEOUT_S)
            hello = (
                json.loads(line) if line is not None else {"error": "no answer before the start-up timeout"}
            )
            if not hello.get("ready"):
                raise RuntimeError(f"math-verify worker failed to start: {hello.get('error')}")
        except BaseException:
            self.kill()
            raise

    def _read_line(self, deadline: float) -> str | None:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError("math-verify worker exited")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def request(self, gold: str, pred: str, timeout_s: float) -> VerifyOutcome:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"gold": gold, "pred": pred}).encode() + b"\n")
        self.process.stdin.flush()
        line = self._read_line(time.monotonic() + timeout_s)
        if line is None:
            return "timeout"
        reply = json.loads(line)
        if "error" in reply:
            return "error"
        return "equal" if reply["equal"] else "different"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


class MathVerifier:
    """math-verify equivalence checks in warm worker processes, each with a hard deadline.

    At most ``workers`` child processes exist; each serves one check at a time from this verifier's
    own threads. A check that exceeds ``timeout_s`` kills its worker (the next check starts a fresh
    one) and counts as not equivalent. Results are cached: a GRPO group often repeats an answer.
    ``verify`` is async and never blocks the event loop; ``verify_blocking`` is for threads/scripts.
    """

    def __init__(self, timeout_s: float = 2.0, workers: int = 1) -> None:
        if not timeout_s > 0 or workers < 1:
            raise ValueError(f"need timeout_s > 0 and workers >= 1, got {timeout_s=} {workers=}")
        self.timeout_s = timeout_s
        self.workers = workers
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="math-verify")
        self._local = threading.local()
        self._lock = threading.Lock()
        self._live: set[_WorkerProcess] = set()
        self._cache: OrderedDict[tuple[str, str], VerifyOutcome] = OrderedDict()
        self._disabled_until = 0.0
        self._closed = False
        self.stats = {"checks": 0, "cache_hits": 0, "timeouts": 0, "errors": 0, "worker_starts": 0}

    def _cached(self, key: tuple[str, str]) -> VerifyOutcome | None:
        with self._lock:
            self.stats["checks"] += 1
            if self._closed or time.monotonic() < self._disabled_until:
                return "unavailable"
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self.stats["cache_hits"] += 1
            return cached

    def verify_blocking(self, gold: str, pred: str) -> VerifyOutcome:
        """Whether ``pred`` is mathematically equivalent to ``gold``; blocks for at most ~timeout_s."""
        cached = self._cached((gold, pred))
        if cached is not None:
            return cached
        try:
            return self._executor.submit(self._check, gold, pred).result()
        except RuntimeError:  # closed concurrently
            return "unavailable"

    async def verify(self, gold: str, pred: str) -> VerifyOutcome:
        """Async ``verify_blocking``: runs on this verifier's own threads, never on the event loop."""
        cached = self._cached((gold, pred))
        if cached is not None:
            return cached
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._check, gold, pred)
        except RuntimeError:  # closed concurrently
            return "unavailable"

    def warm_up(self) -> bool:
        """Start a worker now (otherwise the first check pays ~1 s); True when math-verify works."""
        return self.verify_blocking("1", "1") == "equal"

    def _check(self, gold: str, pred: str) -> VerifyOutcome:
        outcome = self._run_in_worker(_as_latex(gold), _as_latex(pred))
        with self._lock:
            if outcome in ("timeout", "error"):
                self.stats["timeouts" if outcome == "timeout" else "errors"] += 1
            if outcome != "unavailable":
                self._cache[(gold, pred)] = outcome
                if len(self._cache) > _CACHE_SIZE:
                    self._cache.popitem(last=False)
        return outcome

    def _run_in_worker(self, gold: str, pred: str) -> VerifyOutcome:
        worker: _WorkerProcess | None = getattr(self._local, "worker", None)
        if worker is None or worker.process.poll() is not None:
            if worker is not None:
                self._retire(worker)
            worker = self._start_worker()
            if worker is None:
                return "unavailable"
        try:
            outcome = worker.request(gold, pred, self.timeout_s)
        except (OSError, EOFError, ValueError, KeyError) as error:
            logger.warning("math-verify worker failed (%s); it will be restarted", error)
            self._retire(worker)
            return "error"
        if outcome == "timeout":
            self._retire(worker)
        return outcome

    def _start_worker(self) -> _WorkerProcess | None:
        try:
            worker = _WorkerProcess()
        except (OSError, RuntimeError, EOFError, ValueError) as error:
            with self._lock:
                self._disabled_until = time.monotonic() + _RETRY_START_AFTER_S
            logger.warning("math-verify unavailable for %.0f s: %s", _RETRY_START_AFTER_S, error)
            return None
        with self._lock:
            self.stats["worker_starts"] += 1
            if self._closed:
                worker.kill()
                return None
            self._live.add(worker)
        self._local.worker = worker
        return worker

    def _retire(self, worker: _WorkerProcess) -> None:
        worker.kill()
        with self._lock:
            self._live.discard(worker)
        self._local.worker = None

    def close(self) -> None:
        """Kill the workers; later checks answer ``unavailable``."""
        with self._lock:
            self._closed = True
            workers, self._live = list(self._live), set()
        for worker in workers:
            worker.kill()
        self._executor.shutdown(wait=False, cancel_futures=True)


def get_math_verifier(timeout_s: float = 2.0, workers: int = 1) -> MathVerifier | None:
    """The shared verifier for these settings (kept by the runtime), or None when math-verify isn't
    installed.

    Raises:
        ValueError: ``timeout_s`` is not positive or ``workers`` is below 1.
    """
    if not math_verify_available():
        return None
    key = ("math-verify", float(timeout_s), int(workers))
    runtime = get_runtime()
    with runtime.lock:  # creating one starts no process (workers start on the first check)
        verifier = runtime.verifiers.get(key)
        if verifier is None:
            verifier = runtime.verifiers[key] = MathVerifier(timeout_s=timeout_s, workers=workers)
        return verifier


def worker_main() -> None:
    """Serve math-verify checks: one JSON request per stdin line, one JSON reply per stdout line."""
    logging.disable(logging.WARNING)  # math-verify warns on every call when its own timeouts are off
    out = sys.stdout
    try:
        from math_verify import parse, verify
    except Exception as error:  # report any import failure to the parent instead of dying silently
        out.write(json.dumps({"ready": False, "error": f"{type(error).__name__}: {error}"}) + "\n")
        out.flush()
        return
    verify(parse("$1$", parsing_timeout=None), parse("$1$", parsing_timeout=None), timeout_seconds=None)
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            gold = parse(request["gold"], parsing_timeout=None)
            pred = parse(request["pred"], parsing_timeout=None)
            reply: dict[str, object] = {
                "equal": bool(gold and pred and verify(gold, pred, timeout_seconds=None))
            }
        except Exception as error:  # a bad expression must not take the worker down
            reply = {"error": f"{type(error).__name__}: {error}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
