"""strands_slime: token-in/token-out agentic RL with Strands Agents, SGLang and slime.

``strands_slime.generate`` and ``strands_slime.reward_func`` are the dotted paths slime loads
(``--custom-generate-function-path`` / ``--custom-rm-path``). They are imported lazily so that light
entry points (the dev server, the reward) do not pay for the whole agent stack.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "generate": ("strands_slime.rollout.episode", "generate"),
    "reward_func": ("strands_slime.reward.dapo", "reward_func"),
    "SGLangClient": ("strands_slime.provider.client", "SGLangClient"),
    "SGLangModel": ("strands_slime.provider.model", "SGLangModel"),
    "ToolLimiter": ("strands_slime.provider.limits", "ToolLimiter"),
    "ToolIterationLimiter": ("strands_slime.provider.limits", "ToolIterationLimiter"),
    "rollout_settings": ("strands_slime.rollout.process_settings", "rollout_settings"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module_name, attr = _LAZY[name]
        value = getattr(importlib.import_module(module_name), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'strands_slime' has no attribute {name!r}")
