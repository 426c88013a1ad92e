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


def __getattr__(name: str) -> Any:
    """What ``strands_slime.rollout`` held when it was a module (``generate``, ...), with a DeprecationWarning."""
    from strands_slime._compat import moved_attribute

    return moved_attribute(__name__, name)
