"""Launch tooling for training runs: the script's settings, checks and commands (its plan), the job's
supervisor, the pilot's measurements and projection, GPU sampling, node preflight.

Run on the GPU nodes by ``scripts/strands_qwen3_8b.sh`` (``python3 -m strands_slime.launch`` for its plan,
``python3 -m strands_slime.launch.<module>`` for the rest); nothing here is imported by the rollout, the
reward or the sandbox.
"""
