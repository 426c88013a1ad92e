"""An episode restored into a new SGLangModel through Strands' own agent state (``FileSessionManager``,
checkpointing, snapshots) goes on exactly as if it had never stopped: the same ids, mask and logprobs as
an uninterrupted episode. What cannot go on exactly is refused with one error saying what to do."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import tool_call
from strands import Agent
from strands.agent.conversation_manager import SlidingWindowConversationManager
from strands.session import FileSessionManager
from strands.session.snapshot_session_manager import SnapshotSessionManager
from strands.storage import LocalFileStorage
from strands_agents import as_lists, make_agent, quick_client
from threaded_app import devserver_in_thread

from strands_slime.devserver import DevServer
from strands_slime.errors import TokenStateUnavailable
from strands_slime.provider.client import SGLangClient
from strands_slime.provider.model import SGLangModel
from strands_slime.provider.saved_state import MODEL_STATE_KEY

pytestmark = pytest.mark.unit

SCRIPT = [
    {"match": "<tool_response>\nB\n", "replies": ["<think>\nBoth seen.\n</think>\n\nB it is."]},
    {"match": "SECOND", "replies": [tool_call("print('B')")]},
    {"match": "<tool_response>\nA\n", "replies": ["<think>\nSeen.\n</think>\n\nA it is."]},
    {"match": "FIRST", "replies": [tool_call("print('A')")]},
    {"match": "HELLO", "replies": ["Hello."]},
]
QUESTIONS = ("FIRST question", "SECOND question")


@pytest.fixture(scope="module")
def server() -> Iterator[DevServer]:
    with devserver_in_thread("scripted", script=SCRIPT) as running:
        yield running


@pytest.fixture
async def client(server: DevServer) -> AsyncIterator[SGLangClient]:
    client = quick_client(server.url)
    yield client
    await client.close()


def solver(model: SGLangModel, **options: Any) -> Agent:
    return make_agent(model, agent_id="solver", **options)


def sessions(tmp_path: Path) -> FileSessionManager:
    return FileSessionManager(session_id="episode-1", storage_dir=str(tmp_path))


async def uninterrupted(tokenizer: Any, client: SGLangClient) -> SGLangModel:
    model = SGLangModel(tokenizer=tokenizer, client=client)
    agent = solver(model)
    for question in QUESTIONS:
        await agent.invoke_async(question)
    return model


async def test_a_new_model_resumes_a_file_session_exactly(
    qwen3_tokenizer: Any, client: SGLangClient, server: DevServer, tmp_path: Path
) -> None:
    reference = await uninterrupted(qwen3_tokenizer, client)
    first = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    await solver(first, session_manager=sessions(tmp_path)).invoke_async(QUESTIONS[0])
    del first  # a new process: only the session directory is left

    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    agent = solver(model, session_manager=sessions(tmp_path))
    assert len(agent.messages) == 4 and MODEL_STATE_KEY in agent._model_state
    server.clear_request_log()
    await agent.invoke_async(QUESTIONS[1])
    assert as_lists(model.trajectory) == as_lists(reference.trajectory)
    assert model.recorded_outputs == reference.recorded_outputs == 4
    assert model.stats.model_calls == reference.stats.model_calls, "its counters go on too"
    first_request = server.request_log[0]["json"]["input_ids"]
    assert first_request[: len(first_request) - 1] == reference.trajectory.token_ids[: len(first_request) - 1]


async def test_a_checkpointing_agent_resumes_in_fresh_agents_and_models_exactly(
    qwen3_tokenizer: Any, client: SGLangClient, tmp_path: Path
) -> None:
    """Strands' checkpointing pauses at every cycle boundary; each resume builds a fresh Agent and a
    fresh SGLangModel on the same session, as Strands' durable-execution recipe does."""
    reference = await uninterrupted(qwen3_tokenizer, client)
    pauses = 0
    model: SGLangModel | None = None
    for question in QUESTIONS:
        model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
        agent = solver(model, session_manager=sessions(tmp_path), checkpointing=True)
        result = await agent.invoke_async(question)
        while result.stop_reason == "checkpoint":
            pauses += 1
            checkpoint = result.checkpoint.to_dict()
            model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
            agent = solver(model, session_manager=sessions(tmp_path), checkpointing=True)
            result = await agent.invoke_async({"checkpointResume": {"checkpoint": checkpoint}})
        assert result.stop_reason == "end_turn"
    assert pauses >= 4 and model is not None
    assert as_lists(model.trajectory) == as_lists(reference.trajectory)


async def test_a_snapshot_restores_the_episode_into_a_new_model(
    qwen3_tokenizer: Any, client: SGLangClient
) -> None:
    reference = await uninterrupted(qwen3_tokenizer, client)
    first = SGLangModel(tokenizer=qwen3_tokenizer, client=client, persist_tokens=True)  # no session manager
    agent = solver(first)
    await agent.invoke_async(QUESTIONS[0])
    snapshot = agent.take_snapshot(preset="session")
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    restored = solver(model)
    restored.load_snapshot(snapshot)
    await restored.invoke_async(QUESTIONS[1])
    assert as_lists(model.trajectory) == as_lists(reference.trajectory)


