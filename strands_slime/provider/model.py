"""``SGLangModel``: a Strands model provider with token-in/token-out trajectories.

Each call sends the episode's exact token ids to SGLang's ``/generate`` and appends the sampled ids
and their logprobs to :attr:`SGLangModel.trajectory` unchanged. Only new messages (tool results, user
follow-ups) are templated and tokenized; the model's own output is never re-encoded from text.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import json
import logging
import time
import uuid
import warnings
import weakref
from array import array
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, TypedDict

from strands.agent.conversation_manager import NullConversationManager
from strands.models.model import Model
from strands.types.content import Messages, SystemContentBlock
from strands.types.exceptions import (
    MaxTokensReachedException,
    ModelThrottledException,
    StructuredOutputException,
)
from strands.types.streaming import StreamEvent
from strands.types.tools import ToolChoice, ToolSpec

from strands_slime.aborts import AbortedError, run_abortable
from strands_slime.errors import (
    ContextLimitExceeded,
    GenerationAborted,
    ModelInUseError,
    ResponseBudgetExhausted,
    TokenStateUnavailable,
    TrajectoryDesyncError,
)
from strands_slime.provider.chat import (
    ChatTemplater,
    get_templater,
    to_template_messages,
    tool_specs_to_template_tools,
)
from strands_slime.provider.client import GenerateResponse, SGLangClient
from strands_slime.provider.client_errors import (
    SGLangAbortedError,
    SGLangClientError,
    SGLangContextLengthError,
    SGLangThrottledError,
)
from strands_slime.provider.constraints import (
    ReasoningMode,
    json_output_ebnf,
    merge_constraint,
    output_model_schema,
    tool_call_ebnf,
    tool_choice_names,
)
from strands_slime.provider.history import EpisodeHistory, OutputRecord, Verdict, output_signature
from strands_slime.provider.plugin import TITOPlugin
from strands_slime.provider.request_check import vocabulary_size
from strands_slime.provider.saved_state import (
    MODEL_STATE_KEY,
    encode_closed,
    encode_turn,
    read_saved_episode,
    saved_episode,
    tokenizer_fingerprint,
)
from strands_slime.provider.tool_parsers import (
    THINK_CLOSE,
    THINK_OPEN,
    ParsedOutput,
    ToolParser,
    get_tool_parser,
    parse_output,
)
from strands_slime.provider.trajectory import TokenTrajectory, token_array
from strands_slime.runtime import get_runtime

logger = logging.getLogger(__name__)


RequestTrace = Callable[
    [Mapping[str, Any]], AbstractContextManager[Callable[[Mapping[str, Any]], None] | None]
]
"""Wraps each ``/generate`` call (given its sampling params); what it yields, when not None, receives
the reply's ``meta_info`` (slime's ``trace_span`` + ``build_sglang_meta_trace_attrs``)."""

Pace = Callable[[str], Awaitable[None]]
"""Awaited before each synchronous stretch of a model call, named ``"render"`` (templating and encoding
the new messages) or ``"reply"`` (handling the server's reply): a driver running hundreds of episodes
on one loop paces them there and counts replies (the rollout: ``rollout.pacing``, ``rollout.gc_policy``)."""


class SGLangConfig(TypedDict, total=False):
    """``model.get_config()``: a dict, as Strands' tracer expects."""

    model_id: str | None
    sampling_params: dict[str, Any]
    enable_thinking: bool | None
    chat_template: str | None
    template_kwargs: dict[str, Any] | None
    chat_family: str | None
    context_window_limit: int | None
    max_response_tokens: int | None
    use_server_context_length: bool
    min_reply_tokens: int | None


DEFAULT_MIN_REPLY_TOKENS = 1024
"""Room a reply needs when ``min_reply_tokens`` is None and the agent's conversation manager can
compact its history (at most a quarter of the context window): with less, the call raises
``ContextLimitExceeded`` so the manager compacts instead of the model writing a reply cut to a few
tokens."""


CONFIG_KEYS = tuple(SGLangConfig.__annotations__)
"""What ``get_config`` shows and ``update_config`` changes."""

SEED_ALIASES = {"params": "sampling_params"}
"""strands-sglang 0.1.x names, kept so its quick start runs unchanged."""


def _unknown_arguments(where: str, unknown: Sequence[str], known: Sequence[str]) -> TypeError:
    """A TypeError naming each unknown keyword with the closest known one, if any."""
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(key, known, n=1)
        parts.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return TypeError(f"{where} got unknown keyword argument(s) {', '.join(parts)}; known: {', '.join(known)}")


def _seed_alias(arguments: dict[str, Any], where: str) -> None:
    for alias, name in SEED_ALIASES.items():
        if alias in arguments:
            if arguments.get(name) is not None:
                raise TypeError(f"{where}: pass {name}= or its seed alias {alias}=, not both")
            arguments[name] = arguments.pop(alias)


@dataclass
class ModelStats:
    """Per-episode counters (reset with the trajectory)."""

    model_calls: int = 0
    tool_calls: int = 0
    parse_errors: int = 0
    rolled_back_turns: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    generation_seconds: float = 0.0
    side_calls: int = 0
    """Calls served outside the episode (a conversation manager's summary, ...): not in the trajectory."""
    turn_seconds: list[float] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    parse_error_messages: list[str] = field(default_factory=list)

    @property
    def last_finish_reason(self) -> str | None:
        """The finish reason of the latest model call, or None before the first call."""
        return self.finish_reasons[-1] if self.finish_reasons else None


class SGLangModel(Model):
    """Token-in/token-out Strands model for SGLang's native API. One instance per agent episode (call
    :meth:`reset` to reuse it); the client and tokenizer may be shared by many instances."""

    _supports_structured_output = True
    """Strands' forced structured-output retry keeps the full tool list (the prompt's tools stay as
    tokenized); the forced ``tool_choice`` is enforced with a grammar."""

    def __init__(
        self,
        tokenizer: Any = None,
        tool_parser: ToolParser | str | None = None,
        client: SGLangClient | None = None,
        *,
        base_url: str | None = None,
        timeout: float | None = None,
        abort_check: Callable[[], bool] | None = None,
        routing_key: str | None = None,
        return_logprob: bool = True,
        return_routed_experts: bool = False,
        request_trace: RequestTrace | None = None,
        new_segment_on_context_change: bool = False,
        persist_tokens: bool | None = None,
        pace: Pace | None = None,
        **config: Any,
    ) -> None:
        """Build a model for one episode; constructing one changes no global state.

        ``config`` takes the keys :meth:`get_config` shows (:data:`CONFIG_KEYS`; ``params`` is the seed
        alias of ``sampling_params``); the keywords before it wire the model to a server and a driver."""
        _seed_alias(config, "SGLangModel")
        unknown = sorted(set(config) - set(CONFIG_KEYS))
        if unknown:
            wiring = [
                p for p in inspect.signature(SGLangModel.__init__).parameters if p not in ("self", "config")
            ]
            raise _unknown_arguments("SGLangModel()", unknown, [*wiring, *CONFIG_KEYS, *SEED_ALIASES])
        if tokenizer is None:
            raise ValueError("SGLangModel needs tokenizer= (a Hugging Face tokenizer or a path to one)")
        if isinstance(tokenizer, str):
            from strands_slime.provider.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(tokenizer)
        if (client is None) == (base_url is None):
            raise ValueError("pass exactly one of base_url= or client=")
        self.client = client if client is not None else SGLangClient(base_url, timeout=timeout)  # type: ignore[arg-type]
        self.tokenizer = tokenizer
        self.config: dict[str, Any] = {
            "model_id": config.get("model_id"),
            "sampling_params": dict(config.get("sampling_params") or {}),
            "enable_thinking": config.get("enable_thinking"),
            "chat_template": config.get("chat_template"),
            "template_kwargs": dict(config["template_kwargs"])
            if config.get("template_kwargs") is not None
            else None,
            "chat_family": config.get("chat_family"),
            "context_window_limit": config.get("context_window_limit"),
            "max_response_tokens": config.get("max_response_tokens"),
            "use_server_context_length": config.get("use_server_context_length", True),
            "min_reply_tokens": config.get("min_reply_tokens"),
        }
        self.templater: ChatTemplater = self._templater()
        self.tool_parser = get_tool_parser(tool_parser or self.templater.family.tool_parser)
        self.abort_check = abort_check
        self.routing_key = routing_key
        self.return_logprob = return_logprob
        self.return_routed_experts = return_routed_experts
        self.request_trace = request_trace
        self.new_segment_on_context_change = new_segment_on_context_change
        self.persist_tokens = persist_tokens
        """Keep the episode's tokens in the agent's ``model_state`` (Strands saves it with sessions and
        snapshots), so a new model resumes the episode exactly (:mod:`~strands_slime.provider.saved_state`):
        True always, False never (a marker only), None when the agent has a session manager."""
        self.pace = pace
        self._attached_agents: weakref.WeakSet[Any] = weakref.WeakSet()
        """Agents whose :meth:`plugin` this model was handed to (read to warn when it was not)."""
        self._plugin_warned = False
        self.message_offset = 0
        """Messages the plugin left out of the current call (it hands only the new ones), 0 when none."""
        self._offset_agent: int | None = None
        """``id`` of the agent whose call :attr:`message_offset` belongs to."""
        self._fingerprint_cache: tuple[ChatTemplater, str] | None = None
        self._context_limit_seen: int | None = None
        self.reset()
        self._fresh = True
        """No call yet: a saved episode the agent holds but this model cannot resume is refused."""
        self._adopt_saved = True

    def _templater(self) -> ChatTemplater:
        return get_templater(
            self.tokenizer,
            chat_template=self.config["chat_template"],
            enable_thinking=self.config["enable_thinking"],
            template_kwargs=self.config["template_kwargs"],
            chat_family=self.config["chat_family"],
        )

    def plugin(self) -> TITOPlugin:
        """The Strands plugin the agent driving this model needs: ``Agent(..., plugins=[model.plugin()])``
        (:mod:`strands_slime.provider.plugin`)."""
        return TITOPlugin(self)

    # ------------------------------------------------------------------ state

    def reset(self) -> None:
        """Start a new episode: empty trajectory, counters and tool-call bookkeeping; the model is free
        for any agent again (and does not resume what an agent's ``model_state`` holds)."""
        self.trajectory = TokenTrajectory()
        self.closed_trajectories: list[TokenTrajectory] = []
        """Earlier context segments (``new_segment_on_context_change``), oldest first."""
        self.stats = ModelStats()
        self.history = EpisodeHistory()
        """Where the episode's outputs sit in the agent's history, and the digests of what it read."""
        self._agent: weakref.ref[Any] | None = None
        """The agent whose episode this is (set by its first call; cleared by :meth:`reset`)."""
        self._fresh = False
        self._adopt_saved = False
        """Whether the episode the agent's ``model_state`` holds is followed when it is not the one this
        model wrote last (a new model, a restored snapshot). Off from :meth:`reset` (a new episode) until
        the model's first save."""
        self._saved_bookkeeping: str | None = None
        """The bookkeeping string of the ``model_state`` entry this model wrote or resumed last."""
        self._call_order: dict[str, int] = {}
        self._native_call_ids: dict[str, str] = {}
        self._tool_errors: dict[str, str] = {}
        self._id_prefix = uuid.uuid4().hex[:8]
        self._initial_position = 0
        self._tools_fingerprint: Any = None
        self._removed_count: int | None = None
        """The agent's conversation manager's ``removed_message_count`` at the latest call."""
        self._turn_chunks: list[str] = []
        """The trajectory's turns as saved into ``model_state`` (encoded once each)."""
        self._chunked: TokenTrajectory | None = None
        """The trajectory :attr:`_turn_chunks` encode."""
        self._closed_chunks: list[str] = []
        self._rendered: tuple[Any, list[int], str] | None = None
        """``(key, ids, text)`` of the prompt :meth:`count_tokens` rendered for the next call, which takes it."""
        self.last_output_text: str | None = None
        self.last_parsed: ParsedOutput | None = None
        self._reply_text: str | None = None
        """The text of the latest reply, episode turn or side call (what :meth:`structured_output` parses)."""
        self.first_prompt_ids: array[int] | None = None
        """The ids of the episode's first prompt (system, tools, history), once rendered (an array)."""
        self._continuation: tuple[list[int], array[int], array[float]] | None = None
        """(prompt ids, output ids, logprobs) of an output an abort cut short: the next call goes on
        from it (:meth:`continue_output`)."""
        self._constraint_reasoning: ReasoningMode | None = None

    @property
    def token_manager(self) -> TokenTrajectory:
        """Deprecated seed name of :attr:`trajectory` (warns once)."""
        _warn_renamed("token_manager")
        return self.trajectory

    @property
    def rollout(self) -> TokenTrajectory:
        """Deprecated strands-sglang >= 0.4 name of :attr:`trajectory` (warns once)."""
        _warn_renamed("rollout")
        return self.trajectory

    def transcript(self) -> list[dict[str, Any]]:
        """The episode as chat-template messages (system, user, parsed assistant turns, tool results):
        what a text-based pipeline would re-render. Used by the drift audit."""
        messages: list[dict[str, Any]] = []
        for record in self.history.outputs:
            messages.extend(record.prompt_messages)
            messages.append(record.assistant)
        return messages

    def state(self, with_transcript: bool = False) -> dict[str, Any]:
        """The episode's bookkeeping besides the tokens, as plain JSON: counters, tool-call ids, where
        each output sits in the agent's history and the digests of the messages the model read (each
        turn's chat-template view only ``with_transcript``: :meth:`transcript` needs it, nothing else
        does). With ``trajectory.layout()`` and the tokens it is everything :meth:`from_state` needs to
        go on with the episode in another model."""
        return {
            "stats": _stats_dict(self.stats),
            "outputs": [
                [
                    r.position,
                    [list(r.signature[0]), *r.signature[1:]],
                    r.prompt_messages if with_transcript else [],
                    r.assistant if with_transcript else {},
                ]
                for r in self.history.outputs
            ],
            "digests": list(self.history.digests),
            "call_order": dict(self._call_order),
            "native_call_ids": dict(self._native_call_ids),
            "tool_errors": dict(self._tool_errors),
            "id_prefix": self._id_prefix,
            "initial_position": self._initial_position,
            "tools_fingerprint": [list(self._tools_fingerprint[0]), self._tools_fingerprint[1]]
            if self._tools_fingerprint is not None
            else None,
            "last_output_text": self.last_output_text,
        }

    def from_state(self, state: Mapping[str, Any], trajectory: TokenTrajectory) -> None:
        """Go on with an episode from its :meth:`state` and its ``trajectory``: the next call sends
        ``trajectory.token_ids`` plus only the newly templated messages. A trajectory whose last turn
        has no recorded output (a call an abort cut short) keeps that turn: see :meth:`continue_output`.

        Raises:
            KeyError, TypeError, ValueError: ``state`` is malformed."""
        self.reset()
        self.trajectory = trajectory
        self.stats = ModelStats(**state["stats"])
        self.history.outputs = [
            OutputRecord(int(position), (tuple(ids), text, reasoning), list(prompt), dict(assistant))
            for position, (ids, text, reasoning), prompt, assistant in state["outputs"]
        ]
        self.history.digests = [str(d) for d in state.get("digests", ())]
        self._call_order = {str(k): int(v) for k, v in state["call_order"].items()}
        self._native_call_ids = {str(k): str(v) for k, v in state["native_call_ids"].items()}
        self._tool_errors = {str(k): str(v) for k, v in state["tool_errors"].items()}
        self._id_prefix = str(state["id_prefix"])
        self._initial_position = int(state["initial_position"])
        fingerprint = state["tools_fingerprint"]
        self._tools_fingerprint = (tuple(fingerprint[0]), fingerprint[1]) if fingerprint else None
        self.last_output_text = state["last_output_text"]
        self.first_prompt_ids = trajectory.token_ids[: trajectory.initial_prompt_length]

    @property
    def recorded_outputs(self) -> int:
        """Model outputs this episode recorded in the agent's history (turns an abort cut short excluded)."""
        return len(self.history.outputs)

    def continue_output(self, prompt_ids: list[int], output_ids: array[int], logprobs: array[float]) -> None:
        """Make the next call go on from an output an abort cut short: the call's new messages must
        render to ``prompt_ids`` again, and the server continues after ``output_ids`` (as slime's own
        generate resumes a partial rollout)."""
        self._continuation = (list(prompt_ids), output_ids, logprobs)

    def take_continuation(self) -> tuple[list[int], array[int], array[float]] | None:
        """The continuation no call used yet (the episode ended first), or None; it is cleared."""
        continuation, self._continuation = self._continuation, None
        return continuation

    def _restore_continuation(self, delta: list[int], output: list[int], logprobs: list[float]) -> None:
        """Put back the continuation a call took but did not make (it was cancelled first)."""
        if output:
            self._continuation = (list(delta), token_array(output), array("d", logprobs))

    def _take_continuation_for(self, delta: list[int]) -> tuple[list[int], list[float]]:
        """The output (and logprobs) to go on from; none without a continuation. Its prompt must render
        to the very ids it was sent with."""
        continuation = self.take_continuation()
        if continuation is None:
            return [], []
        saved_delta, output, logprobs = continuation
        if delta != saved_delta:
            raise TrajectoryDesyncError(
                "the resumed call's prompt renders to other ids than the call the abort cut short"
            )
        return output.tolist(), logprobs.tolist()

    # ------------------------------------------------------------------ the agent's saved state

    def _follow_saved(self, model_state: Any) -> None:
        """Go on with the episode the agent's ``model_state`` holds when it is not the one this model
        wrote last: a session, checkpoint or snapshot restored into a new model, or the agent restored to
        an earlier snapshot. The check is one identity test per call (Strands' deep copy keeps the
        strings); what cannot be resumed exactly is refused loudly."""
        saved = model_state.get(MODEL_STATE_KEY) if isinstance(model_state, Mapping) else None
        if saved is None or not self._adopt_saved:
            return
        if not isinstance(saved, Mapping) or not saved.get("tokens"):
            if self._fresh:  # a new model cannot go on with outputs whose ids were not saved
                read_saved_episode(saved, self._tokenizer_fingerprint())
            return
        bookkeeping = saved.get("bookkeeping")
        if bookkeeping is self._saved_bookkeeping or bookkeeping == self._saved_bookkeeping:
            self._saved_bookkeeping = bookkeeping
            return
        restored = read_saved_episode(saved, self._tokenizer_fingerprint())
        if restored is None:
            return
        trajectory, closed, state = restored
        agent = self._agent
        try:
            self.from_state(state["model"], trajectory)
        except (KeyError, TypeError, ValueError) as exc:
            raise TokenStateUnavailable(
                f"the agent's saved episode state is damaged ({type(exc).__name__}: {exc}); call "
                "model.reset() to start a new episode from the history as a prompt"
            ) from exc
        self._agent, self._adopt_saved, self._saved_bookkeeping = agent, True, bookkeeping
        self.closed_trajectories = closed
        self._turn_chunks, self._chunked = list(saved["turns"]), trajectory
        self._closed_chunks = list(saved.get("closed") or ())
        logger.info(
            "the model goes on with the episode the agent's model_state holds (%d outputs): restored from a "
            "session, checkpoint or snapshot",
            self.recorded_outputs + sum(t.num_outputs for t in closed),
        )

    def _tokenizer_fingerprint(self) -> str:
        cached = self._fingerprint_cache
        if cached is None or cached[0] is not self.templater:
            cached = self._fingerprint_cache = (self.templater, tokenizer_fingerprint(self.templater))
        return cached[1]

    def _save(self, model_state: Any, agent_metadata: Any) -> None:
        """Write the episode into the agent's ``model_state`` (Strands keeps it after a successful call):
        the turns not yet encoded, and the bookkeeping; or, without ``persist_tokens`` (by default: no
        session manager, so nothing keeps the agent), only a marker saying the outputs' ids are not kept."""
        if not isinstance(model_state, dict):
            return
        outputs = self.recorded_outputs + sum(t.num_outputs for t in self.closed_trajectories)
        keep = self.persist_tokens
        if keep is None:  # Strands sets the session id only when a session manager is attached
            keep = getattr(agent_metadata, "session_id", None) is not None
        if not keep:
            model_state[MODEL_STATE_KEY] = saved_episode(
                fingerprint="", turns=None, closed=(), bookkeeping={}, outputs=outputs
            )
            return
        for closed in self.closed_trajectories[len(self._closed_chunks) :]:
            self._closed_chunks.append(encode_closed(closed))
        trajectory = self.trajectory
        if self._chunked is not trajectory:  # replaced from outside (the rollout's resume): encode anew
            self._turn_chunks, self._chunked = [], trajectory
        del self._turn_chunks[trajectory.turn_count :]
        for turn in range(len(self._turn_chunks), trajectory.turn_count):
            self._turn_chunks.append(encode_turn(trajectory, turn))
        entry = saved_episode(
            fingerprint=self._tokenizer_fingerprint(),
            turns=self._turn_chunks,
            closed=self._closed_chunks,
            bookkeeping={"model": self.state(), "missing_logprobs": trajectory.missing_logprobs},
            outputs=outputs,
        )
        model_state[MODEL_STATE_KEY] = entry
        self._saved_bookkeeping, self._adopt_saved = entry["bookkeeping"], True

    # ------------------------------------------------------------------ whose call is it

    def serves(self, agent: Any) -> bool:
        """Whether calls from ``agent``'s loop are this model's episode (it is free, or ``agent``'s)."""
        return self._agent is None or self._agent() is agent

    def _is_side_call(self, agent: Any, tool_specs: list[ToolSpec] | None, system_prompt: str | None) -> bool:
        """Whether the call is served outside the episode. An agent loop's call is the episode's (the
        first one binds the model to its agent; another agent's is refused). A call from no agent loop
        (Strands' summarizer calls ``model.stream`` directly) is a side call once an agent holds the
        episode; a model driven by hand treats a call with other tools or system prompt as one."""
        if agent is not None:
            if self._agent is None:
                self._agent = weakref.ref(agent)
                return False
            if self._agent() is agent:
                return False
            raise ModelInUseError(
                "this SGLangModel holds the episode of another agent"
                + (" (no longer alive)" if self._agent() is None else "")
                + ": one model serves one agent's episode, or two agents' trajectories would mix. Build one "
                "SGLangModel per agent (they may share client= and the tokenizer), or call model.reset() to "
                "start a new episode with this agent (read model.trajectory first). Strands features that "
                "run an agent of their own (a summarization agent, steering, a goal judge) need their own "
                "model too, e.g. Agent(aux_model=...)"
            )
        if self._agent is not None:
            return True
        return (
            bool(self.history.outputs) and _fingerprint(tool_specs, system_prompt) != self._tools_fingerprint
        )

    def trim_point(self, agent: Any, messages: Messages, whole: bool = False) -> int | None:
        """Where the plugin may cut ``agent``'s call (a whole history): at this model's latest output
        found in place, which the call then starts with. None: hand the whole history (``whole``,
        another agent's call, the history changed, or no output of the episode is in it)."""
        if self._offset_agent == id(agent):
            self.message_offset, self._offset_agent = 0, None
        if whole or not self.serves(agent) or self.history.changed is not None:
            return None
        keep = self._matching_output(messages, 0)
        if not keep:
            return None
        self.message_offset, self._offset_agent = self.history.outputs[keep - 1].position, id(agent)
        return self.message_offset

    def last_output_position(self, messages: Messages) -> int | None:
        """Where this model's latest output recorded in ``messages`` (a whole history) sits, or None."""
        keep = self._matching_output(messages, 0)
        return self.history.outputs[keep - 1].position if keep else None

    def _take_offset(self, agent: Any, messages: Messages) -> int:
        """The position the plugin cut this call's messages at (0: they are a whole history)."""
        offset, owner = self.message_offset, self._offset_agent
        self.message_offset, self._offset_agent = 0, None
        if not offset or owner != id(agent):
            return 0
        outputs = self.history.outputs
        for record in reversed(outputs):  # the cut is at the latest output in place: one or two checks
            if record.position == offset:
                first = messages[0] if messages else None
                if first is not None and first["role"] == "assistant":
                    if output_signature(first["content"]) == record.signature:
                        return offset
                break
            if record.position < offset:
                break
        return 0  # not the list our middleware cut (another one replaced it): a whole history

    def check_history(self, agent: Any) -> str | None:
        """Check ``agent.messages`` against what the model read (the plugin does at every invocation's
        start; O(history)). Returns why it no longer continues the episode, or None; the next call then
        starts a new context segment (``new_segment_on_context_change``) or raises
        :class:`~strands_slime.errors.TrajectoryDesyncError`."""
        if not self.history.outputs or self._agent is None or self._agent() is not agent:
            return None
        return self.history.verify(agent.messages)

    def update_config(self, **model_config: Any) -> None:
        """Change any key ``get_config`` shows (``params`` is the seed alias of ``sampling_params``,
        which is replaced, not merged). Template options apply from the next rendered turn."""
        _seed_alias(model_config, "SGLangModel.update_config")
        unknown = sorted(set(model_config) - set(CONFIG_KEYS))
        if unknown:
            raise _unknown_arguments("SGLangModel.update_config()", unknown, [*CONFIG_KEYS, *SEED_ALIASES])
        if "sampling_params" in model_config:
            model_config["sampling_params"] = dict(model_config["sampling_params"] or {})
        if model_config.get("template_kwargs") is not None:
            model_config["template_kwargs"] = dict(model_config["template_kwargs"])
        self.config.update(model_config)
        if model_config.keys() & {"enable_thinking", "chat_template", "template_kwargs", "chat_family"}:
            self.templater = self._templater()

    def get_config(self) -> SGLangConfig:
        """The provider's configuration (Strands ``Model`` API)."""
        return self.config  # type: ignore[return-value]

    @property
    def sampling_params(self) -> dict[str, Any]:
        """The sampling parameters sent with every ``/generate`` request."""
        return self.config["sampling_params"]

    async def structured_output(  # type: ignore[override]
        self, output_model: Any, prompt: Messages, system_prompt: str | None = None, **kwargs: Any
    ) -> AsyncGenerator[dict[str, Any], None]:
        """One turn sampled under SGLang's ``json_schema`` constraint for ``output_model`` (a pydantic class).

        Called by an agent's loop the turn lands in the trajectory like any other; called directly on
        a model an agent holds (the deprecated ``Agent.structured_output``) it is a side call, outside
        the trajectory. Yields the call's stream events, then ``{"output": instance}``. A reply cut by the token limit raises ``MaxTokensReachedException``.
        """
        events = self.stream(
            prompt, None, system_prompt, output_schema=output_model_schema(output_model), **kwargs
        )
        stop_reason = None
        async for event in events:
            if "messageStop" in event:
                stop_reason = event["messageStop"]["stopReason"]
            yield event
        if stop_reason == "max_tokens":
            raise MaxTokensReachedException(
                f"structured output for {output_model.__name__} was cut at the token limit before its JSON ended"
            )
        text = self._reply_text or ""
        if self._constraint_reasoning == "open":  # the grammar admits no "</" inside the reasoning
            text = text.partition(THINK_CLOSE)[2]
        try:
            output = output_model.model_validate_json(text.strip())
        except ValueError as exc:
            raise StructuredOutputException(
                f"the constrained reply does not validate as {output_model.__name__}: {exc}"
            ) from exc
        yield {"output": output}

    def _reasoning_mode(self, prompt_text: str) -> ReasoningMode:
        """Whether a constrained reply starts inside reasoning, may open it, or has none."""
        if self.templater.prompt_opens_reasoning(prompt_text):
            return "open"
        if self.config.get("enable_thinking") is False or THINK_OPEN not in str(self.templater.chat_template):
            return "none"
        return "optional"

    def _constrain(
        self,
        params: dict[str, Any],
        tool_choice: ToolChoice | None,
        tool_specs: list[ToolSpec] | None,
        prompt_text: str,
        output_schema: str | None,
    ) -> dict[str, Any]:
        """Add the turn's SGLang constraint: the output model's ``json_schema``, or the ``ebnf`` that
        enforces ``tool_choice`` (``auto`` adds nothing)."""
        self._constraint_reasoning = None
        if output_schema is not None:
            mode = self._reasoning_mode(prompt_text)
            self._constraint_reasoning = "open" if mode == "open" else "none"
            if mode == "open":  # json_schema would start inside <think>: prefix the reasoning
                return merge_constraint(params, {"ebnf": json_output_ebnf(output_schema)})
            return merge_constraint(params, {"json_schema": output_schema})
        names = tool_choice_names(tool_choice, tool_specs)  # type: ignore[arg-type]
        if names is None:
            return params
        mode = self._reasoning_mode(prompt_text)
        self._constraint_reasoning = mode
        grammar = tool_call_ebnf(tool_specs or [], names, self.tool_parser.name, mode)  # type: ignore[arg-type]
        return merge_constraint(params, {"ebnf": grammar})

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
            system_prompt = _system_text(system_prompt_content)
        template_messages = to_template_messages(messages, self._call_order.get, self._native_call_ids.get)
        if tool_specs is None and system_prompt is None and self.trajectory.ends_with_output:
            if not template_messages:
                return 0
            ids, _ = await self._continuation_ids(template_messages, for_call=False)
        else:
            if not template_messages and not system_prompt and not tool_specs:
                return 0
            ids, _ = await self._initial_ids(template_messages, tool_specs, system_prompt, for_call=False)
        return len(ids)

    @property
    def context_window_limit(self) -> int | None:
        """The context limit (what Strands' proactive compression reads): the configured one, or the
        server's (``use_server_context_length``) once a call has read it."""
        configured = self.config.get("context_window_limit")
        seen = self._context_limit_seen
        return min(limit for limit in (configured, seen) if limit) if configured or seen else None

    # ------------------------------------------------------------------ what the plugin reads

    def take_tool_call_error(self, tool_use_id: str) -> str | None:
        """The explanation a malformed call gets instead of running (None for a valid call); taken once."""
        return self._tool_errors.pop(tool_use_id, None)

    def tool_call_error(self, tool_use_id: str) -> str | None:
        """The explanation a malformed call will get (None for a valid call)."""
        return self._tool_errors.get(tool_use_id)

    def _check_plugin(self, invocation_state: Mapping[str, Any] | None) -> None:
        agent = (invocation_state or {}).get("agent")
        if agent is None or agent in self._attached_agents or self._plugin_warned:
            return
        self._plugin_warned = True
        if not get_runtime().first_time("model without its plugin"):
            return  # once per process: a loop that builds a model per episode would repeat it per episode
        logger.warning(
            "SGLangModel is used without its plugin: pass Agent(..., plugins=[model.plugin()]) so that "
            "malformed tool calls get the parser's explanation instead of running with {}, each call "
            "reads only new messages, and edits to agent.messages between invocations are found (the "
            "trajectory is exact either way)"
        )

    # ------------------------------------------------------------------ prompt assembly

    def _matching_output(self, messages: Messages, offset: int) -> int:
        """How many recorded outputs to keep: up to the latest one found in ``messages`` (which start at
        history position ``offset``), 0 when none is."""
        outputs = self.history.outputs
        for keep in range(len(outputs), 0, -1):
            index = outputs[keep - 1].position - offset
            if 0 <= index < len(messages):
                message = messages[index]
                if (
                    message["role"] == "assistant"
                    and output_signature(message["content"]) == outputs[keep - 1].signature
                ):
                    return keep
        return 0

    def _judge(self, messages: Messages, offset: int, agent: Any) -> tuple[Verdict, Messages]:
        """How the call relates to the episode (see :class:`~strands_slime.provider.history.EpisodeHistory`),
        and the messages it was judged on. A history that no longer continues the episode starts a new
        context segment (``new_segment_on_context_change``) or raises, naming the cause and the fix."""
        verdict = self.history.judge(messages, offset)
        if verdict.changed is None:
            return verdict, messages
        cause, fix = self._change_cause(verdict.changed, agent)
        if not self.new_segment_on_context_change:
            raise TrajectoryDesyncError(f"{cause}. {fix}")
        # The trajectory so far is one finished segment and this history starts the next one
        # (fan-out: one training sample per segment).
        logger.debug("new context segment: %s", cause)
        if self.trajectory.num_outputs:
            self.closed_trajectories.append(self.trajectory)
        self.trajectory = TokenTrajectory()
        self._turn_chunks, self._chunked = [], self.trajectory
        self.history.start_over()
        if offset:  # the plugin cut the call at an output: the new segment needs the whole history
            if agent is None:
                raise TrajectoryDesyncError(f"{cause}, and the call does not hold the whole history")
            messages, offset = [{"role": m["role"], "content": m["content"]} for m in agent.messages], 0
        return self.history.judge(messages, 0), messages

    def _change_cause(self, reason: str, agent: Any) -> tuple[str, str]:
        """Why the history changed, in words, and what to do about it."""
        manager = getattr(agent, "conversation_manager", None)
        removed = getattr(manager, "removed_message_count", None)
        if isinstance(removed, int) and self._removed_count is not None and removed != self._removed_count:
            return (
                f"the agent's conversation manager ({type(manager).__name__}) compacted the history the "
                f"trajectory holds ({removed - self._removed_count} message(s) removed or summarized since "
                "the model's previous call)",
                "One trajectory cannot hold a compacted history: pass new_segment_on_context_change=True to "
                "close it and train each context segment as its own sample (the rollout's fanout), or use "
                "NullConversationManager",
            )
        return (
            f"the agent's history no longer continues the trajectory: {reason}",
            "The trajectory holds what the model read, and text it read cannot change: add the change as a "
            "new message instead, or call model.reset() to start a new episode from the changed history "
            "(read model.trajectory first); with new_segment_on_context_change=True such a change starts a "
            "new context segment",
        )

    def _rollback(self, keep: int) -> None:
        if keep < self.trajectory.turn_count:
            self.stats.rolled_back_turns += self.trajectory.turn_count - keep
            self.trajectory.rollback_turns(keep)
            del self._turn_chunks[keep:]

    async def _prompt_delta(
        self,
        messages: Messages,
        tool_specs: list[ToolSpec] | None,
        system_prompt: str | None,
        offset: int,
        agent: Any,
    ) -> tuple[bool, list[int], str, list[dict[str, Any]]]:
        verdict, messages = self._judge(messages, offset, agent)
        self._rollback(verdict.keep)
        self.history.accept(verdict)
        manager = getattr(agent, "conversation_manager", None)
        self._removed_count = getattr(manager, "removed_message_count", None)
        initial = verdict.initial
        new_messages = messages if initial else messages[verdict.start :]
        if not initial and not new_messages:
            raise TrajectoryDesyncError(
                "no new messages since the last model output; nothing to generate from"
            )
        template_messages = to_template_messages(
            new_messages, self._call_order.get, self._native_call_ids.get
        )
        if initial:
            self._initial_position = len(messages)
            self._tools_fingerprint = _fingerprint(tool_specs, system_prompt)
            ids, text = await self._initial_ids(template_messages, tool_specs, system_prompt)
            self.first_prompt_ids = token_array(ids)
            if system_prompt:
                template_messages = [{"role": "system", "content": system_prompt}, *template_messages]
            return True, ids, text, template_messages
        if _fingerprint(tool_specs, system_prompt) != self._tools_fingerprint:
            logger.warning(
                "tools or system prompt changed mid-episode; the trajectory keeps the original ones"
            )
            self._tools_fingerprint = _fingerprint(tool_specs, system_prompt)
        ids, text = await self._continuation_ids(template_messages)
        return False, ids, text, template_messages

    async def _initial_ids(
        self,
        template_messages: list[dict[str, Any]],
        tool_specs: list[ToolSpec] | None,
        system_prompt: str | None,
        for_call: bool = True,
    ) -> tuple[list[int], str]:
        """The ids and text of a whole prompt: system, tools, ``template_messages``, generation prompt."""
        tools = tool_specs_to_template_tools(tool_specs)
        return await self._render_ids(
            ("initial", system_prompt, tools, template_messages),
            lambda size: self.templater.render_async(
                lambda: self.templater.initial_prompt_text(template_messages, system_prompt, tools), size
            ),
            template_messages,
            for_call,
        )

    async def _continuation_ids(
        self, template_messages: list[dict[str, Any]], for_call: bool = True
    ) -> tuple[list[int], str]:
        """The ids and text the next call appends after the model's last output: its turn closing,
        ``template_messages`` and the generation prompt."""
        last = self.trajectory.token_ids[-1] if self.trajectory.ends_with_output else None
        return await self._render_ids(
            ("continuation", len(self.trajectory), last, template_messages),
            lambda size: self.templater.continuation_text_async(template_messages, last, size),
            template_messages,
            for_call,
        )

    async def _render_ids(
        self,
        key: tuple[Any, ...],
        render: Callable[[int], Awaitable[str]],
        template_messages: list[dict[str, Any]],
        for_call: bool,
    ) -> tuple[list[int], str]:
        """Render and encode a prompt. :meth:`count_tokens` renders the next call's prompt
        (``for_call`` False) and keeps it for that call, which takes it: one use, so nothing is held
        past the call (these are lists the garbage collector would walk)."""
        rendered, self._rendered = self._rendered, None
        if rendered is not None and rendered[0] == key:
            return rendered[1], rendered[2]
        size = sum(len(m.get("content") or "") for m in template_messages)
        text = await render(size)  # the size of the new contents: where a render goes off the loop
        ids = await self.templater.encode_async(text)
        if not for_call:
            self._rendered = (key, ids, text)
        return ids, text

    async def _initial_text(
        self,
        template_messages: list[dict[str, Any]],
        tool_specs: list[ToolSpec] | None,
        system_prompt: str | None,
        size: int,
    ) -> str:
        tools = tool_specs_to_template_tools(tool_specs)
        return await self.templater.render_async(
            lambda: self.templater.initial_prompt_text(template_messages, system_prompt, tools), size
        )

    async def initial_prompt_ids(
        self, messages: Messages, tool_specs: list[ToolSpec] | None, system_prompt: str | None
    ) -> list[int]:
        """The ids the first model call of an episode over ``messages`` sends (changes no state): the
        prompt of a sample whose episode ended before any output."""
        template_messages = to_template_messages(messages, self._call_order.get)
        size = sum(len(m.get("content") or "") for m in template_messages)
        text = await self._initial_text(template_messages, tool_specs, system_prompt, size)
        return await self.templater.encode_async(text)

    async def _context_limit(self) -> int | None:
        limits = [self.config.get("context_window_limit")]
        if self.config.get("use_server_context_length", True):
            try:
                limits.append(await self.client.usable_context_length())
            except SGLangClientError as exc:
                logger.debug("server context length unavailable: %s", exc)
        known = [int(limit) for limit in limits if limit]
        limit = min(known) if known else None
        self._context_limit_seen = limit
        return limit

    async def _context_limit_or_abort(self, abort_check: Callable[[], bool] | None) -> int | None:
        try:
            return await run_abortable(self._context_limit(), abort_check, "the model call")
        except AbortedError as exc:  # the episode ends here: no copy (hundreds abort at once)
            raise GenerationAborted(str(exc), trajectory=self.trajectory) from exc

    # ------------------------------------------------------------------ stream

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
        outside the loop (a conversation manager's summary) is served without touching it. A forced
        ``tool_choice`` is enforced with a grammar."""
        agent = (invocation_state or {}).get("agent")
        if system_prompt is None and system_prompt_content:
            system_prompt = _system_text(system_prompt_content)
        if agent is not None and self.serves(agent):
            self._follow_saved(kwargs.get("model_state"))
        if self._is_side_call(agent, tool_specs, system_prompt):
            async for event in self._side_call(messages, tool_specs, system_prompt, tool_choice, kwargs):
                yield event
            return
        self._fresh = False
        offset = self._take_offset(agent, messages)
        self._check_plugin(invocation_state)
        if self.abort_check is not None and self.abort_check():
            raise GenerationAborted(
                "rollout aborted before the model call", trajectory=self.trajectory.copy()
            )
        # agent.cancel(): Strands reports a stream that ends without a message as cancelled. The call is
        # not made, or (without an abort_check of the driver's) its request is abandoned, and nothing is
        # recorded; a reply that arrives after the cancel is dropped too.
        cancel_signal = kwargs.get("cancel_signal")
        cancelled: Callable[[], bool] | None = getattr(cancel_signal, "is_set", None)
        if cancelled is not None and cancelled():
            return
        abort_check = self.abort_check if self.abort_check is not None else cancelled

        if self.pace is not None:
            await self.pace("render")
        initial, delta, prompt_text, turn_messages = await self._prompt_delta(
            messages, tool_specs, system_prompt, offset, agent
        )
        cut_output, cut_logprobs = self._take_continuation_for(delta)
        input_len = len(self.trajectory) + len(delta) + len(cut_output)
        try:
            context_limit = await self._context_limit_or_abort(abort_check)
        except GenerationAborted:
            if cancelled is not None and cancelled():
                self._restore_continuation(delta, cut_output, cut_logprobs)
                return
            raise
        params = self._turn_sampling_params(initial, delta, input_len, context_limit, len(cut_output), agent)
        params = self._constrain(params, tool_choice, tool_specs, prompt_text, kwargs.get("output_schema"))

        extra: dict[str, Any] = {}
        if self.return_routed_experts:  # rows already known from earlier calls are not sent again
            extra["return_routed_experts"] = True
            extra["routed_experts_start_len"] = max(0, len(self.trajectory) - 1)
        started = time.perf_counter()
        # The ids are one array built inline and not kept here: the client encodes it without making
        # a list of it, and drops it before awaiting.
        try:
            response = await self._send(
                self.client.generate(
                    self.trajectory.token_ids + token_array(delta + cut_output),
                    params,
                    return_logprob=self.return_logprob,
                    routing_key=self.routing_key,
                    abort_check=abort_check,
                    vocab_size=vocabulary_size(self.tokenizer),
                    check_ids=slice(len(self.trajectory), None),  # the trajectory's ids went out before
                    **extra,
                ),
                params,
                input_len,
                traced=True,
            )
        except GenerationAborted:
            if cancelled is not None and cancelled():
                self._restore_continuation(delta, cut_output, cut_logprobs)
                return
            raise
        if cancelled is not None and cancelled():
            self._restore_continuation(delta, cut_output, cut_logprobs)
            return
        if self.return_routed_experts:  # SGLang does not echo it; slime's Sample reads it from meta_info
            response.meta_info.setdefault("routed_experts_start_len", extra["routed_experts_start_len"])
        self.stats.turn_seconds.append(time.perf_counter() - started)
        self.stats.generation_seconds += self.stats.turn_seconds[-1]
        self.stats.model_calls += 1
        if self.pace is not None:
            await self.pace("reply")

        if response.is_abort:
            partial = self.trajectory.copy()
            _append_turn(partial, delta, response, cut_output, cut_logprobs)
            self.stats.finish_reasons.append("abort")
            message = response.finish_reason.message if response.finish_reason else None
            raise GenerationAborted(
                f"generation aborted by the server ({message or 'no message'})",
                trajectory=partial,
                queued=response.prompt_tokens is None,
            )
        _append_turn(self.trajectory, delta, response, cut_output, cut_logprobs)
        self.stats.prompt_tokens += response.prompt_tokens or 0
        self.stats.cached_tokens += response.cached_tokens
        self.stats.completion_tokens += response.completion_tokens
        events = await self._reply_events(
            response, tool_specs, prompt_text, cut_output, record=(offset + len(messages), turn_messages)
        )
        self._save(kwargs.get("model_state"), kwargs.get("agent_metadata"))
        for event in events:
            yield event

    async def _side_call(
        self,
        messages: Messages,
        tool_specs: list[ToolSpec] | None,
        system_prompt: str | None,
        tool_choice: ToolChoice | None,
        kwargs: Mapping[str, Any],
    ) -> AsyncGenerator[StreamEvent, None]:
        """Serve a call that does not continue the episode (Strands' summarizer asks the agent's model
        for a summary of old messages under its own system prompt): a whole prompt of its own, the
        reply returned as usual, nothing recorded in the trajectory or the episode's bookkeeping."""
        if self.abort_check is not None and self.abort_check():
            raise GenerationAborted(
                "rollout aborted before the model call", trajectory=self.trajectory.copy()
            )
        template_messages = to_template_messages(messages)
        size = sum(len(m.get("content") or "") for m in template_messages)
        text = await self._initial_text(template_messages, tool_specs, system_prompt, size)
        ids = await self.templater.encode_async(text)
        context_limit = await self._context_limit_or_abort(self.abort_check)
        params = self._sampling_params(len(ids), context_limit, [], None)
        params = self._constrain(params, tool_choice, tool_specs, text, kwargs.get("output_schema"))
        response = await self._send(
            self.client.generate(
                token_array(ids),
                params,
                return_logprob=self.return_logprob,
                routing_key=self.routing_key,
                abort_check=self.abort_check,
                vocab_size=vocabulary_size(self.tokenizer),
            ),
            params,
            len(ids),
            traced=False,
        )
        self.stats.side_calls += 1
        if response.is_abort:
            raise GenerationAborted(
                "generation aborted by the server during a side call", trajectory=self.trajectory
            )
        for event in await self._reply_events(response, tool_specs, text, None, record=None):
            yield event

    async def _send(
        self,
        request: Coroutine[Any, Any, GenerateResponse],
        params: Mapping[str, Any],
        input_len: int,
        traced: bool,
    ) -> GenerateResponse:
        """Await one ``/generate`` ``request`` (in the request trace when ``traced``), with the client's
        errors as the model's."""
        trace = self.request_trace(params) if traced and self.request_trace is not None else nullcontext(None)
        try:
            with trace as record_meta:
                response = await request
                if record_meta is not None:
                    record_meta(response.meta_info)
        except SGLangAbortedError as exc:  # slime aborted: nothing was sent, or the wait was cut short
            raise GenerationAborted(str(exc), trajectory=self.trajectory, queued=True) from exc
        except SGLangContextLengthError as exc:
            raise ContextLimitExceeded(str(exc), prompt_tokens=input_len) from exc
        except SGLangThrottledError as exc:
            raise ModelThrottledException(str(exc)) from exc
        return response

    def _min_reply_tokens(self, agent: Any, context_limit: int) -> int:
        """The room a reply needs: ``min_reply_tokens``; by default, when the agent's conversation
        manager can compact the history (the overflow then lets it), :data:`DEFAULT_MIN_REPLY_TOKENS` or
        a quarter of the context window if that is less; 1 when nothing can compact
        (``NullConversationManager``, no agent: a short reply is all there is)."""
        configured = self.config.get("min_reply_tokens")
        if configured is not None:
            return max(1, int(configured))
        manager = getattr(agent, "conversation_manager", None)
        if manager is None or isinstance(manager, NullConversationManager):
            return 1
        return max(1, min(DEFAULT_MIN_REPLY_TOKENS, context_limit // 4))

    def _sampling_params(
        self, input_len: int, context_limit: int | None, caps: list[int], agent: Any
    ) -> dict[str, Any]:
        """The sampling parameters of one call: ``max_new_tokens`` = min(configured, ``caps``, context
        room). A context that leaves less room than a reply needs raises ``ContextLimitExceeded``."""
        params = dict(self.sampling_params)
        if params.get("max_new_tokens") is not None:
            caps = [int(params["max_new_tokens"]), *caps]
        if context_limit is not None:
            room = context_limit - input_len
            needed = min([self._min_reply_tokens(agent, context_limit), *caps])
            if room <= 0 or room < needed:
                detail = (
                    f", leaving {room} for the reply; it needs {needed} (min_reply_tokens)"
                    if room > 0
                    else ""
                )
                raise ContextLimitExceeded(
                    f"the next prompt has {input_len} tokens, the context window {context_limit}{detail}",
                    prompt_tokens=input_len,
                    limit=context_limit,
                )
            caps.append(room)
        if caps:
            params["max_new_tokens"] = min(caps)
        return params

    def _turn_sampling_params(
        self,
        initial: bool,
        delta: list[int],
        input_len: int,
        context_limit: int | None,
        cut_output: int = 0,
        agent: Any = None,
    ) -> dict[str, Any]:
        caps: list[int] = []
        budget = self.config.get("max_response_tokens")
        if budget is not None:
            used = self.trajectory.response_length
            pending = (0 if initial else len(delta)) + cut_output
            remaining = int(budget) - used - pending
            if remaining <= 0:
                raise ResponseBudgetExhausted(used, int(budget), pending)
            caps.append(remaining)
        return self._sampling_params(input_len, context_limit, caps, agent)

    async def _reply_events(
        self,
        response: GenerateResponse,
        tool_specs: list[ToolSpec] | None,
        prompt_text: str,
        cut_output: list[int] | None,
        record: tuple[int, list[dict[str, Any]]] | None,
    ) -> list[StreamEvent]:
        """The reply as Strands stream events. ``record`` = (the output's position in the history, the
        turn's chat-template messages) for an episode turn: its output and tool calls are recorded
        before any event is handed out; None for a side call (nothing is recorded)."""
        output_ids = cut_output + response.output_ids if cut_output else response.output_ids
        body = (
            output_ids[:-1] if output_ids and output_ids[-1] in self.templater.stop_token_ids else output_ids
        )
        text = await self.templater.decode_async(body)
        self._reply_text = text
        finish = response.finish_reason.type if response.finish_reason else "stop"
        opened = self.templater.prompt_opens_reasoning(prompt_text)
        parsed = parse_output(text, self.tool_parser, tool_specs, prompt_opened_reasoning=opened)
        if record is not None:
            self.last_output_text = text
            self.stats.finish_reasons.append(finish)
            self.last_parsed = parsed

        content: list[dict[str, Any]] = []
        events: list[StreamEvent] = [{"messageStart": {"role": "assistant"}}]
        if parsed.reasoning:
            events.append({"contentBlockStart": {"start": {}}})
            events.append({"contentBlockDelta": {"delta": {"reasoningContent": {"text": parsed.reasoning}}}})
            events.append({"contentBlockStop": {}})
            content.append({"reasoningContent": {"reasoningText": {"text": parsed.reasoning}}})
        calls = parsed.tool_calls if finish != "length" else []
        visible = parsed.text
        if finish == "length" and parsed.tool_calls:
            visible = "\n".join(part for part in (parsed.text, *(c.raw for c in parsed.tool_calls)) if part)
        if visible:
            events.append({"contentBlockStart": {"start": {}}})
            events.append({"contentBlockDelta": {"delta": {"text": visible}}})
            events.append({"contentBlockStop": {}})
            content.append({"text": visible})
        for number, call in enumerate(calls):
            if record is None:
                tool_use_id = f"side_{self._id_prefix}_{self.stats.side_calls:04d}_{number}"
            else:
                tool_use_id = f"call_{self._id_prefix}_{len(self._call_order):04d}"
                self._call_order[tool_use_id] = len(self._call_order)
                if call.call_id:
                    self._native_call_ids[tool_use_id] = call.call_id
                self.stats.tool_calls += 1
                if call.error is not None:
                    self.stats.parse_errors += 1
                    self.stats.parse_error_messages.append(call.error)
                    self._tool_errors[tool_use_id] = self.tool_parser.explain_error(call.error, call.raw)
            arguments = call.arguments if call.arguments is not None else {}
            events.append(
                {"contentBlockStart": {"start": {"toolUse": {"name": call.name, "toolUseId": tool_use_id}}}}
            )
            events.append(
                {
                    "contentBlockDelta": {
                        "delta": {"toolUse": {"input": json.dumps(arguments, ensure_ascii=False)}}
                    }
                }
            )
            events.append({"contentBlockStop": {}})
            content.append({"toolUse": {"toolUseId": tool_use_id, "name": call.name, "input": arguments}})
        if record is not None:
            assistant: dict[str, Any] = {"role": "assistant", "content": visible}
            if parsed.reasoning is not None:
                assistant["reasoning_content"] = parsed.reasoning
            if calls:
                assistant["tool_calls"] = [
                    {"type": "function", "function": {"name": c.name, "arguments": c.arguments or {}}}
                    for c in calls
                ]
            position, turn_messages = record
            self.history.outputs.append(
                OutputRecord(position, output_signature(content), turn_messages, assistant)
            )

        if finish == "length":
            stop_reason = "max_tokens"
        elif calls:
            stop_reason = "tool_use"
        else:
            stop_reason = "end_turn"
        events.append({"messageStop": {"stopReason": stop_reason}})
        prompt_tokens = response.prompt_tokens
        if prompt_tokens is None:
            prompt_tokens = len(self.trajectory) - len(output_ids) if record is not None else 0
        usage: dict[str, Any] = {
            "inputTokens": prompt_tokens,
            "outputTokens": response.completion_tokens,
            "totalTokens": prompt_tokens + response.completion_tokens,
        }
        if response.cached_tokens:
            usage["cacheReadInputTokens"] = response.cached_tokens
        latency = response.e2e_latency
        events.append(
            {
                "metadata": {
                    "usage": usage,  # type: ignore[typeddict-item]
                    "metrics": {"latencyMs": int((latency or 0.0) * 1000)},
                }
            }
        )
        return events


def _system_text(blocks: Sequence[Mapping[str, Any]]) -> str | None:
    """The system prompt's text, as Strands joins its text blocks for ``system_prompt`` (cache points
    and other non-text blocks say nothing to the model)."""
    return "\n".join(str(block["text"]) for block in blocks if "text" in block) or None


def _stats_dict(stats: ModelStats) -> dict[str, Any]:
    """``stats`` as plain JSON (what ``dataclasses.asdict`` gives, without its recursive deep copy)."""
    values = {f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)}
    return {name: list(value) if isinstance(value, list) else value for name, value in values.items()}


def _warn_renamed(name: str) -> None:
    """One DeprecationWarning per old attribute name and process."""
    if get_runtime().first_time(f"deprecated: SGLangModel.{name}"):
        warnings.warn(
            f"SGLangModel.{name} is deprecated; use SGLangModel.trajectory (the same object)",
            DeprecationWarning,
            stacklevel=3,
        )


def _append_turn(
    trajectory: TokenTrajectory,
    delta: list[int],
    response: GenerateResponse,
    cut_output: list[int] | None = None,
    cut_logprobs: list[float] | None = None,
) -> None:
    trajectory.begin_turn()
    trajectory.add_prompt(delta)
    if cut_output:  # a resumed call: the output it had before the abort, then what it went on with
        trajectory.add_output(cut_output, list(cut_logprobs or []))
    logprobs = response.output_logprobs or [None] * len(response.output_ids)
    trajectory.add_output(response.output_ids, logprobs, response.meta_info)


def _fingerprint(
    tool_specs: Sequence[Mapping[str, Any]] | None, system_prompt: str | None
) -> tuple[Any, ...]:
    names = tuple(sorted(str(spec.get("name")) for spec in tool_specs or []))
    return names, system_prompt
