"""``python -m strands_slime.reward.math_answer --worker``: the math-verify worker process (internal)."""

from __future__ import annotations

import sys

from strands_slime.reward.math_answer.verify import worker_main

if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker_main()
    else:
        sys.exit("usage: python -m strands_slime.reward.math_answer --worker  (internal math-verify worker)")
