"""The runtime: one owner for the process-wide caches, closable, resettable, and undoing its GC tuning."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import weakref
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from strands_slime import runtime as runtime_module
from strands_slime.config import get_rollout_config
from strands_slime.provider.chat import get_templater
from strands_slime.provider.tokenizer import load_tokenizer, resolve_tokenizer_path
from strands_slime.reward.math_answer import get_math_verifier, math_verify_available
from strands_slime.rollout import episode as rollout
from strands_slime.runtime import CACHE_NAMES, Runtime, get_runtime
from strands_slime.sandbox import SandboxConfig, get_shared_sandbox

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


def test_gc_tuning_is_undone_by_reset() -> None:
    runtime = Runtime()
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    assert runtime.tune_gc((50_000, 20, 100))
    assert not runtime.tune_gc((50_000, 20, 100))  # once
    try:
        assert runtime.gc_tuned
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (50_000, 20, 100)
    finally:
        runtime.reset()
    assert not runtime.gc_tuned
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before


class _Node:
    """A reference cycle only the cyclic collector can free."""

    def __init__(self) -> None:
        self.me = self


def _old_cycle() -> weakref.ref:
    """A reference cycle that is garbage and sits in the oldest generation, where only a full
    collection looks (young collections cannot free it by accident)."""
    node = _Node()
    gc.collect()  # node survives: it is referenced here; it moves to the oldest generation
    ref = weakref.ref(node)
    del node
    return ref


@pytest.fixture
def tuned() -> Iterator[Runtime]:
    """A runtime of its own with the GC tuned the rollout's way (no automatic full collection)."""
    runtime = Runtime()
    runtime.tune_gc((2_000, 4, 1_000_000))
    yield runtime
    runtime.reset()


def test_the_last_live_episode_runs_the_full_collection_and_freezes_the_survivors(tuned: Runtime) -> None:
    with tuned.episode():
        with tuned.episode():
            garbage = _old_cycle()
            assert tuned.live_episodes == 2
        assert garbage() is not None  # one episode still live: no full collection
        assert tuned.full_collections == 0
        survivor = _Node()  # alive at the quiet point: frozen with the rest
        frozen_before = gc.get_freeze_count()
    assert tuned.live_episodes == 0
    assert garbage() is None
    assert tuned.full_collections == tuned.quiet_collections == 1
    assert gc.get_freeze_count() > frozen_before
    assert survivor.me is survivor


def test_the_full_collection_runs_on_the_loop_after_the_episode(tuned: Runtime) -> None:
    async def main() -> tuple[bool, bool]:
        with tuned.episode():
            garbage = _old_cycle()
        scheduled = garbage() is not None  # not inside the episode's own frame: a loop callback
        await asyncio.sleep(0)
        return scheduled, garbage() is None

    assert asyncio.run(main()) == (True, True)
    assert tuned.full_collections == 1


def test_an_overdue_full_collection_runs_with_episodes_live_but_freezes_nothing(
    tuned: Runtime, monkeypatch
) -> None:
    monkeypatch.setattr(runtime_module, "FULL_COLLECTION_INTERVAL_S", 0.0)
    with tuned.episode():
        with tuned.episode():
            garbage = _old_cycle()
        frozen = gc.get_freeze_count()
        assert garbage() is None
        assert (tuned.full_collections, tuned.quiet_collections) == (1, 0)
        assert gc.get_freeze_count() == frozen  # live episodes' objects are not frozen


def test_every_eighth_episode_to_end_runs_a_young_collection() -> None:
    runtime = Runtime()
    runtime.tune_gc((1_000_000, 1_000_000, 1_000_000))  # no collection of CPython's own in between
    try:
        with runtime.episode():  # one stays live: no quiet point
            before = gc.get_stats()[0]["collections"]
            for _ in range(runtime_module.YOUNG_COLLECTION_EVERY - 1):
                with runtime.episode():
                    pass
            assert gc.get_stats()[0]["collections"] == before
            with runtime.episode():
                pass
            assert gc.get_stats()[0]["collections"] == before + 1
            assert runtime.full_collections == 0
    finally:
        runtime.reset()


