"""``SGLangModel``: a Strands model provider with token-in/token-out trajectories.

Each call sends the episode's exact token ids to SGLang's ``/generate`` and reports the sampled ids
and their logprobs, unchanged, to the episode's recorder (:mod:`~strands_slime.provider.recorder`),
which holds :attr:`SGLangModel.trajectory`. Only new messages (tool results, user follow-ups) are
templated and tokenized; the model's own output is never re-encoded from text. The parts: where the
outputs sit in the agent's history (:mod:`~strands_slime.provider.history`), the prompt's ids
(:mod:`~strands_slime.provider.prompt`), what a call may sample (:mod:`~strands_slime.provider.budget`),
the reply as Strands events and its tool-call ids (:mod:`~strands_slime.provider.reply`), the episode in
the agent's saved state (:mod:`~strands_slime.provider.saved_state`).
"""

from __future__ import annotations

import logging
import time
from array import array
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import nullcontext
from typing import Any

from strands.models.model import Model
from strands.types.content import Messages, SystemContentBlock
from strands.types.exceptions import (
    MaxTokensReachedException,
    ModelThrottledException,
)
from strands.types.streaming import StreamEvent
from strands.types.tools import ToolChoice, ToolSpec

from strands_slime.errors import ContextLimitExceeded, GenerationAborted
from strands_slime.provider import budget
from strands_slime.provider.budget import DEFAULT_MIN_REPLY_TOKENS, ContextWindow
from strands_slime.provider.chat import ChatTemplater, get_templater, to_template_messages
from strands_slime.provider.client import GenerateResponse, SGLangClient
from strands_slime.provider.client_errors import (
    SGLangAbortedError,
    SGLangContextLengthError,
    SGLangThrottledError,
)
from strands_slime.provider.constraints import output_model_schema
from strands_slime.provider.history import EpisodeHistory
from strands_slime.provider.model_config import (
    CONFIG_KEYS,
    SEED_ALIASES,
    TEMPLATE_KEYS,
    WIRING_KEYS,
    Pace,
    RenamedTrajectory,
    RequestTrace,
    SGLangConfig,
    Wiring,
    checked_config,
    initial_config,
)
from strands_slime.provider.plugin import TITOPlugin, warn_without_plugin
from strands_slime.provider.prompt import PromptRenderer, fingerprint, system_text, turn_prompt
from strands_slime.provider.recorder import Lane, ModelStats, Recorder
from strands_slime.provider.reply import Reply, ToolCallBook, reply_to, structured_value
from strands_slime.provider.request_check import vocabulary_size
from strands_slime.provider.saved_state import SavedEpisode
from strands_slime.provider.tool_parsers import ToolParser, get_tool_parser
from strands_slime.provider.trajectory import TokenTrajectory, token_array

logger = logging.getLogger(__name__)

__all__ = [
    "CONFIG_KEYS",
    "DEFAULT_MIN_REPLY_TOKENS",
    "SEED_ALIASES",
    "ModelStats",
    "Pace",
    "RequestTrace",
    "SGLangConfig",
    "SGLangModel",
]


