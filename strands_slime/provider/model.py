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
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, TypedDict

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
    ResponseBudgetExhausted,
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
from strands_slime.provider.plugin import TITOPlugin
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
    turn_seconds: list[float] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    parse_error_messages: list[str] = field(default_factory=list)

    @property
    def last_finish_reason(self) -> str | None:
        """The finish reason of the latest model call, or None before the first call."""
        return self.finish_reasons[-1] if self.finish_reasons else None


@dataclass(slots=True)
class _OutputRecord:
    """What we emitted for one turn, to find it again in the agent's message history, plus the
    chat-template view of the turn (the messages before it and the parsed output) for audits."""

    position: int
    signature: tuple[Any, ...]
    prompt_messages: list[dict[str, Any]]
    assistant: dict[str, Any]


def _message_signature(content: Sequence[Mapping[str, Any]]) -> tuple[Any, ...]:
    ids = tuple(b["toolUse"].get("toolUseId") for b in content if "toolUse" in b)
    texts = [str(b["text"]).strip() for b in content if "text" in b]
    text = "\n".join(t for t in texts if t and t != "[blank text]")
    reasoning = "".join(
        b["reasoningContent"].get("reasoningText", {}).get("text", "")
        for b in content
        if "reasoningContent" in b
    )
    return ids, text, reasoning.strip()


