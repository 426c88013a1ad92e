"""Start-up work that must not stall the rollout's event loop, and the process's shared resources.

slime starts every episode of a rollout at once, so set-up must pass the loop's pacing gate
(:mod:`strands_slime.rollout.pacing`): :func:`episode_turn` admits episodes in batches per iteration;
:func:`once_per_loop` runs the loop's one-time start-up before any is admitted; :func:`load_once`
runs blocking one-time work in a thread, once per process. :func:`get_client`, :func:`get_tokenizer`
and :func:`warm_up` share the client, tokenizer and template loaded this way.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import weakref
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

from strands_slime.aborts import run_abortable
from strands_slime.config import ConfigError, RolloutConfig
from strands_slime.provider.chat import get_templater
from strands_slime.provider.client import SGLangClient
from strands_slime.provider.client_errors import SGLangClientError
from strands_slime.provider.tokenizer import load_tokenizer
from strands_slime.rollout import pacing, slime_compat
from strands_slime.rollout.gc_policy import GcPolicy
from strands_slime.runtime import get_runtime

T = TypeVar("T")


async def episode_turn() -> None:
    """Wait until this episode may do its synchronous set-up (returns at once when the loop is idle):
    the loop's pacing gate (:func:`strands_slime.rollout.pacing.turn`)."""
    await pacing.turn()


_RUNNING: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, asyncio.Future[Any]]] = (
    weakref.WeakKeyDictionary()
)