async def test_closed_segments_travel_with_the_session(
    qwen3_tokenizer: Any, client: SGLangClient, tmp_path: Path
) -> None:
    """A sliding window compacts the history after each invocation (fan-out: a new segment each time);
    the session keeps the window's state and the segments, and a new model goes on with both."""

    def fanout_agent(model: SGLangModel) -> Agent:
        window = SlidingWindowConversationManager(window_size=4)
        return solver(model, conversation_manager=window, session_manager=sessions(tmp_path))

    first = SGLangModel(tokenizer=qwen3_tokenizer, client=client, new_segment_on_context_change=True)
    agent = fanout_agent(first)
    for question in ("HELLO", *QUESTIONS):
        await agent.invoke_async(question)
    assert len(first.closed_trajectories) == 1
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client, new_segment_on_context_change=True)
    restored = fanout_agent(model)
    assert [m["content"] for m in restored.messages] == [m["content"] for m in agent.messages]
    await restored.invoke_async("HELLO")
    assert [as_lists(t) for t in model.closed_trajectories[:2]] == [
        *(as_lists(t) for t in first.closed_trajectories),
        as_lists(first.trajectory),
    ]


async def test_time_travel_with_a_snapshot_session_goes_on_from_the_restored_turn(
    qwen3_tokenizer: Any, client: SGLangClient, tmp_path: Path
) -> None:
    """SnapshotSessionManager keeps a snapshot per invocation; restoring the same agent to an earlier
    one restores its model_state too, and the model follows it: the episode goes on from there as an
    episode that never took the later turns."""
    reference = await uninterrupted(qwen3_tokenizer, client)
    manager = SnapshotSessionManager(
        "travel", storage=LocalFileStorage(str(tmp_path)), snapshot_trigger=_always
    )
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    agent = solver(model, session_manager=manager)
    await agent.invoke_async(QUESTIONS[0])
    await agent.invoke_async("HELLO")
    snapshots = await manager.list_snapshot_ids(agent)
    assert len(snapshots) == 2 and model.recorded_outputs == 3
    assert await manager.restore_snapshot(agent, snapshot_id=snapshots[0])
    assert len(agent.messages) == 4
    await agent.invoke_async(QUESTIONS[1])
    assert as_lists(model.trajectory) == as_lists(reference.trajectory)


def _always(**_: Any) -> bool:
    return True


async def test_a_snapshot_without_kept_tokens_is_refused(qwen3_tokenizer: Any, client: SGLangClient) -> None:
    """Without a session manager the model keeps the tokens only with persist_tokens=True: a snapshot
    taken without them restores into a new model as a refusal, not as re-tokenized text."""
    first = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    agent = solver(first)
    await agent.invoke_async(QUESTIONS[0])
    restored = solver(SGLangModel(tokenizer=qwen3_tokenizer, client=client))
    restored.load_snapshot(agent.take_snapshot(preset="session"))
    with pytest.raises(TokenStateUnavailable, match=r"2 output\(s\).*persist_tokens=True"):
        await restored.invoke_async(QUESTIONS[1])


@pytest.mark.parametrize("cause", ["not saved", "other template"])
async def test_a_restore_that_cannot_be_exact_is_refused(
    qwen3_tokenizer: Any, client: SGLangClient, server: DevServer, tmp_path: Path, cause: str
) -> None:
    saved = {"persist_tokens": False} if cause == "not saved" else {}
    first = SGLangModel(tokenizer=qwen3_tokenizer, client=client, **saved)
    await solver(first, session_manager=sessions(tmp_path)).invoke_async(QUESTIONS[0])
    options = {"enable_thinking": False} if cause == "other template" else {}
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client, **options)
    agent = solver(model, session_manager=sessions(tmp_path))
    server.clear_request_log()
    expected = "persist_tokens=True" if cause == "not saved" else "another tokenizer or chat template"
    with pytest.raises(TokenStateUnavailable, match=expected) as info:
        await agent.invoke_async(QUESTIONS[1])
    assert "model.reset()" in str(info.value) and server.request_log == []
    model.reset()  # the documented way out: a new episode over the restored history as a prompt
    await agent.invoke_async(QUESTIONS[1])
    assert model.trajectory.loss_mask[: model.trajectory.initial_prompt_length] == [0] * (
        model.trajectory.initial_prompt_length
    )


async def test_a_history_no_sglang_model_sampled_is_a_prompt(
    qwen3_tokenizer: Any, client: SGLangClient
) -> None:
    """Messages given to the Agent (a dataset's few-shot turns) carry no saved state: they are prompt
    tokens (mask 0), as on any first call."""
    history = [
        {"role": "user", "content": [{"text": "FIRST question"}]},
        {"role": "assistant", "content": [{"text": "A it is."}]},
    ]
    model = SGLangModel(tokenizer=qwen3_tokenizer, client=client)
    await solver(model, messages=history).invoke_async(QUESTIONS[1])
    prompt = qwen3_tokenizer.decode(
        model.trajectory.token_ids[: model.trajectory.initial_prompt_length].tolist()
    )
    assert "A it is." in prompt and model.trajectory.num_outputs == 2


async def test_a_sliding_window_after_a_session_restore_is_refused_naming_the_manager_and_the_fix(
    qwen3_tokenizer: Any, client: SGLangClient, tmp_path: Path
) -> None:
    """One trajectory (no fan-out) cannot hold a history the window cut. After a session restore into a
    new model the refusal still names the conversation manager and ``new_segment_on_context_change``
    (the manager's count travels in the saved episode)."""

    def windowed(model: SGLangModel) -> Agent:
        window = SlidingWindowConversationManager(window_size=2)
        return solver(model, conversation_manager=window, session_manager=sessions(tmp_path))

    first = windowed(SGLangModel(tokenizer=qwen3_tokenizer, client=client))
    await first.invoke_async("HELLO")
    await first.invoke_async(
        "HELLO again"
    )  # four messages: the window cuts them to two, the session keeps that
    restored = windowed(SGLangModel(tokenizer=qwen3_tokenizer, client=client))
    assert len(restored.messages) == 2
    with pytest.raises(Exception) as refused:
        await restored.invoke_async(QUESTIONS[1])
    message = str(refused.value)
    assert "SlidingWindowConversationManager" in message and "new_segment_on_context_change=True" in message
