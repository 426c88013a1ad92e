"""The rollout's garbage-collector policy: tuning undone by the runtime's reset, full collections at
quiet points, scheduled young collections."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from strands_slime.rollout import gc_policy as gc_module
from strands_slime.rollout.gc_policy import GC_THRESHOLDS, GcPolicy, gc_policy, tune_gc_once
from strands_slime.runtime import get_runtime

pytestmark = pytest.mark.integration


def test_gc_tuning_is_undone_by_reset() -> None:
    policy = GcPolicy()
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    assert policy.tune((50_000, 20, 100))
    assert not policy.tune((50_000, 20, 100))  # once
    try:
        assert policy.tuned
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (50_000, 20, 100)
    finally:
        policy.reset()
    assert not policy.tuned
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
def tuned() -> Iterator[GcPolicy]:
    """A policy of its own with the GC tuned the rollout's way (no automatic full collection)."""
    policy = GcPolicy()
    policy.tune((2_000, 4, 1_000_000))
    yield policy
    policy.reset()


def test_the_last_live_episode_runs_the_full_collection_and_freezes_the_survivors(tuned: GcPolicy) -> None:
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


def test_the_full_collection_runs_on_the_loop_after_the_episode(tuned: GcPolicy) -> None:
    async def main() -> tuple[bool, bool]:
        with tuned.episode():
            garbage = _old_cycle()
        scheduled = garbage() is not None  # not inside the episode's own frame: a loop callback
        await asyncio.sleep(0)
        return scheduled, garbage() is None

    assert asyncio.run(main()) == (True, True)
    assert tuned.full_collections == 1


def test_an_overdue_full_collection_runs_with_episodes_live_but_freezes_nothing(
    tuned: GcPolicy, monkeypatch
) -> None:
    monkeypatch.setattr(gc_module, "FULL_COLLECTION_INTERVAL_S", 0.0)
    with tuned.episode():
        with tuned.episode():
            garbage = _old_cycle()
        frozen = gc.get_freeze_count()
        assert garbage() is None
        assert (tuned.full_collections, tuned.quiet_collections) == (1, 0)
        assert gc.get_freeze_count() == frozen  # live episodes' objects are not frozen


def test_every_eighth_episode_to_end_runs_a_young_collection() -> None:
    policy = GcPolicy()
    policy.tune((1_000_000, 1_000_000, 1_000_000))  # no collection of CPython's own in between
    try:
        with policy.episode():  # one stays live: no quiet point
            before = gc.get_stats()[0]["collections"]
            for _ in range(gc_module.YOUNG_COLLECTION_EVERY - 1):
                with policy.episode():
                    pass
            assert gc.get_stats()[0]["collections"] == before
            with policy.episode():
                pass
            assert gc.get_stats()[0]["collections"] == before + 1
            assert policy.full_collections == 0
    finally:
        policy.reset()


def test_every_32nd_handled_reply_runs_a_young_collection_on_the_loop() -> None:
    policy = GcPolicy()
    policy.tune((1_000_000, 1_000_000, 1_000_000))  # no collection of CPython's own in between

    async def main() -> tuple[int, int, int]:
        before = gc.get_stats()[0]["collections"]
        for _ in range(gc_module.YOUNG_COLLECTION_EVERY_REPLIES - 1):
            policy.reply_handled()
        await asyncio.sleep(0)
        not_yet = gc.get_stats()[0]["collections"] - before
        policy.reply_handled()
        scheduled = gc.get_stats()[0]["collections"] - before  # a loop callback, not in the caller
        await asyncio.sleep(0)
        return not_yet, scheduled, gc.get_stats()[0]["collections"] - before

    try:
        with policy.episode():  # one live: no quiet point
            assert asyncio.run(main()) == (0, 0, 1)
            assert (policy.young_collections, policy.full_collections) == (1, 0)
    finally:
        policy.reset()


def test_scheduled_young_collections_also_collect_the_middle_generation_when_due() -> None:
    """``gc.collect(0)`` never collects generation 1 but counts toward it: the runtime's young
    collections collect it when CPython's own would, so it cannot grow without bound."""
    policy = GcPolicy()
    policy.tune((1_000_000, 1, 1_000_000))
    try:
        with policy.episode():
            gc.collect(1)  # the middle generation's count starts at 0
            before = [stats["collections"] for stats in gc.get_stats()]
            for _ in range(4):
                for _ in range(gc_module.YOUNG_COLLECTION_EVERY):
                    with policy.episode():  # outside a loop: the young collection runs at once
                        pass
            after = [stats["collections"] for stats in gc.get_stats()]
        assert policy.young_collections == 4
        # As CPython's own: the middle generation once its count (young collections since its last
        # one) passes the threshold of 1, i.e. after every second young-only collection.
        assert (after[0] - before[0], after[1] - before[1], after[2] - before[2]) == (3, 1, 0)
    finally:
        policy.reset()


def test_without_gc_tuning_replies_collect_nothing() -> None:
    policy = GcPolicy()
    before = gc.get_stats()[0]["collections"]
    for _ in range(gc_module.YOUNG_COLLECTION_EVERY_REPLIES * 2):
        policy.reply_handled()
    assert policy.young_collections == 0
    assert gc.get_stats()[0]["collections"] - before <= 1  # at most one of CPython's own


def test_without_gc_tuning_episodes_are_counted_and_nothing_is_collected() -> None:
    policy = GcPolicy()
    with policy.episode():
        garbage = _old_cycle()
        assert policy.live_episodes == 1
    assert policy.live_episodes == 0
    assert policy.full_collections == 0
    assert garbage() is not None
    gc.collect()


def test_the_rollout_tunes_the_gc_through_the_process_policy_held_by_the_runtime() -> None:
    tune_gc_once()
    assert gc_policy().tuned and gc_policy() is get_runtime().state["gc_policy"]
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == GC_THRESHOLDS
    # ... and the autouse fixture's reset undoes it: see test_the_previous_test_left_the_collector_as_it_was


def test_the_previous_test_left_the_collector_as_it_was() -> None:
    """Runs after the test above (pytest keeps file order): conftest's runtime reset undid its gc.freeze()."""
    assert gc.get_freeze_count() == 0
    assert "gc_policy" not in get_runtime().state
