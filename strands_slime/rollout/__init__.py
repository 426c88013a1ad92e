"""The slime side: ``generate`` for ``--custom-generate-function-path`` and what surrounds it.

``episode`` runs one agent episode and fills slime's ``Sample``; ``episode_metadata`` is the one record of what
an episode writes into ``Sample.metadata``; ``metrics`` and ``filters`` read it; ``offline`` runs rollouts
without slime (the ``strands-slime rollout`` CLI). slime's dotted paths are ``strands_slime.generate`` and
``strands_slime.rollout.episode.generate``.
"""
