"""Strands agents driving an SGLangModel in tests: the setup every provider test uses, a Python tool that
answers with what the code prints, and the trajectory as lists."""

from __future__ import annotations

import ast
from typing import Any

from strands import Agent, tool
from strands.agent.conversation_manager import NullConversationManager

from strands_slime.provider.client import SGLangClient
from strands_slime.provider.model import SGLangModel
from strands_slime.provider.trajectory import TokenTrajectory


@tool
async def execute_python_code(code: str) -> str:
    """Execute Python code and return what it prints.

    Args:
        code: The program to run.
    """
    call = ast.parse(code.strip(), mode="eval").body
    assert isinstance(call, ast.Call) and getattr(call.func, "id", None) == "print", code
    return " ".join(str(ast.literal_eval(argument)) for argument in call.args)


def make_agent(model: SGLangModel, **options: Any) -> Agent:
    """An agent as RL uses one: the model's plugin, an append-only history, no retries, no printing;
    ``options`` override or add Agent arguments (``tools`` defaults to the echoing Python tool)."""
    defaults = {
        "tools": [execute_python_code],
        "conversation_manager": NullConversationManager(),
        "callback_handler": None,
        "retry_strategy": None,
    }
    return Agent(model=model, plugins=[model.plugin()], **{**defaults, **options})


def quick_client(url: str) -> SGLangClient:
    """A client whose retries wait milliseconds, not seconds."""
    return SGLangClient(url, retry_delay=0.01, max_retry_delay=0.05)


def as_lists(trajectory: TokenTrajectory) -> tuple[list[int], list[int], list[float]]:
    """The trajectory's ids, mask and logprobs as lists, after checking its invariants."""
    trajectory.check()
    return trajectory.token_ids.tolist(), trajectory.loss_mask.tolist(), trajectory.logprobs.tolist()
