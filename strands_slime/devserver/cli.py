"""``python -m strands_slime.devserver`` / ``strands-slime serve``: run the dev server until stopped."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from strands_slime.usage import EXIT_USAGE, ArgumentParser, usage_error

if TYPE_CHECKING:
    from strands_slime.devserver.app import DevServer

URL_LINE_PREFIX = "DEVSERVER_URL="
"""The line on stdout that carries the bound URL: ``DEVSERVER_URL=http://127.0.0.1:PORT``."""


def _at_least(low: int, number: Callable[[str], Any] = int) -> Callable[[str], Any]:
    """An argparse type: ``number(text)``, refused below ``low`` (argparse names it ``int``/``float``)."""

    def parse(text: str) -> Any:
        value = number(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {text}")
        return value

    parse.__name__ = getattr(number, "__name__", "number")
    return parse


_positive_int, _non_negative_int, _non_negative_float = _at_least(1), _at_least(0), _at_least(0, float)


def build_parser(prog: str = "python -m strands_slime.devserver") -> argparse.ArgumentParser:
    """The dev server's command line (also ``strands-slime serve``)."""
    parser = ArgumentParser(
        prog=prog,
        description="SGLang-compatible CPU dev server (native /generate protocol) for tests, demos and benchmarks.",
    )
    parser.add_argument("--backend", choices=("scripted", "hf"), default="scripted", help="token source")
    parser.add_argument(
        "--model", default=None, help="hf: local model directory (default: tiny random Qwen3)"
    )
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (default: bundled Qwen3)")
    parser.add_argument("--script", default=None, help="scripted: script file (.json/.yaml)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=_non_negative_int, default=30000, help="0 picks a free port")
    parser.add_argument("--context-length", type=_positive_int, default=None)
    parser.add_argument("--max-running-requests", type=_positive_int, default=None)
    parser.add_argument("--max-total-tokens", type=_positive_int, default=None, help="emulated KV capacity")
    parser.add_argument("--weight-version", default="default")
    parser.add_argument(
        "--latency", type=_non_negative_float, default=0.0, help="seconds before the first token"
    )
    parser.add_argument(
        "--token-latency", type=_non_negative_float, default=0.0, help="seconds per output token"
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="server sampling seed (requests without sampling_seed)"
    )
    parser.add_argument(
        "--request-log-size", type=_positive_int, default=10_000, help="requests kept for GET /dev/requests"
    )
    parser.add_argument(
        "--routed-experts",
        type=_positive_int,
        nargs="+",
        metavar="N",
        default=None,
        help="answer return_routed_experts: NUM_LAYERS TOPK [NUM_EXPERTS] of a pretend MoE",
    )
    parser.add_argument(
        "--speculative-algorithm",
        default=None,
        help="emulate SGLang's speculative decoding (EAGLE, EAGLE3 or NEXTN/MTP): the context it "
        "reserves for draft tokens and the spec_* counters in meta_info",
    )
    parser.add_argument(
        "--speculative-num-draft-tokens",
        type=_positive_int,
        default=None,
        help="draft tokens per step with --speculative-algorithm (default 4, SGLang's usual automatic choice)",
    )
    parser.add_argument(
        "--constrained-json-disable-any-whitespace",
        action="store_true",
        help="json_schema constraints admit no free whitespace between JSON tokens (SGLang's flag)",
    )
    parser.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    return parser


def server_from_args(args: argparse.Namespace) -> DevServer:
    """The :class:`DevServer` the parsed command line describes (not started)."""
    from strands_slime.devserver.app import DevServer

    accepted = set(inspect.signature(DevServer).parameters) - {"backend", "routed_experts"}
    options = {name: value for name, value in vars(args).items() if name in accepted}
    routed = args.routed_experts
    return DevServer(args.backend, routed_experts=tuple(routed) if routed else None, **options)


async def serve_until_stopped(server: Any, what: str) -> int:
    """Start ``server`` (anything with ``start``, ``stop`` and ``url``), print the URL line, serve until
    SIGINT/SIGTERM, stop it; 0."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    await server.start()
    try:
        print(f"{URL_LINE_PREFIX}{server.url}", flush=True)
        print(f"{what} listening on {server.url}; Ctrl-C stops it", file=sys.stderr, flush=True)
        await stop.wait()
    finally:
        await server.stop()
    return 0


def serve_main(argv: Sequence[str] | None = None, prog: str = "python -m strands_slime.devserver") -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``), serve until SIGINT/SIGTERM, return the exit code
    (2 with one ``error:`` line for a bad flag, script, model or port). ``prog`` names the command in
    ``--help`` (``strands-slime serve`` from the CLI)."""
    parser = build_parser(prog)
    try:
        args = parser.parse_args(None if argv is None else list(argv))
    except SystemExit as exc:  # --help or a usage error: argparse already printed why
        return int(exc.code or 0) if isinstance(exc.code, int) else EXIT_USAGE
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from strands_slime.devserver.backends.scripted import ScriptError

    try:
        server = server_from_args(args)
        return asyncio.run(serve_until_stopped(server, f"strands_slime dev server ({args.backend} backend)"))
    except KeyboardInterrupt:
        return 0
    except (ScriptError, FileNotFoundError, ValueError, OSError, ImportError) as exc:
        return usage_error(exc)
