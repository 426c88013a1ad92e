"""The process-wide state of strands_slime, with one owner.

slime calls ``generate`` and ``reward_func`` as plain functions, so what must outlive one call
(clients, tokenizers, templaters, configs, sandboxes, executors, math-verify workers, one-time
results, the GC tuning's state) lives in the :class:`Runtime` of :func:`get_runtime`. This module
imports nothing of the package; caches are released by duck typing (``close()``/``kill()``,
``reset()``). It owns caches, not policies. Per-loop state stays with its module in
``WeakKeyDictionary``s keyed by the loop; pure memoisation stays in ``functools`` caches (no
resources, cannot go stale).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import inspect
import logging
import threading
import weakref
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

__all__ = ["CACHE_NAMES", "Runtime", "get_runtime"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

CACHE_NAMES = (
    "clients",
    "tokenizers",
    "templaters",
    "configs",
    "texts",
    "loaded",
    "verifiers",
    "sandboxes",
    "executors",
    "logged",
    "counters",
    "state",
)
"""The caches a :class:`Runtime` holds, by attribute name."""
_CLOSE_WAIT_S = 10.0
"""How long :meth:`Runtime.close` waits for one resource of another live event loop to close (and
:meth:`Runtime.reset` for one on an idle loop)."""


class Runtime:
    """Every process-wide cache of the package, closable and resettable.

    The caches are plain dicts for their users to read and fill (``runtime.clients[key] = client``);
    :meth:`cached` does a get-or-create under the runtime's lock for users called from several
    threads. Hold no reference to a cache across :meth:`reset`/:meth:`close`: they empty it in place.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.clients: dict[Hashable, Any] = {}
        """SGLang clients per router URL and settings (``rollout.get_client``)."""
        self.tokenizers: dict[Hashable, Any] = {}
        """Hugging Face tokenizers per path (``tokenizer.load_tokenizer``)."""
        self.templaters: dict[Hashable, Any] = {}
        """Chat templaters per tokenizer, template and options (``chat.get_templater``)."""
        self.configs: dict[Hashable, Any] = {}
        """Validated rollout configs per source (``config.get_rollout_config``)."""
        self.texts: dict[str, str] = {}
        """Files read once (chat templates named in the rollout config)."""
        self.loaded: dict[Hashable, Any] = {}
        """Results of ``startup.load_once`` (one-time blocking loads run in a worker thread)."""
        self.verifiers: dict[Hashable, Any] = {}
        """math-verify worker pools per settings (``math_answer.get_math_verifier``)."""
        self.sandboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Any]] = (
            weakref.WeakKeyDictionary()
        )
        """Shared sandboxes per event loop and sandbox config (``sandbox.get_shared_sandbox``)."""
        self.executors: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, Any]] = (
            weakref.WeakKeyDictionary()
        )
        """Episode executors (their worker processes) per event loop and key (``executor.get_executor``)."""
        self.logged: set[str] = set()
        """Messages :meth:`first_time` has seen (errors logged once per process)."""
        self.counters: collections.Counter[str] = collections.Counter()
        """Process-wide event counts (:meth:`count`), e.g. abort-flag reads that raised."""
        self.state: dict[str, Any] = {}
        """Process-wide stateful objects of other modules (``rollout.gc_policy``'s policy, whether this
        process is an executor worker, ...); :meth:`reset`/:meth:`close` call ``reset()`` on those that
        have it before emptying the dict."""

    # ------------------------------------------------------------------ caches

    def cached(self, cache: dict[Hashable, T], key: Hashable, create: Callable[[], T]) -> T:
        """``cache[key]``, created by ``create()`` on first use.

        ``create`` runs outside the lock (it may be slow, e.g. loading a tokenizer), so two threads
        asking at the same time may both create; the first stored value wins and both get it.
        """
        with self.lock:
            if key in cache:
                return cache[key]
        value = create()
        with self.lock:
            return cache.setdefault(key, value)

    def read_text(self, path: str) -> str:
        """The UTF-8 text of ``path``, read once per process.

        Raises:
            OSError: the file cannot be read (nothing is cached then).
        """
        with self.lock:
            text = self.texts.get(path)
        if text is None:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            with self.lock:
                text = self.texts.setdefault(path, text)
        return text

    def first_time(self, message: str) -> bool:
        """True the first time ``message`` is seen in this process (to log an error once, not per sample)."""
        with self.lock:
            if message in self.logged:
                return False
            self.logged.add(message)
            return True

    def count(self, name: str, amount: int = 1) -> int:
        """Add ``amount`` to the process-wide counter ``name``; returns its new value."""
        with self.lock:
            self.counters[name] += amount
            return self.counters[name]

    # ------------------------------------------------------------------ release

    def _take_all(
        self, keep: frozenset[str] = frozenset()
    ) -> tuple[list[Any], list[tuple[asyncio.AbstractEventLoop, Any]], list[Any]]:
        """Empty every cache but those named in ``keep`` (the stateful objects reset first); return what
        needs releasing: clients, (loop, resource) pairs (episode executors first, then sandboxes) and
        math-verify verifiers."""
        unknown = keep - set(CACHE_NAMES)
        if unknown:
            raise ValueError(f"no such runtime caches: {sorted(unknown)}; known: {', '.join(CACHE_NAMES)}")
        with self.lock:
            clients = [] if "clients" in keep else list(self.clients.values())
            per_loop = [
                (loop, resource)
                for name in ("executors", "sandboxes")  # workers first: they hold sandboxes of their own
                if name not in keep
                for loop, resources in list(getattr(self, name).items())
                for resource in resources.values()
            ]
            verifiers = [] if "verifiers" in keep else list(self.verifiers.values())
            stateful = [] if "state" in keep else list(self.state.values())
            for name in CACHE_NAMES:
                if name not in keep:
                    getattr(self, name).clear()
        for value in stateful:
            reset = getattr(value, "reset", None)
            if callable(reset):
                try:
                    reset()
                except Exception:
                    logger.exception("resetting %r failed", value)
        return clients, per_loop, verifiers

    async def close(self) -> None:
        """Release everything and empty every cache; safe to call again or concurrently.

        Resources of another live loop are closed on that loop (at most 10 s each), those of a closed
        loop killed at once. A failure to release one resource is logged and the rest still released.
        """
        clients, per_loop, verifiers = self._take_all()
        running = asyncio.get_running_loop()
        for client in clients:
            await _quietly(client.close(), f"closing {client!r}")
        for loop, resource in per_loop:
            if loop is running:
                await _quietly(resource.close(), f"closing {resource!r}")
            elif loop.is_running() and not loop.is_closed():
                future = asyncio.run_coroutine_threadsafe(resource.close(), loop)
                await _quietly(
                    asyncio.wait_for(asyncio.wrap_future(future), _CLOSE_WAIT_S),
                    f"closing {resource!r} on its loop",
                )
            else:
                _kill_quietly(resource)
        for verifier in verifiers:
            await _quietly(asyncio.to_thread(verifier.close), "stopping math-verify workers")

    def reset(self, *, keep: Iterable[str] = ()) -> None:
        """Synchronous :meth:`close` for tests and interpreter exit; from async code prefer ``await close()``.

        Sandboxes and executors are closed on their loop when it is idle (at most 10 s), else killed.
        Clients are only dropped: their sessions close with their event loop.

        Args:
            keep: names of caches (:data:`CACHE_NAMES`) left as they are; the test suite keeps the
                tokenizers and math-verify workers, which take a second or two each to load and whose
                answers do not depend on earlier tests.

        Raises:
            ValueError: ``keep`` names a cache that does not exist (nothing is reset then).
        """
        _, per_loop, verifiers = self._take_all(frozenset(keep))
        for loop, resource in per_loop:
            _close_now(loop, resource)
        for verifier in verifiers:
            try:
                verifier.close()
            except Exception:
                logger.exception("stopping math-verify workers failed")

    def is_empty(self) -> bool:
        """True when no cache holds anything (what a full reset leaves)."""
        with self.lock:
            return not any(getattr(self, name) for name in CACHE_NAMES)


