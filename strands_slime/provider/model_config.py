"""``SGLangModel``'s two kinds of settings: its Strands config (``get_config``/``update_config``: a dict
Strands' tracer reads) and its wiring to a server and a driver (fixed when the model is built)."""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields
from typing import Any, TypedDict

from strands_slime.runtime import get_runtime

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


CONFIG_KEYS = tuple(SGLangConfig.__annotations__)
"""What ``get_config`` shows and ``update_config`` changes."""

SEED_ALIASES = {"params": "sampling_params"}
"""strands-sglang 0.1.x names, kept so its quick start runs unchanged."""

TEMPLATE_KEYS = frozenset({"enable_thinking", "chat_template", "template_kwargs", "chat_family"})
"""Config keys the chat templater is built from."""


@dataclass(slots=True)
class Wiring:
    """How a model is wired to a server and a driver (the keywords of ``SGLangModel`` before ``config``)."""

    abort_check: Callable[[], bool] | None = None
    routing_key: str | None = None
    return_logprob: bool = True
    return_routed_experts: bool = False
    request_trace: RequestTrace | None = None
    new_segment_on_context_change: bool = False
    persist_tokens: bool | None = None
    """Keep the episode's tokens in the agent's ``model_state`` (Strands saves it with sessions and
    snapshots), so a new model resumes the episode exactly (:mod:`~strands_slime.provider.saved_state`):
    True always, False never (a marker only), None when the agent has a session manager."""
    pace: Pace | None = None


WIRING_KEYS = tuple(f.name for f in fields(Wiring))


def unknown_arguments(where: str, unknown: Sequence[str], known: Sequence[str]) -> TypeError:
    """A TypeError naming each unknown keyword with the closest known one, if any."""
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(key, known, n=1)
        parts.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return TypeError(f"{where} got unknown keyword argument(s) {', '.join(parts)}; known: {', '.join(known)}")


def checked_config(config: dict[str, Any], where: str, extra_known: Sequence[str] = ()) -> dict[str, Any]:
    """``config`` with the seed alias resolved and dict values copied; unknown keys raise TypeError."""
    for alias, name in SEED_ALIASES.items():
        if alias in config:
            if config.get(name) is not None:
                raise TypeError(f"{where}: pass {name}= or its seed alias {alias}=, not both")
            config[name] = config.pop(alias)
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise unknown_arguments(f"{where}()", unknown, [*extra_known, *CONFIG_KEYS, *SEED_ALIASES])
    if "sampling_params" in config:
        config["sampling_params"] = dict(config["sampling_params"] or {})
    if config.get("template_kwargs") is not None:
        config["template_kwargs"] = dict(config["template_kwargs"])
    return config


def initial_config(config: dict[str, Any]) -> dict[str, Any]:
    """Every config key, with its default where ``config`` leaves it out."""
    return {
        key: config.get(key, {} if key == "sampling_params" else key == "use_server_context_length" or None)
        for key in CONFIG_KEYS
    }


class RenamedTrajectory:
    """A deprecated name of :attr:`SGLangModel.trajectory` (one DeprecationWarning per name and process)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, model: Any, owner: type) -> Any:
        if model is None:
            return self
        if get_runtime().first_time(f"deprecated: SGLangModel.{self.name}"):
            message = f"SGLangModel.{self.name} is deprecated; use SGLangModel.trajectory (the same object)"
            warnings.warn(message, DeprecationWarning, stacklevel=2)
        return model.trajectory
