"""The ids a model call sends: a whole first prompt, or only what follows the model's last output.

Only new messages are templated and tokenized; the trajectory keeps everything before them as the ids
that were sent and sampled. ``count_tokens`` (Strands asks before every call) renders the next call's
prompt, which is kept for that call and taken by it: one render per call, nothing held past it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from strands.types.content import Messages
from strands.types.tools import ToolSpec

from strands_slime.errors import TrajectoryDesyncError
from strands_slime.provider.chat import ChatTemplater, to_template_messages, tool_specs_to_template_tools
from strands_slime.provider.trajectory import token_array

logger = logging.getLogger(__name__)


class PromptRenderer:
    """Renders and encodes prompts with the model's current templater, keeping ``count_tokens``' render
    for the call it was made for."""

    __slots__ = ("kept",)

    def __init__(self) -> None:
        self.kept: tuple[Any, list[int], str] | None = None
        """``(key, ids, text)`` of the prompt ``count_tokens`` rendered for the next call."""

    async def initial(
        self,
        templater: ChatTemplater,
        template_messages: list[dict[str, Any]],
        tool_specs: list[ToolSpec] | None,
        system_prompt: str | None,
        for_call: bool = True,
    ) -> tuple[list[int], str]:
        """The ids and text of a whole prompt: system, tools, ``template_messages``, generation prompt."""
        tools = tool_specs_to_template_tools(tool_specs)
        return await self._render(
            ("initial", system_prompt, tools, template_messages),
            lambda size: templater.render_async(
                lambda: templater.initial_prompt_text(template_messages, system_prompt, tools), size
            ),
            templater,
            template_messages,
            for_call,
        )

    async def continuation(
        self,
        templater: ChatTemplater,
        template_messages: list[dict[str, Any]],
        trajectory: Any,
        for_call: bool = True,
    ) -> tuple[list[int], str]:
        """The ids and text a call appends after the model's last output: its turn closing,
        ``template_messages`` and the generation prompt."""
        last = trajectory.token_ids[-1] if trajectory.ends_with_output else None
        return await self._render(
            ("continuation", len(trajectory), last, template_messages),
            lambda size: templater.continuation_text_async(template_messages, last, size),
            templater,
            template_messages,
            for_call,
        )

    async def _render(
        self,
        key: tuple[Any, ...],
        render: Callable[[int], Awaitable[str]],
        templater: ChatTemplater,
        template_messages: list[dict[str, Any]],
        for_call: bool,
    ) -> tuple[list[int], str]:
        kept, self.kept = self.kept, None
        if kept is not None and kept[0] == key:
            return kept[1], kept[2]
        size = sum(len(m.get("content") or "") for m in template_messages)
        text = await render(size)  # the size of the new contents: where a render goes off the loop
        ids = await templater.encode_async(text)
        if not for_call:
            self.kept = (key, ids, text)
        return ids, text


async def turn_prompt(
    model: Any,
    messages: Messages,
    tool_specs: list[ToolSpec] | None,
    system_prompt: str | None,
    offset: int,
    agent: Any,
) -> tuple[bool, list[int], str, list[dict[str, Any]]]:
    """How ``model``'s call continues the episode, and the ids it appends: ``(initial, ids, text, the turn's
    chat-template messages)``. A history that no longer continues the episode starts a new context
    segment (``new_segment_on_context_change``) or raises, naming the cause and the fix."""
    history, lane = model.history, model.lane
    verdict = history.judge(messages, offset)
    if verdict.changed is not None:
        cause = history.change_cause(verdict.changed, agent)
        if not model.wiring.new_segment_on_context_change:
            raise TrajectoryDesyncError(cause)
        lane.close_segment()  # fan-out: the trajectory so far is one finished segment
        history.start_over()
        if offset:  # the plugin cut the call at an output: the new segment needs the whole history
            if agent is None:
                raise TrajectoryDesyncError(f"{cause} (and the call does not hold the whole history)")
            messages, offset = [{"role": m["role"], "content": m["content"]} for m in agent.messages], 0
        verdict = history.judge(messages, 0)
    if verdict.keep < lane.trajectory.turn_count:
        lane.rollback(verdict.keep)
        del model.saved.turn_chunks[verdict.keep :]
    history.accept(verdict)
    history.removed_count = getattr(
        getattr(agent, "conversation_manager", None), "removed_message_count", None
    )
    new_messages = messages if verdict.initial else messages[verdict.start :]
    if not verdict.initial and not new_messages:
        raise TrajectoryDesyncError("no new messages since the last model output; nothing to generate from")
    template_messages = to_template_messages(new_messages, model.calls.order.get, model.calls.native_ids.get)
    tools = fingerprint(tool_specs, system_prompt)
    if verdict.initial:
        history.initial_position, history.tools_fingerprint = len(messages), tools
        ids, text = await model.renderer.initial(
            model.templater, template_messages, tool_specs, system_prompt
        )
        lane.begin_context(token_array(ids))
        if system_prompt:
            template_messages = [{"role": "system", "content": system_prompt}, *template_messages]
        return True, ids, text, template_messages
    if tools != history.tools_fingerprint:
        logger.warning("tools or system prompt changed mid-episode; the trajectory keeps the original ones")
        history.tools_fingerprint = tools
    ids, text = await model.renderer.continuation(model.templater, template_messages, lane.trajectory)
    return False, ids, text, template_messages


def system_text(blocks: Sequence[Mapping[str, Any]]) -> str | None:
    """The system prompt's text, as Strands joins its text blocks for ``system_prompt`` (cache points
    and other non-text blocks say nothing to the model)."""
    return "\n".join(str(block["text"]) for block in blocks if "text" in block) or None


def fingerprint(tool_specs: Sequence[Mapping[str, Any]] | None, system_prompt: str | None) -> tuple[Any, ...]:
    """What a hand-driven call is told apart by: its tool names and system prompt."""
    names = tuple(sorted(str(spec.get("name")) for spec in tool_specs or []))
    return names, system_prompt
