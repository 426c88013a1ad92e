"""One convention for every ``strands-slime`` command (and ``python -m`` entry point):

a usage, data or configuration error is one ``error:`` line on stderr and exit status 2 (found before
any server, model or tokenizer is touched); work that ran and failed (too many failed samples, a
template that cannot be appended to) exits 1; an interrupted run exits ``128 + signal``.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

EXIT_FAILED = 1
EXIT_USAGE = 2


def one_line(message: object) -> str:
    """``message`` on one line (a multi-line error's lines joined with ``; ``)."""
    return "; ".join(line.strip() for line in str(message).splitlines() if line.strip())


def usage_error(message: object) -> int:
    """Print ``error: MESSAGE`` (one line) to stderr; return :data:`EXIT_USAGE`."""
    print(f"error: {one_line(message)}", file=sys.stderr)
    return EXIT_USAGE


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the convention: a bad flag is one ``error:`` line naming ``--help`` (argparse
    prints the whole usage block and a second line), exit status 2."""

    def error(self, message: str) -> NoReturn:
        """Print the one line and exit 2."""
        self.exit(EXIT_USAGE, f"error: {one_line(message)} (see `{self.prog} --help`)\n")