def test_every_32nd_handled_reply_runs_a_young_collection_on_the_loop() -> None:
    runtime = Runtime()
    runtime.tune_gc((1_000_000, 1_000_000, 1_000_000))  # no collection of CPython's own in between

    async def main() -> tuple[int, int, int]:
        before = gc.get_stats()[0]["collections"]
        for _ in range(runtime_module.YOUNG_COLLECTION_EVERY_REPLIES - 1):
            runtime.reply_handled()
        await asyncio.sleep(0)
        not_yet = gc.get_stats()[0]["collections"] - before
        runtime.reply_handled()
        scheduled = gc.get_stats()[0]["collections"] - before  # a loop callback, not in the caller
        await asyncio.sleep(0)
        return not_yet, scheduled, gc.get_stats()[0]["collections"] - before

    try:
        with runtime.episode():  # one live: no quiet point
            assert asyncio.run(main()) == (0, 0, 1)
            assert (runtime.young_collections, runtime.full_collections) == (1, 0)
    finally:
        runtime.reset()


def test_scheduled_young_collections_also_collect_the_middle_generation_when_due() -> None:
    """``gc.collect(0)`` never collects generation 1 but counts toward it: the runtime's young
    collections collect it when CPython's own would, so it cannot grow without bound."""
    runtime = Runtime()
    runtime.tune_gc((1_000_000, 1, 1_000_000))
    try:
        with runtime.episode():
            gc.collect(1)  # the middle generation's count starts at 0
            before = [stats["collections"] for stats in gc.get_stats()]
            for _ in range(4):
                for _ in range(runtime_module.YOUNG_COLLECTION_EVERY):
                    with runtime.episode():  # outside a loop: the young collection runs at once
                        pass
            after = [stats["collections"] for stats in gc.get_stats()]
        assert runtime.young_collections == 4
        # As CPython's own: the middle generation once its count (young collections since its last
        # one) passes the threshold of 1, i.e. after every second young-only collection.
        assert (after[0] - before[0], after[1] - before[1], after[2] - before[2]) == (3, 1, 0)
    finally:
        runtime.reset()


def test_without_gc_tuning_replies_collect_nothing() -> None:
    runtime = Runtime()
    before = gc.get_stats()[0]["collections"]
    for _ in range(runtime_module.YOUNG_COLLECTION_EVERY_REPLIES * 2):
        runtime.reply_handled()
    assert runtime.young_collections == 0
    assert gc.get_stats()[0]["collections"] - before <= 1  # at most one of CPython's own


def test_without_gc_tuning_episodes_are_counted_and_nothing_is_collected() -> None:
    runtime = Runtime()
    with runtime.episode():
        garbage = _old_cycle()
        assert runtime.live_episodes == 1
    assert runtime.live_episodes == 0
    assert runtime.full_collections == 0
    assert garbage() is not None
    gc.collect()


def test_rollout_tunes_the_gc_through_the_runtime() -> None:
    rollout.tune_gc_once()
    assert get_runtime().gc_tuned
    assert gc.get_freeze_count() > 0
    # ... and the autouse fixture's reset undoes it: see test_the_previous_test_left_nothing_behind


def test_the_previous_test_left_nothing_behind() -> None:
    """Runs after the test above (pytest keeps file order): conftest's reset undid its gc.freeze()."""
    assert gc.get_freeze_count() == 0
    assert not get_runtime().gc_tuned
    runtime = get_runtime()
    assert not any(getattr(runtime, name) for name in CACHE_NAMES if name not in ("tokenizers", "verifiers"))


def test_reset_empties_every_cache_filled_through_the_public_apis(runtime: Runtime, tmp_path, caplog) -> None:
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
    with caplog.at_level(logging.ERROR, logger="strands_slime.rollout.episode"):
        rollout._log_once("configuration broken")
        rollout._log_once("configuration broken")
    assert caplog.text.count("configuration broken") == 1
    verifier = get_math_verifier() if math_verify_available() else None
    runtime.tune_gc((50_000, 20, 100))
    assert runtime.tokenizers and runtime.templaters and runtime.configs and runtime.clients
    assert runtime.texts and runtime.logged and not runtime.is_empty()

    runtime.reset()

    assert runtime.is_empty()
    assert gc.get_freeze_count() == 0
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
        runtime.tune_gc((50_000, 20, 100))
        await asyncio.gather(runtime.close(), runtime.close())
        assert client.closed and sandbox.closed
        assert pid is not None and await _until(lambda: not _pid_alive(pid))  # reaped by the loop
        assert runtime.is_empty()
        assert gc.get_freeze_count() == 0
        await runtime.close()  # nothing left: a no-op

    asyncio.run(main())
