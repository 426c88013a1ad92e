"""Deprecated: ``DevServerThread`` and ``DevServerProcess`` moved to ``benchmarks/devserver_runners.py``."""

from typing import Any

from strands_slime.devserver.moved import moved


def __getattr__(name: str) -> Any:
    if name in ("DevServerThread", "DevServerProcess"):
        return moved(f"strands_slime.devserver.runners.{name}", name)
    raise AttributeError(f"module 'strands_slime.devserver.runners' has no attribute {name!r}")
