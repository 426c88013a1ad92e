"""Sub-agents from the rollout config (``agents.subagents``): each one a Strands agent with its own
``SGLangModel`` in the episode's record, handed to its parent as a tool (Strands' ``Agent.as_tool``).

Nesting follows ``parent``: a sub-agent's own sub-agents are its tools. Every model joins the episode's
:class:`~strands_slime.provider.recorder.Recorder` under the sub-agent's name with the episode's model
defaults (abort check, budget, sampling parameters; a new context segment per call that restarts its
history). A sub-agent with ``base_url`` samples from that server (a frozen model, never trained).
"""

from __future__ import annotations

from typing import Any

from strands import Agent
from strands.agent.conversation_manager import NullConversationManager

from strands_slime.config import SubAgentConfig


def subagent_tools(episode: Any, python_tool: Any) -> list[Any]:
    """The tools of the episode's main agent that are sub-agents; the models join the record depth
    first, each before its own sub-agents, in config order.

    Args:
        episode: the running :class:`~strands_slime.rollout.episode.Episode` (args, config, tokenizer,
            record).
        python_tool: the episode's sandboxed Python tool, for sub-agents that list it (None if none do).
    """
    agents = episode.config.agents.subagents
    children: dict[str, list[SubAgentConfig]] = {}
    for agent in agents:
        children.setdefault(agent.parent, []).append(agent)

    def build(agent: SubAgentConfig) -> Any:
        model = episode.new_model(agent.name, agent.base_url)  # before its children's: parents first
        own = [python_tool] if agent.tools and python_tool is not None else []
        own += [build(child) for child in children.get(agent.name, [])]
        sub = Agent(
            model=model,
            name=agent.name,
            description=agent.description,
            system_prompt=agent.system_prompt,
            tools=own,
            callback_handler=None,
            conversation_manager=NullConversationManager(),
            retry_strategy=None,
            plugins=[model.plugin()],
        )
        return sub.as_tool(
            name=agent.name, description=agent.description, preserve_context=agent.preserve_context
        )

    return [build(agent) for agent in children.get("main", [])]
