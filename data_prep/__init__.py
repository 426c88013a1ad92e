"""Dataset preparation for strands_slime: DAPO-math-17k (training) and AIME-2024 (evaluation) as JSONL."""
