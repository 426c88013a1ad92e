"""Deprecated: ``DevServerThread`` and ``DevServerProcess`` moved to ``benchmarks/devserver_runners.py``."""

from strands_slime.devserver.moved import module_getattr

__getattr__ = module_getattr(__name__, "DevServerThread", "DevServerProcess")
