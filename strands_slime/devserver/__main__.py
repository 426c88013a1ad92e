"""``python -m strands_slime.devserver``: see :func:`strands_slime.devserver.serve_main`."""

import sys

from strands_slime.devserver.cli import serve_main

if __name__ == "__main__":
    sys.exit(serve_main())