class SGLangModel(Model):
    """Token-in/token-out Strands model for SGLang's native API. One instance per episode
    (call :meth:`reset` to reuse it); the client and tokenizer may be shared by many instances."""

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
        }
        self.templater: ChatTemplater = self._templater()
        self.tool_parser = get_tool_parser(tool_parser or self.templater.family.tool_parser)
        self.abort_check = abort_check
        self.routing_key = routing_key
        self.return_logprob = return_logprob
        self.return_routed_experts = return_routed_experts
        self.request_trace = request_trace
        self.new_segment_on_context_change = new_segment_on_context_change
        self.pace = pace
        self._attached_agents: weakref.WeakSet[Any] = weakref.WeakSet()
        """Agents whose :meth:`plugin` this model was handed to (read to warn when it was not)."""
        self._plugin_warned = False
        self.message_offset = 0
        """Messages the plugin left out of the current call (it hands only the new ones), 0 when none."""
        self.reset()

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
        """Start a new episode: empty trajectory, counters and tool-call bookkeeping."""
        self.trajectory = TokenTrajectory()
        self.closed_trajectories: list[TokenTrajectory] = []
        """Earlier context segments (``new_segment_on_context_change``), oldest first."""
        self.stats = ModelStats()
        self._outputs: list[_OutputRecord] = []
        self._call_order: dict[str, int] = {}
        self._native_call_ids: dict[str, str] = {}
        self._tool_errors: dict[str, str] = {}
        self._id_prefix = uuid.uuid4().hex[:8]
        self._initial_position = 0
        self._tools_fingerprint: Any = None
        self.last_output_text: str | None = None
        self.last_parsed: ParsedOutput | None = None
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
        for record in self._outputs:
            messages.extend(record.prompt_messages)
            messages.append(record.assistant)
        return messages

    def state(self, with_transcript: bool = False) -> dict[str, Any]:
        """The episode's bookkeeping besides the tokens, as plain JSON: counters, tool-call ids and where
        each output sits in the agent's history (each turn's chat-template view only ``with_transcript``:
        :meth:`transcript` needs it, nothing else does). With ``trajectory.layout()`` and the tokens it is
        everything :meth:`from_state` needs to go on with the episode in another model."""
        return {
            "stats": dataclasses.asdict(self.stats),
            "outputs": [
                [
                    r.position,
                    [list(r.signature[0]), *r.signature[1:]],
                    r.prompt_messages if with_transcript else [],
                    r.assistant if with_transcript else {},
                ]
                for r in self._outputs
            ],
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
        self._outputs = [
            _OutputRecord(int(position), (tuple(ids), text, reasoning), list(prompt), dict(assistant))
            for position, (ids, text, reasoning), prompt, assistant in state["outputs"]
        ]
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
        return len(self._outputs)

    def continue_output(self, prompt_ids: list[int], output_ids: array[int], logprobs: array[float]) -> None:
        """Make the next call go on from an output an abort cut short: the call's new messages must
        render to ``prompt_ids`` again, and the server continues after ``output_ids`` (as slime's own
        generate resumes a partial rollout)."""
        self._continuation = (list(prompt_ids), output_ids, logprobs)

    def take_continuation(self) -> tuple[list[int], array[int], array[float]] | None:
        """The continuation no call used yet (the episode ended first), or None; it is cleared."""
        continuation, self._continuation = self._continuation, None
        return continuation

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

        The turn lands in the trajectory like any other; yields its stream events, then
        ``{"output": instance}``. A reply cut by the token limit raises ``MaxTokensReachedException``.
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
        text = self.last_output_text or ""
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
        """Cheap chars/4 estimate Strands asks for before every call (no JSON dumps, no tokenizing)."""
        chars = len(system_prompt or "")
        for message in messages:
            for block in message.get("content") or []:
                if "text" in block:
                    chars += len(str(block["text"]))
                elif "toolResult" in block:
                    chars += sum(
                        len(str(item.get("text", ""))) for item in block["toolResult"].get("content", [])
                    )
                elif "toolUse" in block:
                    chars += len(str(block["toolUse"].get("input", "")))
        return chars // 4

    # ------------------------------------------------------------------ what the plugin reads

    def take_tool_call_error(self, tool_use_id: str) -> str | None:
        """The explanation a malformed call gets instead of running (None for a valid call); taken once."""
        return self._tool_errors.pop(tool_use_id, None)

    def tool_call_error(self, tool_use_id: str) -> str | None:
        """The explanation a malformed call will get (None for a valid call)."""
        return self._tool_errors.get(tool_use_id)

    def last_output_position(self, messages: Messages) -> int | None:
        """Where this model's latest output recorded in ``messages`` (a whole history) sits, or None:
        what the plugin trims the messages of a call to."""
        keep = self._matching_output(messages, 0)
        return self._outputs[keep - 1].position if keep else None

    def _check_plugin(self, invocation_state: Mapping[str, Any] | None) -> None:
        agent = (invocation_state or {}).get("agent")
        if agent is None or agent in self._attached_agents or self._plugin_warned:
            return
        self._plugin_warned = True
        logger.warning(
            "SGLangModel is used without its plugin: pass Agent(..., plugins=[model.plugin()]) so that "
            "malformed tool calls get the parser's explanation instead of running with {}, and each "
            "call reads only new messages (the trajectory is exact either way)"
        )

    # ------------------------------------------------------------------ prompt assembly

    def _matching_output(self, messages: Messages, offset: int) -> int:
        """How many recorded outputs to keep: up to the latest one found in ``messages`` (which start at
        history position ``offset``), 0 when none is."""
        for keep in range(len(self._outputs), 0, -1):
            index = self._outputs[keep - 1].position - offset
            if 0 <= index < len(messages):
                message = messages[index]
                if (
                    message["role"] == "assistant"
                    and _message_signature(message["content"]) == self._outputs[keep - 1].signature
                ):
                    return keep
        return 0

    def _new_messages(self, messages: Messages, offset: int = 0) -> tuple[bool, Messages]:
        """Find which messages are new since our last output; roll back turns Strands re-runs.
        ``messages`` start at history position ``offset`` (see ``_send_only_new_messages``).

        Returns ``(initial, new_messages)``."""
        keep = self._matching_output(messages, offset)
        if keep:
            self._rollback(keep)
            return False, messages[self._outputs[keep - 1].position - offset + 1 :]
        if self._outputs and self.new_segment_on_context_change:
            # The agent compacted its context: the trajectory so far is one finished segment and the
            # compacted history starts the next one (fan-out: one training sample per segment).
            self.closed_trajectories.append(self.trajectory)
            self.trajectory = TokenTrajectory()
            self._outputs = []
        if self._outputs and offset + len(messages) != self._initial_position:
            raise TrajectoryDesyncError(
                "the agent's history no longer contains the model outputs recorded in the trajectory "
                "(a conversation manager changed it?); use NullConversationManager or call model.reset()"
            )
        self._rollback(0)
        return True, messages

    def _rollback(self, keep: int) -> None:
        if keep < len(self._outputs) or keep < self.trajectory.turn_count:
            self.stats.rolled_back_turns += self.trajectory.turn_count - keep
            self.trajectory.rollback_turns(keep)
            del self._outputs[keep:]

    async def _prompt_delta(
        self,
        messages: Messages,
        tool_specs: list[ToolSpec] | None,
        system_prompt: str | None,
        offset: int = 0,
    ) -> tuple[bool, list[int], str, list[dict[str, Any]]]:
        initial, new_messages = self._new_messages(messages, offset)
        if not initial and not new_messages:
            raise TrajectoryDesyncError(
                "no new messages since the last model output; nothing to generate from"
            )
        template_messages = to_template_messages(
            new_messages, self._call_order.get, self._native_call_ids.get
        )
        size = sum(len(m.get("content") or "") for m in template_messages)
        if initial:
            self._initial_position = offset + len(messages)
            self._tools_fingerprint = _fingerprint(tool_specs, system_prompt)
            text = await self._initial_text(template_messages, tool_specs, system_prompt, size)
        else:
            if _fingerprint(tool_specs, system_prompt) != self._tools_fingerprint:
                logger.warning(
                    "tools or system prompt changed mid-episode; the trajectory keeps the original ones"
                )
                self._tools_fingerprint = _fingerprint(tool_specs, system_prompt)
            last = self.trajectory.token_ids[-1] if self.trajectory.ends_with_output else None
            text = await self.templater.render_async(
                lambda: self.templater.continuation_text(template_messages, last), size
            )
        ids = await self.templater.encode_async(text)
        if initial:
            self.first_prompt_ids = token_array(ids)
            if system_prompt:
                template_messages = [{"role": "system", "content": system_prompt}, *template_messages]
        return initial, ids, text, template_messages

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
        return min(known) if known else None

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
        """One model turn over the token trajectory; a forced ``tool_choice`` is enforced with a grammar."""
        offset, self.message_offset = self.message_offset, 0
        if offset and not self._matching_output(messages, offset):
            offset = 0  # not the list our middleware trimmed (another one replaced it): a whole history
        self._check_plugin(invocation_state)
        if self.abort_check is not None and self.abort_check():
            raise GenerationAborted(
                "rollout aborted before the model call", trajectory=self.trajectory.copy()
            )
        if system_prompt is None and system_prompt_content:
            system_prompt = "".join(str(b["text"]) for b in system_prompt_content if "text" in b) or None

        if self.pace is not None:
            await self.pace("render")
        initial, delta, prompt_text, turn_messages = await self._prompt_delta(
            messages, tool_specs, system_prompt, offset
        )
        cut_output, cut_logprobs = self._take_continuation_for(delta)
        input_len = len(self.trajectory) + len(delta) + len(cut_output)
        try:
            context_limit = await run_abortable(self._context_limit(), self.abort_check, "the model call")
        except AbortedError as exc:  # the episode ends here: no copy (hundreds abort at once)
            raise GenerationAborted(str(exc), trajectory=self.trajectory) from exc
        params = self._turn_sampling_params(initial, delta, input_len, context_limit, len(cut_output))
        params = self._constrain(params, tool_choice, tool_specs, prompt_text, kwargs.get("output_schema"))

        extra: dict[str, Any] = {}
        if self.return_routed_experts:  # rows already known from earlier calls are not sent again
            extra["return_routed_experts"] = True
            extra["routed_experts_start_len"] = max(0, len(self.trajectory) - 1)
        started = time.perf_counter()
        trace = self.request_trace(params) if self.request_trace is not None else nullcontext(None)
        try:
            with trace as record_meta:
                # The ids are one array built inline and not kept here: the client encodes it without
                # making a list of it, and drops it before awaiting.
                response = await self.client.generate(
                    self.trajectory.token_ids + token_array(delta + cut_output),
                    params,
                    return_logprob=self.return_logprob,
                    routing_key=self.routing_key,
                    abort_check=self.abort_check,
                    **extra,
                )
                if record_meta is not None:
                    record_meta(response.meta_info)
            if self.return_routed_experts:  # SGLang does not echo it; slime's Sample reads it from meta_info
                response.meta_info.setdefault("routed_experts_start_len", extra["routed_experts_start_len"])
        except SGLangAbortedError as exc:  # slime aborted: nothing was sent, or the wait was cut short
            raise GenerationAborted(str(exc), trajectory=self.trajectory, queued=True) from exc
        except SGLangContextLengthError as exc:
            raise ContextLimitExceeded(str(exc), prompt_tokens=input_len) from exc
        except SGLangThrottledError as exc:
            raise ModelThrottledException(str(exc)) from exc
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
        async for event in self._emit(
            offset + len(messages), response, tool_specs, prompt_text, turn_messages, cut_output
        ):
            yield event

    def _turn_sampling_params(
        self,
        initial: bool,
        delta: list[int],
        input_len: int,
        context_limit: int | None,
        cut_output: int = 0,
    ) -> dict[str, Any]:
        params = dict(self.sampling_params)
        caps: list[int] = []
        if params.get("max_new_tokens") is not None:
            caps.append(int(params["max_new_tokens"]))
        budget = self.config.get("max_response_tokens")
        if budget is not None:
            used = self.trajectory.response_length
            pending = (0 if initial else len(delta)) + cut_output
            remaining = int(budget) - used - pending
            if remaining <= 0:
                raise ResponseBudgetExhausted(used, int(budget), pending)
            caps.append(remaining)
        if context_limit is not None:
            room = context_limit - input_len
            if room <= 0:
                raise ContextLimitExceeded(
                    f"the next prompt has {input_len} tokens, the context window {context_limit}",
                    prompt_tokens=input_len,
                    limit=context_limit,
                )
            caps.append(room)
        if caps:
            params["max_new_tokens"] = min(caps)
        return params

    async def _emit(
        self,
        history_length: int,
        response: GenerateResponse,
        tool_specs: list[ToolSpec] | None,
        prompt_text: str,
        turn_messages: list[dict[str, Any]],
        cut_output: list[int] | None = None,
    ) -> AsyncGenerator[StreamEvent, None]:
        output_ids = cut_output + response.output_ids if cut_output else response.output_ids
        body = (
            output_ids[:-1] if output_ids and output_ids[-1] in self.templater.stop_token_ids else output_ids
        )
        text = await self.templater.decode_async(body)
        self.last_output_text = text
        finish = response.finish_reason.type if response.finish_reason else "stop"
        self.stats.finish_reasons.append(finish)
        opened = self.templater.prompt_opens_reasoning(prompt_text)
        parsed = parse_output(text, self.tool_parser, tool_specs, prompt_opened_reasoning=opened)
        self.last_parsed = parsed

        content: list[dict[str, Any]] = []
        yield {"messageStart": {"role": "assistant"}}
        if parsed.reasoning:
            yield {"contentBlockStart": {"start": {}}}
            yield {"contentBlockDelta": {"delta": {"reasoningContent": {"text": parsed.reasoning}}}}
            yield {"contentBlockStop": {}}
            content.append({"reasoningContent": {"reasoningText": {"text": parsed.reasoning}}})
        calls = parsed.tool_calls if finish != "length" else []
        visible = parsed.text
        if finish == "length" and parsed.tool_calls:
            visible = "\n".join(part for part in (parsed.text, *(c.raw for c in parsed.tool_calls)) if part)
        if visible:
            yield {"contentBlockStart": {"start": {}}}
            yield {"contentBlockDelta": {"delta": {"text": visible}}}
            yield {"contentBlockStop": {}}
            content.append({"text": visible})
        for call in calls:
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
            yield {"contentBlockStart": {"start": {"toolUse": {"name": call.name, "toolUseId": tool_use_id}}}}
            yield {
                "contentBlockDelta": {
                    "delta": {"toolUse": {"input": json.dumps(arguments, ensure_ascii=False)}}
                }
            }
            yield {"contentBlockStop": {}}
            content.append({"toolUse": {"toolUseId": tool_use_id, "name": call.name, "input": arguments}})
        assistant: dict[str, Any] = {"role": "assistant", "content": visible}
        if parsed.reasoning is not None:
            assistant["reasoning_content"] = parsed.reasoning
        if calls:
            assistant["tool_calls"] = [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments or {}}}
                for c in calls
            ]
        self._outputs.append(
            _OutputRecord(
                position=history_length,
                signature=_message_signature(content),
                prompt_messages=turn_messages,
                assistant=assistant,
            )
        )

        if finish == "length":
            stop_reason = "max_tokens"
        elif calls:
            stop_reason = "tool_use"
        else:
            stop_reason = "end_turn"
        yield {"messageStop": {"stopReason": stop_reason}}
        prompt_tokens = response.prompt_tokens or len(self.trajectory) - len(output_ids)
        usage: dict[str, Any] = {
            "inputTokens": prompt_tokens,
            "outputTokens": response.completion_tokens,
            "totalTokens": prompt_tokens + response.completion_tokens,
        }
        if response.cached_tokens:
            usage["cacheReadInputTokens"] = response.cached_tokens
        latency = response.e2e_latency
        yield {
            "metadata": {
                "usage": usage,  # type: ignore[typeddict-item]
                "metrics": {"latencyMs": int((latency or 0.0) * 1000)},
            }
        }


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
