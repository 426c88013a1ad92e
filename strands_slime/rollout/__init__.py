"""The slime side: ``generate`` for ``--custom-generate-function-path`` and what surrounds it.

``episode`` runs one agent episode (an ``Episode`` owns everything episode-scoped) and ``sample_fill`` writes
it into slime's ``Sample``; ``resume`` is the saved state of an aborted episode; ``executor`` runs episodes in
worker processes; ``startup`` and ``pacing`` keep hundreds of episodes from stalling the event loop and
``gc_policy`` keeps the collector's pauses short; ``metrics`` and ``filters`` read what episodes record
(``strands_slime.episode_metadata``); ``offline`` runs rollouts without slime (the ``strands-slime rollout``
CLI). slime's dotted paths are ``strands_slime.generate`` and
``strands_slime.rollout.episode.generate``.
"""

from typing import Any

_MOVED = ("generate", "Episode", "EpisodeOutcome", "GC_THRESHOLDS", "tune_gc_once", "get_client", "get_tokenizer",
          "warm_up", "reset_attempt", "prepare_resume", "SAMPLE_RESULT_FIELDS", "RESUME_FIELDS",
          "STICKY_ROUTER_POLICIES")  # fmt: skip


def __getattr__(name: str) -> Any:
    """What ``strands_slime.rollout`` held when it was a module (``generate``, ...), with a DeprecationWarning."""
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from strands_slime._compat import warn_moved
    from strands_slime.rollout import episode

    warn_moved(f"{__name__}.{name}", f"{episode.__name__}.{name}")
    return getattr(episode, name)
