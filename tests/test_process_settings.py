"""``rollout_settings()``: the generate path's process-wide savings for an agent driven by hand, asked for
explicitly and wired as the README writes it; the same trajectory as without them."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from strands.telemetry.tracer import Tracer
from test_model_history import PROMPT, SCRIPT, make_agent, trajectory_lists

import strands_slime
from strands_slime.devserver import DevServer
from strands_slime.provider.client import SGLangClient
from strands_slime.provider.model import SGLangModel
from strands_slime.provider.telemetry import messages_of_unrecorded_spans_skipped
from strands_slime.rollout.gc_policy import GC_THRESHOLDS, gc_policy
from strands_slime.rollout.process_settings import rollout_settings
from strands_slime.runtime import get_runtime

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    """Whatever a test tunes, the runtime's reset undoes (as at the end of a rollout process)."""
    threshold = gc.get_threshold()
    yield
    gc_policy().reset()
    assert gc.get_threshold() == threshold and gc.get_freeze_count() == 0


@pytest.fixture
async def server_url() -> AsyncIterator[str]:
    server = await DevServer(backend="scripted", script=SCRIPT).start()
    yield server.url
    await server.stop()


async def run_episode(tokenizer: Any, url: str, settings: Any = None) -> SGLangModel:
    """One episode as the README writes it (with ``settings``: wired as ``rollout_settings`` says)."""
    options = {"decode_scope": settings.decode_scope} if settings is not None else {}
    client = SGLangClient(url, retry_delay=0.01, max_retry_delay=0.05, **options)
    try:
        model = SGLangModel(tokenizer, client=client, pace=settings.pace if settings else None)
        if settings is None:
            await make_agent(model).invoke_async(PROMPT)
        else:
            with settings.episode():
                assert gc_policy().live_episodes == 1
                await make_agent(model).invoke_async(PROMPT)
        return model
    finally:
        await client.close()


async def test_the_settings_are_turned_on_by_the_call_and_give_the_same_trajectory(
    qwen3_tokenizer: Any, server_url: str
) -> None:
    plain = await run_episode(qwen3_tokenizer, server_url)
    assert gc.get_threshold() != GC_THRESHOLDS  # the model built no policy of its own
    settings = strands_slime.rollout_settings()
    assert settings.gc_tuned and settings.tracer_guarded
    assert gc.get_threshold() == GC_THRESHOLDS and gc.get_freeze_count() > 0
    assert messages_of_unrecorded_spans_skipped()
    tuned = await run_episode(qwen3_tokenizer, server_url, settings)
    assert trajectory_lists(tuned) == trajectory_lists(plain)
    assert gc_policy().live_episodes == 0
    assert gc_policy().full_collections >= 1  # the last live episode ended: a quiet point
    assert rollout_settings() == settings  # idempotent


def test_decode_scope_defers_collections_only_with_the_gc_tuned() -> None:
    with rollout_settings().decode_scope():
        assert not gc.isenabled()
    assert gc.isenabled()
    get_runtime().reset()
    untuned = rollout_settings(gc_tuning=False)
    assert not untuned.gc_tuned and gc.get_freeze_count() == 0
    with untuned.decode_scope(), untuned.episode():
        assert gc.isenabled() and gc_policy().live_episodes == 0


def test_the_tracer_guard_is_the_telemetry_modules() -> None:
    """One owner: the settings turn on ``provider.telemetry``'s guard, nothing of their own."""
    rollout_settings(gc_tuning=False)
    assert getattr(Tracer._add_event_messages, "__strands_slime_skips_unrecorded__", False)
