"""The runtime: one owner for the process-wide caches, counters and stateful objects, closable and resettable."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from strands_slime.config import get_rollout_config
from strands_slime.provider.chat import get_templater
from strands_slime.provider.tokenizer import load_tokenizer, resolve_tokenizer_path
from strands_slime.reward.math_answer import get_math_verifier, math_verify_available
from strands_slime.rollout import startup as rollout
from strands_slime.rollout.gc_policy import gc_policy, tune_gc_once
from strands_slime.runtime import CACHE_NAMES, Runtime, get_runtime
from strands_slime.sandbox import SandboxConfig, get_shared_sandbox

pytestmark = pytest.mark.integration

LIGHT_SANDBOX = SandboxConfig(preload_modules=("math",), timeout_s=10.0)
ROUTER_ARGS = SimpleNamespace(sglang_router_ip="127.0.0.1", sglang_router_port=1)


@pytest.fixture
def runtime(qwen3_tokenizer) -> Iterator[Runtime]:
    """The process runtime, with its tokenizers put back after a test that resets everything."""
    runtime = get_runtime()
    tokenizers = dict(runtime.tokenizers)
    yield runtime
    runtime.reset()
    runtime.tokenizers.update(tokenizers)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers signal 0; the sandbox reaps its zygote, so check the state too
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:  # reaped in between
        return False


async def _until(predicate, timeout_s: float = 10.0) -> bool:
    """Poll ``predicate`` on the loop until it holds or ``timeout_s`` passes; its final value."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)
    return predicate()


def test_one_runtime_per_process() -> None:
    assert get_runtime() is get_runtime()


def test_counters_and_stateful_objects_are_the_runtimes() -> None:
    runtime = Runtime()

    class Stateful:
        resets = 0

        def reset(self) -> None:
            Stateful.resets += 1

    assert runtime.count("events") == 1 and runtime.count("events", 2) == 3
    runtime.state["thing"] = Stateful()
    assert not runtime.is_empty()
    runtime.reset()
    assert Stateful.resets == 1, "reset() is called on each stateful object before the runtime forgets it"
    assert runtime.counters["events"] == 0 and runtime.is_empty()


def test_the_previous_test_left_nothing_behind() -> None:
    """conftest's reset runs after every test: nothing but the kept caches survives a test."""
    assert gc.get_freeze_count() == 0
    runtime = get_runtime()
    assert not any(getattr(runtime, name) for name in CACHE_NAMES if name not in ("tokenizers", "verifiers"))


def test_reset_empties_every_cache_filled_through_the_public_apis(runtime: Runtime, tmp_path) -> None:
    template = tmp_path / "template.jinja"
    template.write_text("{{ messages[0]['content'] }}")
    tokenizer = load_tokenizer()
    assert runtime.tokenizers[resolve_tokenizer_path(None)] is tokenizer
    templater = get_templater(tokenizer)
    assert get_templater(tokenizer) is templater
    config = get_rollout_config(SimpleNamespace(strands_slime={"max_tool_iters": 3}))
    assert get_rollout_config(SimpleNamespace(strands_slime={"max_tool_iters": 3})) is config
    client = rollout.get_client(ROUTER_ARGS, config)
    assert rollout.get_client(ROUTER_ARGS, config) is client
    assert runtime.read_text(str(template)) == "{{ messages[0]['content'] }}"
    assert runtime.first_time("configuration broken")
    assert not runtime.first_time("configuration broken")
    verifier = get_math_verifier() if math_verify_available() else None
    tune_gc_once()
    assert runtime.tokenizers and runtime.templaters and runtime.configs and runtime.clients
    assert runtime.texts and runtime.logged and gc_policy().tuned and not runtime.is_empty()

    runtime.reset()

    assert runtime.is_empty()
    assert gc.get_freeze_count() == 0 and not gc_policy().tuned
    assert get_templater(load_tokenizer()) is not templater
    assert rollout.get_client(ROUTER_ARGS, config) is not client
    if verifier is not None:
        assert verifier.verify_blocking("1", "1") == "unavailable"  # its workers were stopped


def test_reset_refuses_an_unknown_cache_and_changes_nothing(runtime: Runtime) -> None:
    runtime.logged.add("kept")
    with pytest.raises(ValueError, match="no such runtime caches: \\['tokeniser'\\]"):
        runtime.reset(keep=["tokeniser"])
    assert runtime.logged == {"kept"}


def test_reset_can_keep_named_caches(runtime: Runtime) -> None:
    load_tokenizer()
    runtime.logged.add("gone")
    runtime.reset(keep=["tokenizers"])
    assert runtime.tokenizers and not runtime.logged


@pytest.mark.slow
def test_reset_kills_the_sandbox_of_a_finished_loop(runtime: Runtime) -> None:
    async def start() -> int:
        sandbox = get_shared_sandbox(LIGHT_SANDBOX)
        await sandbox.start()
        assert sandbox.zygote_pid is not None
        return sandbox.zygote_pid

    pid = asyncio.run(start())  # the loop closes with the sandbox still running
    sandbox = next(iter(next(iter(runtime.sandboxes.values())).values()))
    assert _pid_alive(pid)
    runtime.reset()
    assert sandbox.closed
    assert not _pid_alive(pid)
    assert not runtime.sandboxes


@pytest.mark.slow
def test_close_releases_clients_and_sandboxes_and_is_safe_to_repeat(runtime: Runtime) -> None:
    config = get_rollout_config(None)

    async def main() -> None:
        client = rollout.get_client(ROUTER_ARGS, config)
        sandbox = get_shared_sandbox(LIGHT_SANDBOX)
        assert (await sandbox.run("print(6 * 7)")).stdout == "42\n"
        pid = sandbox.zygote_pid
        tune_gc_once()
        await asyncio.gather(runtime.close(), runtime.close())
        assert client.closed and sandbox.closed
        assert pid is not None and await _until(lambda: not _pid_alive(pid))  # reaped by the loop
        assert runtime.is_empty()
        assert gc.get_freeze_count() == 0
        await runtime.close()  # nothing left: a no-op

    asyncio.run(main())