class SGLangModel(Model):
    """Token-in/token-out Strands model for SGLang's native API. One instance per agent episode (call
    :meth:`reset` to reuse it); the client, the tokenizer and the episode's recorder may be shared by
    many instances."""

    _supports_structured_output = True
    """Strands' forced structured-output retry keeps the full tool list (the prompt's tools stay as
    tokenized); the forced ``tool_choice`` is enforced with a grammar."""

    token_manager = RenamedTrajectory()
    """Deprecated seed name of :attr:`trajectory`."""
    rollout = RenamedTrajectory()
    """Deprecated strands-sglang >= 0.4 name of :attr:`trajectory`."""

    def __init__(
        self,
        tokenizer: Any = None,
        tool_parser: ToolParser | str | None = None,
        client: SGLangClient | None = None,
        *,
        base_url: str | None = None,
        timeout: float | None = None,
        recorder: Recorder | None = None,
        name: str | None = None,
        **settings: Any,
    ) -> None:
        """Build a model for one episode; constructing one changes no global state.

        ``settings`` are the wiring to a server and a driver (:class:`~.model_config.Wiring`:
        ``abort_check``, ``routing_key``, ``return_logprob``, ``return_routed_experts``, ``request_trace``,
        ``new_segment_on_context_change``, ``persist_tokens``, ``pace``) and the keys :meth:`get_config`
        shows (``params`` is the seed alias of ``sampling_params``). ``recorder``: the episode's, which
        every model of one episode reports to (without one: the episode's running here, if any, else its
        own); ``name``: this model's lane in it."""
        recorder = recorder or Recorder.active() or Recorder()
        if recorder.model_defaults:  # a model an episode's sub-agent built: the episode's settings
            settings = {**recorder.model_defaults, **settings}
        wiring = {key: settings.pop(key) for key in WIRING_KEYS if key in settings}
        config = checked_config(
            settings,
            "SGLangModel",
            ["tokenizer", "tool_parser", "client", "base_url", "timeout", "recorder", "name", *WIRING_KEYS],
        )
        if tokenizer is None:
            raise ValueError("SGLangModel needs tokenizer= (a Hugging Face tokenizer or a path to one)")
        if isinstance(tokenizer, str):
            from strands_slime.provider.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        if (client is None) == (base_url is None):
            raise ValueError("pass exactly one of base_url= or client=")
        self.client = client if client is not None else SGLangClient(base_url, timeout=timeout)  # type: ignore[arg-type]
        self.tokenizer = tokenizer
        self.config: dict[str, Any] = initial_config(config)
        self.templater: ChatTemplater = get_templater(tokenizer, **{k: self.config[k] for k in TEMPLATE_KEYS})
        self.tool_parser = get_tool_parser(tool_parser or self.templater.family.tool_parser)
        self.wiring = Wiring(**wiring)
        self.lane: Lane = recorder.join(name, self.client.base_url)
        """This model's part of the episode's record: trajectory, closed segments, cut call, counters."""
        self.window = ContextWindow()
        self.history = EpisodeHistory()
        self._start_episode(adopt_saved=True)

    def plugin(self) -> TITOPlugin:
        """The Strands plugin the agent driving this model needs: ``Agent(..., plugins=[model.plugin()])``
        (:mod:`strands_slime.provider.plugin`)."""
        return TITOPlugin(self)

    # ------------------------------------------------------------------ state

    def reset(self) -> None:
        """Start a new episode: empty trajectory, counters and tool-call bookkeeping; the model is free
        for any agent again (and does not resume what an agent's ``model_state`` holds)."""
        self.lane.reset()
        self._start_episode(adopt_saved=False)

    def _start_episode(self, adopt_saved: bool) -> None:
        """Fresh bookkeeping for an episode (``adopt_saved``: a new model follows what an agent's
        ``model_state`` holds; a reset one starts over)."""
        self.history = EpisodeHistory(attached=self.history.attached)
        self.calls = ToolCallBook()
        self.renderer = PromptRenderer()
        self.saved = SavedEpisode(adopt=adopt_saved)
        self.last_reply: Reply | None = None
        """The latest reply, episode turn or side call (what :meth:`structured_output` reads)."""
        self.last_output_text: str | None = None
        """The text of the episode's latest output."""

    @property
    def trajectory(self) -> TokenTrajectory:
        """The episode's current trajectory (its context segment, with ``new_segment_on_context_change``)."""
        return self.lane.trajectory

    @property
    def closed_trajectories(self) -> list[TokenTrajectory]:
        """Earlier context segments (``new_segment_on_context_change``), oldest first."""
        return self.lane.closed

    @property
    def stats(self) -> ModelStats:
        """Per-episode counters."""
        return self.lane.stats

    @property
    def recorded_outputs(self) -> int:
        """Model outputs this episode recorded in the agent's history (turns an abort cut short excluded)."""
        return len(self.history.outputs)

    def transcript(self) -> list[dict[str, Any]]:
        """The episode as chat-template messages (system, user, parsed assistant turns, tool results):
        what a text-based pipeline would re-render. Used by the drift audit."""
        return self.history.transcript()

    def state(self, with_transcript: bool = False) -> dict[str, Any]:
        """The episode's bookkeeping besides the tokens, as plain JSON: counters, tool-call ids, where
        each output sits in the agent's history and the digests of the messages the model read (each
        turn's chat-template view only ``with_transcript``). With ``trajectory.layout()`` and the tokens
        it is everything :meth:`from_state` needs to go on with the episode in another model."""
        return {
            "stats": self.stats.as_dict(),
            **self.history.state(with_transcript),
            **self.calls.state(),
            "last_output_text": self.last_output_text,
        }

    def from_state(
        self, state: Mapping[str, Any], trajectory: TokenTrajectory, closed: Sequence[TokenTrajectory] = ()
    ) -> None:
        """Go on with an episode from its :meth:`state`, its ``trajectory`` and ``closed`` segments: the
        next call sends ``trajectory.token_ids`` plus only the newly templated messages. A last turn with
        no recorded output (a call an abort cut short) leaves the trajectory, and the next call goes on
        from its output (:meth:`Lane.restore <strands_slime.provider.recorder.Lane.restore>`).

        Raises:
            KeyError, TypeError, ValueError: ``state`` is malformed."""
        self.reset()
        self.history.restore(state)
        self.calls = ToolCallBook.from_state(state)
        self.last_output_text = state["last_output_text"]
        self.lane.stats = ModelStats(**state["stats"])
        self.lane.restore(trajectory, self.recorded_outputs)
        self.lane.closed = list(closed)

    def check_history(self, agent: Any) -> str | None:
        """Check ``agent.messages`` against what the model read (the plugin does at every invocation's
        start; O(history)). Returns why it no longer continues the episode, or None; the next call then
        starts a new context segment (``new_segment_on_context_change``) or raises
        :class:`~strands_slime.errors.TrajectoryDesyncError`."""
        return self.history.check(agent)

    def update_config(self, **model_config: Any) -> None:
        """Change any key ``get_config`` shows (``params`` is the seed alias of ``sampling_params``,
        which is replaced, not merged). Template options apply from the next rendered turn."""
        self.config.update(checked_config(model_config, "SGLangModel.update_config"))
        if model_config.keys() & TEMPLATE_KEYS:
            self.templater = get_templater(self.tokenizer, **{k: self.config[k] for k in TEMPLATE_KEYS})

    def get_config(self) -> SGLangConfig:
        """The provider's configuration (Strands ``Model`` API)."""
        return self.config  # type: ignore[return-value]

    @property
    def sampling_params(self) -> dict[str, Any]:
        """The sampling parameters sent with every ``/generate`` request."""
        return self.config["sampling_params"]

    @property
    def context_window_limit(self) -> int | None:
        """The context limit (what Strands' proactive compression reads): the configured one, or the
        server's (``use_server_context_length``) once a call has read it."""
        return self.window.limit(self.config)

    # ------------------------------------------------------------------ Strands' model API

    async def structured_output(  # type: ignore[override]
        self, output_model: Any, prompt: Messages, system_prompt: str | None = None, **kwargs: Any
    ) -> AsyncGenerator[dict[str, Any], None]:
        """One turn sampled under SGLang's ``json_schema`` constraint for ``output_model`` (a pydantic class).

        Called by an agent's loop the turn lands in the trajectory like any other; called directly on a
        model an agent holds (the deprecated ``Agent.structured_output``) it is a side call, outside the
        trajectory and never trained (docs/provider.md, "What is trained"). Yields the call's stream
        events, then ``{"output": instance}``. A reply cut by the token limit raises
        ``MaxTokensReachedException``."""
        stop_reason = None
        schema = output_model_schema(output_model)
        async for event in self.stream(prompt, None, system_prompt, output_schema=schema, **kwargs):
            if "messageStop" in event:
                stop_reason = event["messageStop"]["stopReason"]
            yield event
        if stop_reason == "max_tokens":
            raise MaxTokensReachedException(
                f"structured output for {output_model.__name__} was cut at the token limit before its JSON ended"
            )
        output = structured_value(output_model, self.last_reply)
        yield {"output": output}

    async def count_tokens(
        self,
        messages: Messages,
        tool_specs: list[ToolSpec] | None = None,
        system_prompt: str | None = None,
        system_prompt_content: list[SystemContentBlock] | None = None,
    ) -> int:
        """The exact number of tokens these messages make in this model's next request, as the
        tokenizer counts them. Strands asks before every call: for the whole prompt (system prompt,
        tool specs, history) before the first, then for the messages after the model's last output
        (their usage covers the rest); those are counted as what the call appends to the trajectory.
        The rendered prompt is kept for that call, so it is not rendered twice."""
        if system_prompt_content:
            system_prompt = system_text(system_prompt_content)
        template_messages = to_template_messages(messages, self.calls.order.get, self.calls.native_ids.get)
        trajectory = self.lane.trajectory
        if tool_specs is None and system_prompt is None and trajectory.ends_with_output:
            if not template_messages:
                return 0
            ids, _ = await self.renderer.continuation(
                self.templater, template_messages, trajectory, for_call=False
            )
        elif not template_messages and not system_prompt and not tool_specs:
            return 0
        else:
            ids, _ = await self.renderer.initial(
                self.templater, template_messages, tool_specs, system_prompt, for_call=False
            )
        return len(ids)

    async def initial_prompt_ids(
        self, messages: Messages, tool_specs: list[ToolSpec] | None, system_prompt: str | None
    ) -> list[int]:
        """The ids the first model call of an episode over ``messages`` sends (changes no state): the
        prompt of a sample whose episode ended before any output."""
        template_messages = to_template_messages(messages, self.calls.order.get)
        return (await PromptRenderer().initial(self.templater, template_messages, tool_specs, system_prompt))[
            0
        ]

    async def stream(
        self,
        messages: Messages,
        tool_specs: list[ToolSpec] | None = None,
        system_prompt: str | None = None,
        *,
        tool_choice: ToolChoice | None = None,
        system_prompt_content: list[SystemContentBlock] | None = None,
        invocation_state: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> AsyncGenerator[StreamEvent, None]:
        """One model call. An agent loop's call is a turn of the episode's trajectory; a call from
        outside the loop (a conversation manager's summary) is a side call, served without touching it.
        A forced ``tool_choice`` is enforced with a grammar."""
        agent = (invocation_state or {}).get("agent")
        if system_prompt is None and system_prompt_content:
            system_prompt = system_text(system_prompt_content)
        if agent is not None and self.history.serves(agent):
            self.saved.follow(self, kwargs.get("model_state"))
        request = (tool_choice, tool_specs, system_prompt, kwargs)
        if self.history.is_side_call(agent, lambda: fingerprint(tool_specs, system_prompt)):
            events = await self._side_call(messages, request)
        else:
            events = await self._turn(messages, agent, request)
        for event in events:
            yield event

    # ------------------------------------------------------------------ one call

    async def _turn(self, messages: Messages, agent: Any, request: tuple[Any, ...]) -> list[StreamEvent]:
        """A turn of the episode: the new messages' ids after the trajectory, the server's reply recorded
        (``agent.cancel()`` before or during it: nothing is sent or recorded, and no event is returned)."""
        tool_choice, tool_specs, system_prompt, kwargs = request
        wiring, lane = self.wiring, self.lane
        self.saved.fresh = False
        offset = self.history.take_cut(agent, messages)
        if agent is not None and agent not in self.history.attached:
            warn_without_plugin()
        if wiring.abort_check is not None and wiring.abort_check():
            raise GenerationAborted(
                "rollout aborted before the model call", trajectory=lane.trajectory.copy()
            )
        cancelled = getattr(kwargs.get("cancel_signal"), "is_set", None)
        if cancelled is not None and cancelled():
            return []
        abort_check = wiring.abort_check if wiring.abort_check is not None else cancelled
        if wiring.pace is not None:
            await wiring.pace("render")
        initial, delta, prompt_text, turn_messages = await turn_prompt(
            self, messages, tool_specs, system_prompt, offset, agent
        )
        cut = lane.continuation_for(delta)
        cut_len = len(cut[1]) if cut is not None else 0
        input_len = len(lane.trajectory) + len(delta) + cut_len
        try:
            context_limit = await self.window.read(self.config, self.client, abort_check, lane.trajectory)
            pending = (0 if initial else len(delta)) + cut_len
            params = budget.sampling_params(
                self.config, input_len, context_limit, agent, lane.trajectory.response_length, pending
            )
            params, mode = budget.constrain(
                params, self.templater, self.tool_parser, self.config.get("enable_thinking"),
                (tool_choice, tool_specs, prompt_text, kwargs.get("output_schema")),
            )  # fmt: skip
            extra: dict[str, Any] = {}
            if wiring.return_routed_experts:  # rows already known from earlier calls are not sent again
                extra = {
                    "return_routed_experts": True,
                    "routed_experts_start_len": max(0, len(lane.trajectory) - 1),
                }
            delta_ids = token_array(delta)  # converted once: the request and the recorded turn share it
            ids = lane.trajectory.token_ids + delta_ids
            if cut is not None:
                ids += cut[1]
            started = time.perf_counter()
            # Only a cut call's output may hold ids from outside (a resumed sample's): the trajectory's
            # went out before, and the tokenizer's are below vocabulary_size (at least its length).
            extra["check_ids"] = slice(len(lane.trajectory) + len(delta_ids), None)
            response = await self._send(ids, params, abort_check, input_len, traced=True, **extra)
        except GenerationAborted:
            if cancelled is None or not cancelled():
                raise
            response = None
        if cancelled is not None and cancelled():  # agent.cancel(): the reply is dropped
            lane.continuation = cut if cut is not None and cut_len else None
            return []
        assert response is not None
        if wiring.return_routed_experts:  # SGLang does not echo it; slime's Sample reads it from meta_info
            response.meta_info.setdefault("routed_experts_start_len", extra["routed_experts_start_len"])
        stats = lane.stats
        stats.turn_seconds.append(time.perf_counter() - started)
        stats.generation_seconds += stats.turn_seconds[-1]
        stats.model_calls += 1
        if wiring.pace is not None:
            await wiring.pace("reply")
        if response.is_abort:
            stats.finish_reasons.append("abort")
            message = response.finish_reason.message if response.finish_reason else None
            raise GenerationAborted(
                f"generation aborted by the server ({message or 'no message'})",
                trajectory=lane.record_cut_call(delta_ids, response, cut),
                queued=response.prompt_tokens is None,
            )
        lane.record_turn(delta_ids, response, cut)
        stats.prompt_tokens += response.prompt_tokens or 0
        stats.cached_tokens += response.cached_tokens
        stats.completion_tokens += response.completion_tokens
        record = (offset + len(messages), turn_messages)
        events = await reply_to(self, response, (tool_specs, prompt_text, cut, mode), record)
        self.saved.save(self, kwargs.get("model_state"), kwargs.get("agent_metadata"))
        return events

    async def _side_call(self, messages: Messages, request: tuple[Any, ...]) -> list[StreamEvent]:
        """A call that does not continue the episode (Strands' summarizer asks the agent's model for a
        summary of old messages under its own system prompt): a whole prompt of its own, the reply
        returned as usual, nothing recorded in the trajectory or the episode's bookkeeping."""
        tool_choice, tool_specs, system_prompt, kwargs = request
        abort_check = self.wiring.abort_check
        if abort_check is not None and abort_check():
            raise GenerationAborted(
                "rollout aborted before the model call", trajectory=self.lane.trajectory.copy()
            )
        template_messages = to_template_messages(messages)
        ids, text = await PromptRenderer().initial(
            self.templater, template_messages, tool_specs, system_prompt
        )
        context_limit = await self.window.read(self.config, self.client, abort_check, self.lane.trajectory)
        params = budget.sampling_params(self.config, len(ids), context_limit, None)
        params, mode = budget.constrain(
            params, self.templater, self.tool_parser, self.config.get("enable_thinking"),
            (tool_choice, tool_specs, text, kwargs.get("output_schema")),
        )  # fmt: skip
        response = await self._send(token_array(ids), params, abort_check, len(ids), traced=False)
        self.lane.record_side_call(response)
        if response.is_abort:
            raise GenerationAborted(
                "generation aborted by the server during a side call", trajectory=self.lane.trajectory
            )
        return await reply_to(self, response, (tool_specs, text, None, mode), None)

    async def _send(
        self,
        ids: array[int],
        params: Mapping[str, Any],
        abort_check: Any,
        input_len: int,
        traced: bool,
        **extra: Any,
    ) -> GenerateResponse:
        """One ``/generate`` request (in the request trace when ``traced``), with the client's errors as
        the model's. The ids are not kept here: the client encodes the array and drops it before awaiting."""
        wiring = self.wiring
        trace = (
            wiring.request_trace(params) if traced and wiring.request_trace is not None else nullcontext(None)
        )
        request = self.client.generate(
            ids, params, return_logprob=wiring.return_logprob, routing_key=wiring.routing_key, abort_check=abort_check,
            vocab_size=vocabulary_size(self.tokenizer), **extra,
        )  # fmt: skip
        del ids
        try:
            with trace as record_meta:
                response = await request
                if record_meta is not None:
                    record_meta(response.meta_info)
        except SGLangAbortedError as exc:  # slime aborted: nothing was sent, or the wait was cut short
            raise GenerationAborted(str(exc), trajectory=self.lane.trajectory, queued=True) from exc
        except SGLangContextLengthError as exc:
            raise ContextLimitExceeded(str(exc), prompt_tokens=input_len) from exc
        except SGLangThrottledError as exc:
            raise ModelThrottledException(str(exc)) from exc
        return response
