"""SGLang-compatible CPU dev server: the native ``/generate`` protocol on a laptop.

``DevServer`` runs in-process (``async with``); ``serve_main`` is the command line (``strands-slime
serve``). Fault injection (``Fault``, ``FaultProxy``), the thread and subprocess runners
(``DevServerThread``, ``DevServerProcess``) and the reference logprobs (``full_forward_logprobs``,
``scripted_output_logprobs``) are test tools in ``benchmarks/`` now (the old names warn). Backends:
``scripted`` (deterministic replies from a :class:`Script`) and ``hf`` (a real transformers model on
CPU; ``build_tiny_qwen3`` builds its default model). Importing this package does not import torch.
"""

from __future__ import annotations

from typing import Any

from strands_slime.devserver.app import DevServer
from strands_slime.devserver.backends.scripted import (
    Reply,
    Rule,
    Script,
    ScriptError,
    scripted_input_logprobs,
    scripted_logprob,
)
from strands_slime.devserver.cli import URL_LINE_PREFIX, serve_main
from strands_slime.devserver.hooks import TestHooks
from strands_slime.devserver.moved import module_getattr
from strands_slime.devserver.protocol import ProtocolError, SamplingParams

_LAZY = {
    "build_tiny_qwen3": "strands_slime.devserver.backends.hf",
    "HFBackend": "strands_slime.devserver.backends.hf",
    "ScriptedBackend": "strands_slime.devserver.backends.scripted",
}

__all__ = [
    "URL_LINE_PREFIX",
    "DevServer",
    "ProtocolError",
    "Reply",
    "Rule",
    "SamplingParams",
    "Script",
    "ScriptError",
    "TestHooks",
    "scripted_input_logprobs",
    "scripted_logprob",
    "serve_main",
    *_LAZY,
]


_MOVED_HERE = ("Fault", "FaultProxy", "DevServerProcess", "DevServerThread")
_moved_here = module_getattr(__name__, *_MOVED_HERE, "full_forward_logprobs", "scripted_output_logprobs")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    return _moved_here(name)
