"""The process-wide state of strands_slime, with one owner.

slime calls ``generate`` and ``reward_func`` as plain functions, hundreds of times per rollout, so
what must outlive one call lives here: HTTP clients, loaded tokenizers, chat templaters, rollout
configs, chat-template files, sandboxes, episode executors (worker processes), math-verify workers, the
one-time start-up results, the messages already logged, and the garbage-collector tuning. :func:`get_runtime` creates the
:class:`Runtime` on first use; :meth:`Runtime.close` releases what it holds (clients, sandboxes,
workers) from async code, :meth:`Runtime.reset` does the same synchronously (tests, interpreter
exit).

This module imports nothing of the package (every other module may import it); the caches hold
whatever their users put there and are released by duck typing (``close()``/``kill()``).

State scoped to one event loop (per-loop start-up gates, abort watchers, a client's per-loop
sessions) stays with its module in ``WeakKeyDictionary``s keyed by the loop, and goes with the loop.
Pure memoisation of deterministic functions (answer normalisation, grammar compiles) stays in
``functools`` caches: it holds no resources and cannot go stale.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import gc
import inspect
import logging
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterable, Iterator
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
)
"""The caches a :class:`Runtime` holds, by attribute name."""
YOUNG_COLLECTION_EVERY = 8
"""With the GC tuned, a young (gen-0) collection after this many episodes ended. Freeing an episode
frees hundreds of old objects, and CPython lowers its allocation count for each one, so while
episodes end the young generation outgrows its threshold unseen and its next collection is long."""
YOUNG_COLLECTION_EVERY_REPLIES = 32
"""With the GC tuned, a young (gen-0) collection after this many model replies were handled. A reply
frees what its request held since it was sent (old objects by then), and each one lowers CPython's
allocation count as above: when a wave of replies arrives at once, the young generation grows far
past its threshold before the count says so (35-38 ms gen-1 pauses at 1,024 episodes in flight)."""
FULL_COLLECTION_INTERVAL_S = 300.0
"""With the GC tuned, how long at most between full collections when the process never runs out of
live episodes (fully asynchronous rollouts); otherwise they run each time the last episode ends."""
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
        self._gc_saved_threshold: tuple[int, int, int] | None = None
        self.live_episodes = 0
        """Episodes running in this process now (:meth:`episode`)."""
        self.full_collections = 0
        """Full collections :meth:`episode` ran (the GC tuned), at quiet points or when overdue."""
        self.quiet_collections = 0
        """Those of them that ran with no episode live (at a quiet point)."""
        self._last_full_collection = time.monotonic()
        self._ended_since_young_collection = 0
        self._replies_since_young_collection = 0
        self.young_collections = 0
        """Young collections scheduled by :meth:`episode` and :meth:`reply_handled` (the GC tuned)."""

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

    # ------------------------------------------------------------------ garbage collector

    @property
    def gc_tuned(self) -> bool:
        """Whether :meth:`tune_gc` is in effect."""
        return self._gc_saved_threshold is not None

    def tune_gc(self, thresholds: tuple[int, int, int]) -> bool:
        """Freeze what is alive now, set the collector's thresholds and move full collections to quiet points.

        Why: a collection walks every object of the generations it collects, so its pause grows with
        what is alive. The long-lived heap (slime's, ours) is frozen once, small young generations
        keep each gen-0/gen-1 pause short, and the full (gen-2) collection, whose pause grows with the
        episodes in flight (hundreds of milliseconds at a thousand), is left to :meth:`episode`: it
        runs when the last live episode ends, then freezes what survived (long-lived again), or every
        :data:`FULL_COLLECTION_INTERVAL_S` when the process never runs out of episodes. Give
        ``thresholds[2]`` large so CPython's own full collections stay out of the way.

        Once per runtime: later calls do nothing until :meth:`restore_gc` (or a reset/close) undoes it.

        Returns:
            True when this call tuned the collector.
        """
        with self.lock:
            if self._gc_saved_threshold is not None:
                return False
            self._gc_saved_threshold = gc.get_threshold()
            gc.freeze()
            gc.set_threshold(*thresholds)
            self._last_full_collection = time.monotonic()
            return True

    def restore_gc(self) -> None:
        """Undo :meth:`tune_gc`: unfreeze the frozen objects and restore the thresholds it found."""
        with self.lock:
            saved, self._gc_saved_threshold = self._gc_saved_threshold, None
            if saved is None:
                return
            gc.unfreeze()
            gc.set_threshold(*saved)

    @contextlib.contextmanager
    def episode(self) -> Iterator[None]:
        """Count one live episode for the block; with the GC tuned, the last one to end triggers the
        full collection (see :meth:`tune_gc`) and every :data:`YOUNG_COLLECTION_EVERY`-th a young one,
        run from the event loop right after the episode's own frame is gone, or at once outside a loop."""
        with self.lock:
            self.live_episodes += 1
        try:
            yield
        finally:
            with self.lock:
                self.live_episodes -= 1
                due = self._full_collection_due()
                self._ended_since_young_collection += 1
                young_due = (
                    self.gc_tuned and not due and self._ended_since_young_collection >= YOUNG_COLLECTION_EVERY
                )
                if due or young_due:
                    self._ended_since_young_collection = 0
                    self._replies_since_young_collection = 0
            if due:
                self._soon(self._full_collection)
            elif young_due:
                self._soon(self._young_collection)

    def reply_handled(self) -> None:
        """Count one model reply handled; with the GC tuned, every
        :data:`YOUNG_COLLECTION_EVERY_REPLIES`-th schedules a young collection on the running loop."""
        if not self.gc_tuned:
            return
        with self.lock:
            self._replies_since_young_collection += 1
            if self._replies_since_young_collection < YOUNG_COLLECTION_EVERY_REPLIES:
                return
            self._replies_since_young_collection = 0
        self._soon(self._young_collection)

    def _young_collection(self) -> None:
        """Collect the young generation, and the middle one when CPython would with it: an explicit
        ``gc.collect(0)`` counts toward the middle generation's threshold but never collects it, so
        young collections alone would let it grow without bound."""
        with self.lock:
            self.young_collections += 1
        gc.collect(1 if gc.get_count()[1] > gc.get_threshold()[1] else 0)

    @staticmethod
    def _soon(collect: Callable[[], Any]) -> None:
        """Run ``collect`` from the running loop once the current callback is done (its frames, and
        what only they held, gone), or at once outside a loop."""
        try:
            asyncio.get_running_loop().call_soon(collect)
        except RuntimeError:
            collect()

    def _full_collection_due(self) -> bool:
        """With the GC tuned: no episode is live, or the last full collection is overdue (call under
        the lock)."""
        return self.gc_tuned and (
            self.live_episodes == 0
            or time.monotonic() - self._last_full_collection >= FULL_COLLECTION_INTERVAL_S
        )

    def _full_collection(self) -> None:
        """A full collection if still due (an episode may have started since it was scheduled);
        freeze what survived when no episode is live, so later collections skip it."""
        with self.lock:
            if not self._full_collection_due():
                return
            quiet = self.live_episodes == 0
            self._last_full_collection = time.monotonic()
            self.full_collections += 1
            self.quiet_collections += quiet
        started = time.perf_counter()
        found = gc.collect()
        with self.lock:
            if quiet and self.live_episodes == 0 and self.gc_tuned:
                gc.freeze()
        logger.debug(
            "full garbage collection (%s): %d unreachable objects, %.1f ms",
            "quiet point" if quiet else "overdue",
            found,
            (time.perf_counter() - started) * 1000,
        )

    # ------------------------------------------------------------------ release

    def _take_all(
        self, keep: frozenset[str] = frozenset()
    ) -> tuple[list[Any], list[tuple[asyncio.AbstractEventLoop, Any]], list[Any]]:
        """Empty every cache but those named in ``keep``; return what needs releasing: clients,
        (loop, resource) pairs (episode executors first, then sandboxes) and math-verify verifiers."""
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
            for name in CACHE_NAMES:
                if name not in keep:
                    getattr(self, name).clear()
        return clients, per_loop, verifiers

    async def close(self) -> None:
        """Release everything and empty every cache; safe to call again or concurrently.

        Clients and the episode executors and sandboxes of the running loop are closed here (executor
        workers exit; they are killed after a grace period); those of another live loop are closed on
        that loop (waiting at most 10 s each); those of a closed or stopped loop are killed at once.
        math-verify workers are stopped off the event loop. The garbage-collector
        tuning is undone. A failure to release one resource is logged and the rest still released.
        """
        clients, per_loop, verifiers = self._take_all()
        self.restore_gc()
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
        """Synchronous :meth:`close` for tests and interpreter exit: empty the caches, undo the GC tuning.

        A sandbox or an episode executor is closed on its event loop when that loop is idle (a
        module-scoped test loop between tests; at most 10 s), else killed at once (an executor waits a
        bounded time for its workers to exit); math-verify workers are stopped. Clients are only dropped: their
        sessions close with their event loop (``asyncio.run`` closes them at its end). From async code
        prefer ``await close()``.

        Args:
            keep: names of caches (:data:`CACHE_NAMES`) left as they are; the test suite keeps the
                tokenizers and math-verify workers, which take a second or two each to load and whose
                answers do not depend on earlier tests.

        Raises:
            ValueError: ``keep`` names a cache that does not exist (nothing is reset then).
        """
        _, per_loop, verifiers = self._take_all(frozenset(keep))
        self.restore_gc()
        for loop, resource in per_loop:
            _close_now(loop, resource)
        for verifier in verifiers:
            try:
                verifier.close()
            except Exception:
                logger.exception("stopping math-verify workers failed")

    def is_empty(self) -> bool:
        """True when no cache holds anything and the GC is not tuned (what a full reset leaves)."""
        with self.lock:
            return not any(getattr(self, name) for name in CACHE_NAMES) and not self.gc_tuned


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
