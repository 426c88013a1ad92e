"""What one model call may sample: ``max_new_tokens`` from the episode's response budget, the context
window and the configured cap; the room a reply needs; and the call's SGLang constraint.

``max_new_tokens`` = min(configured, what the episode's ``max_response_tokens`` has left, the context
room). A context that leaves less room than a reply needs raises
:class:`~strands_slime.errors.ContextLimitExceeded`, so a conversation manager compacts instead of the
model writing a reply cut to a few tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from strands.agent.conversation_manager import NullConversationManager
from strands.types.tools import ToolChoice, ToolSpec

from strands_slime.aborts import AbortedError, run_abortable
from strands_slime.errors import ContextLimitExceeded, GenerationAborted, ResponseBudgetExhausted
from strands_slime.provider.client_errors import SGLangClientError
from strands_slime.provider.constraints import (
    ReasoningMode,
    json_output_ebnf,
    merge_constraint,
    tool_call_ebnf,
    tool_choice_names,
)
from strands_slime.provider.tool_parsers import THINK_OPEN

logger = logging.getLogger(__name__)

DEFAULT_MIN_REPLY_TOKENS = 1024
"""Room a reply needs when ``min_reply_tokens`` is None and the agent's conversation manager can
compact its history (at most a quarter of the context window): with less, the call raises
``ContextLimitExceeded`` so the manager compacts instead of the model writing a reply cut to a few
tokens."""


class ContextWindow:
    """The context limit: the configured one, or the server's (``use_server_context_length``)."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen: int | None = None

    def limit(self, config: Mapping[str, Any]) -> int | None:
        """What Strands' proactive compression reads: known without a call once one has read the server's."""
        configured = config.get("context_window_limit")
        known = [limit for limit in (configured, self.seen) if limit]
        return min(known) if known else None

    async def read(
        self, config: Mapping[str, Any], client: Any, abort_check: Callable[[], bool] | None, trajectory: Any
    ) -> int | None:
        """The limit for the next call (the server's asked once per client, cached by it)."""
        limits = [config.get("context_window_limit")]
        if config.get("use_server_context_length", True):
            server = client.known_context_length()  # after the first call: no task, no loop round trip
            if server is None:
                try:
                    server = await run_abortable(
                        client.usable_context_length(), abort_check, "the model call"
                    )
                except AbortedError as exc:  # the episode ends here: no copy (hundreds abort at once)
                    raise GenerationAborted(str(exc), trajectory=trajectory) from exc
                except SGLangClientError as exc:
                    logger.debug("server context length unavailable: %s", exc)
            limits.append(server)
        known = [int(limit) for limit in limits if limit]
        self.seen = min(known) if known else None
        return self.seen


def min_reply_tokens(config: Mapping[str, Any], agent: Any, context_limit: int) -> int:
    """The room a reply needs: ``min_reply_tokens``; by default, when the agent's conversation manager
    can compact the history, :data:`DEFAULT_MIN_REPLY_TOKENS` or a quarter of the window if that is less;
    1 when nothing can compact (``NullConversationManager``, no agent: a short reply is all there is)."""
    configured = config.get("min_reply_tokens")
    if configured is not None:
        return max(1, int(configured))
    manager = getattr(agent, "conversation_manager", None)
    if manager is None or isinstance(manager, NullConversationManager):
        return 1
    return max(1, min(DEFAULT_MIN_REPLY_TOKENS, context_limit // 4))


def sampling_params(
    config: Mapping[str, Any],
    input_len: int,
    context_limit: int | None,
    agent: Any,
    response_used: int | None = None,
    pending: int = 0,
) -> dict[str, Any]:
    """The sampling parameters of one call. ``response_used`` (an episode turn): the response tokens
    the episode holds, ``pending`` those the call adds before sampling; None for a side call."""
    params = dict(config["sampling_params"])
    caps: list[int] = []
    if params.get("max_new_tokens") is not None:
        caps.append(int(params["max_new_tokens"]))
    budget = config.get("max_response_tokens")
    if budget is not None and response_used is not None:
        remaining = int(budget) - response_used - pending
        if remaining <= 0:
            raise ResponseBudgetExhausted(response_used, int(budget), pending)
        caps.append(remaining)
    if context_limit is not None:
        room = context_limit - input_len
        needed = min([min_reply_tokens(config, agent, context_limit), *caps])
        if room <= 0 or room < needed:
            detail = (
                f", leaving {room} for the reply; it needs {needed} (min_reply_tokens)" if room > 0 else ""
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


def constrain(
    params: dict[str, Any],
    templater: Any,
    tool_parser: Any,
    enable_thinking: bool | None,
    request: tuple[ToolChoice | None, list[ToolSpec] | None, str, str | None],
) -> tuple[dict[str, Any], ReasoningMode | None]:
    """Add the turn's SGLang constraint: the output model's ``json_schema`` (``request``'s last item), or
    the ``ebnf`` that enforces ``tool_choice`` (``auto`` adds nothing). Returns the parameters and where a
    constrained reply's reasoning is (what the caller strips before reading the JSON)."""
    tool_choice, tool_specs, prompt_text, output_schema = request
    if output_schema is not None:
        mode = _reasoning_mode(templater, enable_thinking, prompt_text)
        if mode == "open":  # json_schema would start inside <think>: prefix the reasoning
            return merge_constraint(params, {"ebnf": json_output_ebnf(output_schema)}), "open"
        return merge_constraint(params, {"json_schema": output_schema}), "none"
    names = tool_choice_names(tool_choice, tool_specs)  # type: ignore[arg-type]
    if names is None:
        return params, None
    mode = _reasoning_mode(templater, enable_thinking, prompt_text)
    grammar = tool_call_ebnf(tool_specs or [], names, tool_parser.name, mode)  # type: ignore[arg-type]
    return merge_constraint(params, {"ebnf": grammar}), mode


def _reasoning_mode(templater: Any, enable_thinking: bool | None, prompt_text: str) -> ReasoningMode:
    """Whether a constrained reply starts inside reasoning, may open it, or has none."""
    if templater.prompt_opens_reasoning(prompt_text):
        return "open"
    if enable_thinking is False or THINK_OPEN not in str(templater.chat_template):
        return "none"
    return "optional"