async def _quietly(awaitable: Any, what: str) -> None:
    try:
        await awaitable
    except Exception:
        logger.exception("%s failed", what)
    finally:
        if inspect.iscoroutine(awaitable):
            awaitable.close()  # no "never awaited" warning when the await above never started it


def _close_now(loop: asyncio.AbstractEventLoop, resource: Any) -> None:
    """Close ``resource`` (a sandbox, an episode executor) synchronously: on its loop when that loop
    is idle, else by killing it."""
    if not loop.is_closed() and not loop.is_running():
        try:
            loop.run_until_complete(asyncio.wait_for(resource.close(), _CLOSE_WAIT_S))
            return
        except Exception:
            logger.exception("closing %r on its idle loop failed; killing it", resource)
    _kill_quietly(resource)


def _kill_quietly(resource: Any) -> None:
    try:
        resource.kill()
    except Exception:
        logger.exception("killing %r failed", resource)


_RUNTIME: Runtime | None = None
_RUNTIME_LOCK = threading.Lock()


def get_runtime() -> Runtime:
    """The process's :class:`Runtime`, created on first use (and reset at interpreter exit)."""
    global _RUNTIME
    runtime = _RUNTIME
    if runtime is None:
        with _RUNTIME_LOCK:
            if _RUNTIME is None:
                _RUNTIME = Runtime()
                atexit.register(_RUNTIME.reset)
            runtime = _RUNTIME
    return runtime