async def load_once(key: Hashable, function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` in a worker thread, once per process for ``key``; concurrent callers share the
    call. A failure is not remembered: the next caller tries again.

    Returns:
        ``function``'s result, remembered for ``key`` for the rest of the process (kept by the runtime).

    Raises:
        Exception: whatever ``function`` raised, to every caller sharing that call.
    """
    runtime = get_runtime()
    with runtime.lock:
        if key in runtime.loaded:
            return runtime.loaded[key]
    running = _RUNNING.setdefault(asyncio.get_running_loop(), {})
    future = running.get(key)
    if future is None:
        future = asyncio.ensure_future(asyncio.to_thread(function, *args))
        running[key] = future

        def finished(done: asyncio.Future[Any]) -> None:
            running.pop(key, None)
            if not done.cancelled() and done.exception() is None:
                with runtime.lock:
                    runtime.loaded[key] = done.result()

        future.add_done_callback(finished)
    return await asyncio.shield(future)


class _Ready:
    """A finished start-up's result (a done future would keep its loop, this dict's weak key, alive)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


_LOOP_ONCE: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, Any]] = (
    weakref.WeakKeyDictionary()
)


async def once_per_loop(
    key: Hashable, start: Callable[[], Awaitable[T]], abort_check: Callable[[], bool] | None = None
) -> T:
    """``await start()`` once per event loop for ``key``, shared by concurrent callers; a failure is
    raised to every caller waiting for it and the next caller tries again. ``abort_check`` ends the
    wait, not the shared start.

    Raises:
        AbortedError: ``abort_check`` became true while this caller waited.
        Exception: whatever ``start()`` raised, to every caller waiting for it.
    """
    entries = _LOOP_ONCE.setdefault(asyncio.get_running_loop(), {})
    entry = entries.get(key)
    if isinstance(entry, _Ready):
        return entry.value
    if entry is None:
        entry = entries[key] = asyncio.ensure_future(start())

        def settle(done: asyncio.Future[Any]) -> None:
            if entries.get(key) is not done:
                return
            if done.cancelled() or done.exception() is not None:
                del entries[key]  # the next caller starts again
            else:
                entries[key] = _Ready(done.result())

        entry.add_done_callback(settle)
    return await run_abortable(asyncio.shield(entry), abort_check, "the rollout's start-up")


# ---------------------------------------------------------------------- the process's resources


def get_client(args: Any, config: RolloutConfig, base_url: str | None = None) -> SGLangClient:
    """One client per router URL (slime's, or ``base_url``: a frozen sub-agent's server) and client
    settings; it works on any event loop. It decodes replies with garbage collection deferred
    (``rollout.gc_policy``)."""
    settings = config.client
    key = (
        (base_url, None)
        if base_url is not None
        else (getattr(args, "sglang_router_ip", None), getattr(args, "sglang_router_port", None)),
        settings.model_dump_json(),
    )
    clients = get_runtime().clients
    client = clients.get(key)
    if client is None or client.closed:
        overrides: dict[str, Any] = {
            "timeout": settings.timeout_s,
            "max_retries": settings.max_retries,
            "retry_delay": settings.retry_delay_s,
            "connect_timeout": settings.connect_timeout_s,
            "first_byte_timeout": settings.first_byte_timeout_s,
            "stall_timeout": settings.stall_timeout_s,
            "max_retry_delay": settings.max_retry_delay_s,
            "decode_scope": GcPolicy.collections_deferred,
        }
        if settings.max_connections:
            overrides["max_connections"] = settings.max_connections
        client = (
            SGLangClient(base_url, **overrides)
            if base_url is not None
            else SGLangClient.from_slime_args(args, **overrides)
        )
        clients[key] = client
    return client


def chat_template(config: RolloutConfig) -> str | None:
    """The chat template file the rollout config names (read once per process), or None."""
    if not config.chat_template_path:
        return None
    return get_runtime().read_text(config.chat_template_path)


async def get_tokenizer(args: Any, config: RolloutConfig) -> Any:
    """slime's own tokenizer when running inside slime, else ``tokenizer_path``/``hf_checkpoint``
    (loaded once, in a worker thread), with its chat template compiled once off the loop too."""
    tokenizer = None if config.tokenizer_path else slime_compat.slime_tokenizer(args)
    if tokenizer is None:
        path = config.tokenizer_path or getattr(args, "hf_checkpoint", None)
        try:
            tokenizer = await load_once(("tokenizer", path), load_tokenizer, path)
        except Exception as exc:
            raise ConfigError(f"cannot load the tokenizer: {type(exc).__name__}: {exc}") from exc
    template = chat_template(config)
    await load_once(
        ("templater", id(tokenizer), template, config.enable_thinking, config.chat_family),
        functools.partial(
            get_templater,
            tokenizer,
            chat_template=template,
            enable_thinking=config.enable_thinking,
            chat_family=config.chat_family,
        ),
    )
    return tokenizer


async def _warm_up(args: Any, config: RolloutConfig) -> Any:
    """Everything an episode needs once per process or loop: the tokenizer and chat template (worker
    threads), the sandbox zygote and the server's context length. Done before episodes are admitted,
    so none of them waits on it mid-set-up and then resumes together with hundreds of others."""
    tokenizer = await get_tokenizer(args, config)
    if "execute_python_code" in config.tools:
        from strands_slime.sandbox import get_shared_sandbox
        from strands_slime.sandbox.base import SandboxMisconfigured

        try:
            await get_shared_sandbox(config.sandbox).start()
        except SandboxMisconfigured as exc:  # every tool call would fail alike: stop before GPU time
            raise ConfigError(str(exc)) from exc
    with contextlib.suppress(SGLangClientError):  # the model asks again and logs it
        await get_client(args, config).max_model_len()
    return tokenizer


async def warm_up(args: Any, config: RolloutConfig, abort_check: Any) -> Any:
    """The loop's one-time start-up (:func:`_warm_up`), shared by every episode of this loop that asks;
    returns the tokenizer. The episode executor's workers run it before they report ready."""
    key = (
        id(config),
        getattr(args, "sglang_router_ip", None),
        getattr(args, "sglang_router_port", None),
        getattr(args, "hf_checkpoint", None),
    )
    return await once_per_loop(key, lambda: _warm_up(args, config), abort_check)
