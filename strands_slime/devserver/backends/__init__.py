"""Dev-server backends: ``scripted`` (deterministic replies) and ``hf`` (a real causal LM on CPU)."""

from strands_slime.devserver.backends.base import Backend, Generation
from strands_slime.devserver.request import PrefillResult, TokenStep

__all__ = ["Backend", "Generation", "PrefillResult", "TokenStep"]
