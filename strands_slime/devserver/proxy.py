"""Deprecated: ``FaultProxy`` moved to ``benchmarks/fault_injection.py`` (not part of the package)."""

from strands_slime.devserver.moved import module_getattr

__getattr__ = module_getattr(__name__, "FaultProxy")
