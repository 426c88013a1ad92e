"""``strands-slime``: offline rollout/eval, the demo, the drift audit and the dev server.

``rollout`` runs slime's code path (``generate`` then ``reward_func`` on a slime-like ``args``) over a
JSONL or parquet dataset, against a running SGLang server (``--base-url``) or an embedded dev server.
The runner lives in ``strands_slime.rollout.offline``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.metadata
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from strands_slime.rollout.offline import (
    DEFAULT_HEALTH_TIMEOUT_S,
    DEFAULT_MAX_FAILURE_RATE,
    DEFAULT_UNHEALTHY_TIMEOUT_S,
    DEMO_DATA,
    DEMO_SCRIPT,
    RolloutError,
    RolloutOptions,
    load_rows,
    run_rollout,
    sampling_params,
    slime_args,
)
from strands_slime.rollout.offline import bundled as _bundled
from strands_slime.rollout.run_files import LOG, SAMPLES
from strands_slime.rollout.run_summary import print_failures, print_summary
from strands_slime.usage import EXIT_FAILED, EXIT_USAGE, ArgumentParser, usage_error

__all__ = [
    "RolloutError",
    "RolloutOptions",
    "build_parser",
    "load_rows",
    "main",
    "run_rollout",
    "sampling_params",
    "slime_args",
]

# exit codes (strands_slime.usage): 0 ok, 1 the run failed, 2 a usage/data/config error, 128 + signal
EXIT_TOO_MANY_FAILURES = EXIT_FAILED


class CommandError(Exception):
    """A command cannot run as asked: ``main`` prints it as one ``error:`` line and exits 2."""


# --------------------------------------------------------------------------- rollout


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows each default, except None/False and where the help text already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False) or "default" in text:
            return text
        return super()._get_help_string(action) or text


def _add_rollout_arguments(parser: argparse.ArgumentParser, *, demo: bool = False) -> None:
    if not demo:
        parser.add_argument(
            "--data", type=Path, required=True, help="dataset in slime's layout: .jsonl or .parquet"
        )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs") / ("demo" if demo else "rollout"),
        help="output directory; one holding samples needs --resume or --overwrite",
    )
    parser.add_argument("--base-url", help="a running SGLang server/router; default: an embedded dev server")
    parser.add_argument(
        "--backend", choices=["scripted", "hf"], default="scripted", help="embedded dev server backend"
    )
    parser.add_argument(
        "--script", type=Path, help="scripted backend script (default: the bundled demo script)"
    )
    parser.add_argument("--model", help="hf backend: a local model directory (default: tiny random Qwen3)")
    parser.add_argument(
        "--tokenizer",
        help="tokenizer directory (default: with --base-url what the server reports in /model_info, "
        "else the bundled Qwen3 tokenizer)",
    )
    parser.add_argument("--config", type=Path, help="rollout YAML (tools, limits, sandbox, reward)")
    parser.add_argument("--n-samples", type=int, default=2 if demo else 1, help="samples per prompt (k)")
    parser.add_argument("--concurrency", type=int, default=32, help="episodes in flight")
    parser.add_argument("--limit", type=int, help="only the first N rows (N >= 1)")
    parser.add_argument("--input-key", default="prompt", help="dataset key of the prompt")
    parser.add_argument("--label-key", default="label", help="dataset key of the label")
    parser.add_argument("--max-response-len", type=int, default=4096, help="token budget per episode")
    parser.add_argument("--max-context-len", type=int, help="context limit (default: the server's)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling")
    parser.add_argument("--top-k", type=int, default=-1, help="top-k sampling (-1: off)")
    parser.add_argument("--eval", dest="evaluation", action="store_true", help="evaluation mode (no shaping)")
    parser.add_argument(
        "--keep-transcript", action="store_true", help="store parsed conversations (drift audit)"
    )
    earlier = parser.add_mutually_exclusive_group()
    earlier.add_argument(
        "--resume",
        action="store_true",
        help="keep the samples already in OUT/samples.jsonl and run the missing ones and the failed ones "
        "(their earlier attempts move to OUT/failed_attempts.jsonl)",
    )
    earlier.add_argument(
        "--overwrite", action="store_true", help="delete the results already in OUT and start over"
    )
    parser.add_argument(
        "--max-failure-rate",
        type=float,
        default=DEFAULT_MAX_FAILURE_RATE,
        help="exit with status 1 when a larger share of samples failed (infrastructure errors)",
    )
    parser.add_argument(
        "--health-timeout",
        type=float,
        default=DEFAULT_HEALTH_TIMEOUT_S,
        help="seconds for the server's /health check before the run",
    )
    parser.add_argument(
        "--unhealthy-timeout",
        type=float,
        default=DEFAULT_UNHEALTHY_TIMEOUT_S,
        help="stop the run when the server has failed every request for this many seconds (0: never; "
        "the run also stops once as many samples fail in a row as run at once)",
    )
    parser.add_argument("--wandb", action="store_true", help="log the run to W&B (WANDB_MODE=offline works)")
    parser.add_argument("--wandb-project", default="strands-slime", help="W&B project")
    parser.add_argument("--wandb-run-name", help="W&B run name (default: W&B's)")
    parser.add_argument(
        "--quiet", action="store_true", help="print nothing but errors (the exit status says the rest)"
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of configuration/data errors")
    if demo:
        parser.add_argument(
            "--print-paths",
            nargs="?",
            const="all",
            choices=["all", *_demo_files()],
            metavar="NAME",
            help=f"print where the bundled demo files are and exit; NAME ({', '.join(_demo_files())}) "
            "prints that path alone",
        )


def _demo_files() -> dict[str, tuple[Path, str]]:
    """The files the demo runs on, shipped in the package: what a user points other commands at."""
    configs = Path(str(resources.files("strands_slime") / "configs"))
    return {
        "problems": (_bundled(DEMO_DATA), "5 math problems in slime's JSONL layout (rollout --data)"),
        "script": (_bundled(DEMO_SCRIPT), "the scripted dev server's replies to them (serve --script)"),
        "config": (configs / "strands_math.yaml", "the default rollout config (rollout --config)"),
        "eval-config": (
            configs / "eval_aime.yaml",
            "slime's --eval-config for AIME-2024 (needs `make data`)",
        ),
    }


def _print_paths(name: str) -> int:
    files = _demo_files()
    if name != "all":
        print(files[name][0])
        return 0
    width = max(len(key) for key in files)
    for key, (path, what) in files.items():
        print(f"{key:<{width}}  {path}  # {what}")
    return 0


_RENAMED_FLAGS = {"health_timeout_s": "health_timeout", "unhealthy_timeout_s": "unhealthy_timeout"}
"""``RolloutOptions`` fields whose flag has another name (``--health-timeout``)."""


def _options(ns: argparse.Namespace, data: Path) -> RolloutOptions:
    """The rollout's options from its flags: one flag per field of :class:`RolloutOptions`."""
    flags = vars(ns)
    return RolloutOptions(
        data=data,
        **{
            field.name: flags[_RENAMED_FLAGS.get(field.name, field.name)]
            for field in dataclasses.fields(RolloutOptions)
            if field.name != "data"
        },
    )


def _rollout(ns: argparse.Namespace, data: Path) -> int:
    """Check, run, then report: the HTML report and W&B also for an interrupted or stopped run."""
    options = _options(ns, data)
    options.validate()  # before W&B starts: a bad --out is not a W&B run
    wandb_run = None
    if ns.wandb:
        from strands_slime.wandb_log import start_run

        if options.quiet:
            os.environ.setdefault("WANDB_SILENT", "true")
        wandb_run = start_run(options.out, ns.wandb_project, ns.wandb_run_name)
    clear_status = _show_starting(options, data)
    try:
        summary = asyncio.run(run_rollout(options))
    except BaseException as exc:
        clear_status()
        if wandb_run is not None:
            code = 128 + signal.SIGINT if isinstance(exc, KeyboardInterrupt) else EXIT_USAGE
            wandb_run.finish(exit_code=code)
        raise
    report = _write_viewer_report(options, summary) if summary["saved"] else None
    code = _report_outcome(options, summary)
    if report is not None and not options.quiet:
        print(f"report: {report}")
    if wandb_run is not None:
        from strands_slime.wandb_log import log_run

        log_run(wandb_run, summary, options.out, report, code)
    return code


def _show_starting(options: RolloutOptions, data: Path) -> Callable[[], None]:
    """On a terminal, one line saying what the start-up does (reading the data, loading the tokenizer,
    starting the sandbox and checking the server take seconds, more on a busy machine) until the progress
    bar overwrites it; returns what erases it, for a message that comes instead of the bar. Elsewhere
    (a log, a pipe) nothing: a refusal stays one line."""
    stream = sys.stderr
    if options.quiet or not stream.isatty():
        return lambda: None
    where = options.base_url or f"an embedded {options.backend} dev server"
    stream.write(f"rollout: starting: {data} on {where} (data, tokenizer, sandbox, server)\r")
    stream.flush()

    def clear() -> None:
        stream.write("\r\033[K")
        stream.flush()

    return clear


def _report_outcome(options: RolloutOptions, summary: dict[str, Any]) -> int:
    """Print how the run ended (errors on stderr, even with --quiet) and return the exit status."""
    samples_path = options.out / SAMPLES
    saved = f"{summary['samples']} of {summary['expected_samples']} samples are saved in {samples_path}"
    if not summary["saved"]:
        saved = "no sample finished, nothing was saved"
    if summary["interrupted"]:
        rest = "; --resume runs the rest" if summary["saved"] else ""
        print(f"interrupted by {summary['interrupted']}: {saved}{rest}", file=sys.stderr)
        return 128 + int(getattr(signal, summary["interrupted"]))
    if summary["stopped"]:
        if summary["saved"]:
            print_failures(summary, options.out, sys.stderr)
        then = "--resume runs the rest and the failed samples again" if summary["saved"] else "run it again"
        if summary.get("stopped_by_rejections"):
            rejects = "the server rejects these requests (a bad request, not a sick server)"
            then = f"{rejects}: fix what it names, then {then}"
        else:
            then = f"once the server is healthy, {then}"
        print(f"error: stopped early: {summary['stopped']}; {saved}; {then}", file=sys.stderr)
        return EXIT_FAILED
    if not options.quiet:
        print_summary(summary, options.out, sys.stdout)
    failures = summary["failures"]
    if failures["rate"] > options.max_failure_rate:
        if options.quiet:
            print_failures(summary, options.out, sys.stderr)
        print(
            f"error: {failures['rate']:.1%} of the samples failed (more than --max-failure-rate "
            f"{options.max_failure_rate:g}; details in {options.out / LOG}); --resume runs the failed "
            "samples again",
            file=sys.stderr,
        )
        return EXIT_TOO_MANY_FAILURES
    return 0


def _write_viewer_report(options: RolloutOptions, summary: dict[str, Any]) -> Path | None:
    """The run's HTML report (``strands-slime view``) next to its samples; a failure to write it is one
    line, never a failed run: the samples are already saved."""
    from strands_slime.viewer import ReportError, write_report

    try:
        path = write_report(options.out, tokenizer=summary.get("tokenizer") or options.tokenizer or "qwen3")
    except (ReportError, OSError, ValueError) as exc:
        print(f"note: no HTML report ({exc}); try `strands-slime view {options.out}`", file=sys.stderr)
        return None
    return path


# --------------------------------------------------------------------------- drift


def _template_check(ns: argparse.Namespace) -> int:
    """``drift --template-check MODEL_DIR``: 0 when incremental prompts equal full renders of an
    independent reference (the model's template, or its own encoder when it has none), else 1."""
    from strands_slime.provider.chat import ChatTemplater
    from strands_slime.provider.chat_families import UnsupportedChatTemplate
    from strands_slime.provider.reference_encoders import NoReferenceEncoder, reference_for
    from strands_slime.provider.template_check import check_template
    from strands_slime.provider.tokenizer import load_tokenizer

    chat_template = _read_text(ns.chat_template, "--chat-template") if ns.chat_template else None
    model_dir = ns.template_check if ns.template_check.is_dir() else None
    try:
        templater = ChatTemplater(
            load_tokenizer(str(ns.template_check)), chat_template=chat_template, chat_family=ns.chat_family
        )
        reference = reference_for(templater, model_dir=model_dir, encoder_file=ns.reference)
    except (UnsupportedChatTemplate, NoReferenceEncoder) as exc:
        raise CommandError(str(exc)) from exc
    except OSError as exc:
        raise CommandError(f"cannot load the tokenizer {str(ns.template_check)!r}: {exc}") from exc
    report = check_template(templater, reference=reference, conversations=ns.conversations)
    print(report.render_text())
    return 0 if report.ok else EXIT_FAILED


def _read_text(path: Path, flag: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"{flag} {path}: {exc.strerror or exc}") from exc


async def _drift(ns: argparse.Namespace) -> int:
    from strands_slime.drift import audit
    from strands_slime.provider.chat import ChatTemplater
    from strands_slime.provider.tokenizer import load_tokenizer

    samples_path: Path | None = ns.samples
    if samples_path is None:
        options = RolloutOptions(
            data=ns.data or _bundled(DEMO_DATA),
            out=ns.out,
            backend=ns.backend,
            n_samples=ns.n_samples,
            max_response_len=ns.max_response_len,
            tokenizer=ns.tokenizer,
            config=ns.config,
            script=ns.script,
            keep_transcript=True,
            quiet=True,
            overwrite=True,  # the audit's own throwaway rollout
        )
        try:
            await run_rollout(options)
        except RolloutError as exc:  # e.g. the default hf backend on a plain install (no torch)
            raise CommandError(str(exc)) from exc
        samples_path = ns.out / SAMPLES
    chat_template = _read_text(ns.chat_template, "--chat-template") if ns.chat_template else None
    templater = ChatTemplater(
        load_tokenizer(ns.tokenizer), chat_template=chat_template, chat_family=ns.chat_family
    )
    from strands_slime.rollout.run_files import SampleLines, SamplesFileError

    if not samples_path.is_file():
        raise CommandError(f"{samples_path} does not exist")
    try:
        records = [record for _number, record in SampleLines(samples_path)]
    except SamplesFileError as exc:
        raise CommandError(str(exc)) from exc
    if not records:
        raise CommandError(f"{samples_path} has no samples")
    try:
        report = audit(templater, records)
    except ValueError as exc:
        raise CommandError(f"{samples_path}: {exc}") from exc
    text = report.render_markdown()
    print(text)
    (ns.out).mkdir(parents=True, exist_ok=True)
    (ns.out / "drift.json").write_text(json.dumps(report.as_dict(), indent=2, ensure_ascii=False) + "\n")
    (ns.out / "drift.md").write_text(text + "\n")
    print(f"\nreport: {ns.out / 'drift.md'}")
    return 0


# --------------------------------------------------------------------------- packaged configs


def _configs(name: str | None, path_only: bool) -> int:
    """The default configs ship in the package (``strands_slime/configs``: in a checkout, a link to
    the top-level ``configs/`` folder, so there is one copy)."""
    folder = Path(str(resources.files("strands_slime") / "configs"))
    available = sorted(p.name for p in folder.iterdir() if p.suffix in (".yaml", ".sh"))
    if name is None:
        for entry in available:
            print(folder / entry)
        return 0
    if name not in available:
        raise CommandError(f"no packaged config {name!r}; there are: {', '.join(available)}")
    if path_only:
        print(folder / name)
    else:
        sys.stdout.write((folder / name).read_text(encoding="utf-8"))
    return 0


# --------------------------------------------------------------------------- entry point


def build_parser() -> argparse.ArgumentParser:
    """The ``strands-slime`` parser and its subcommands (``serve`` and ``data`` parse their own flags)."""
    parser = ArgumentParser(prog="strands-slime", description=__doc__)
    parser.add_argument("--version", action="version", version=f"strands-slime {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    defaults = _DefaultsFormatter
    rollout = commands.add_parser(
        "rollout", help="generate + reward over a JSONL/parquet dataset", formatter_class=defaults
    )
    _add_rollout_arguments(rollout)
    demo = commands.add_parser(
        "demo",
        help="rollout of the bundled problems on an embedded dev server (--print-paths: where they are)",
        formatter_class=defaults,
    )
    _add_rollout_arguments(demo, demo=True)
    drift = commands.add_parser("drift", help="audit trajectories for text-pipeline drift")
    drift.add_argument("--samples", type=Path, help="samples.jsonl from `rollout --keep-transcript`")
    drift.add_argument(
        "--data", type=Path, help="without --samples: dataset to roll out first (default: demo)"
    )
    drift.add_argument("--backend", choices=["scripted", "hf"], default="hf")
    drift.add_argument("--script", type=Path, help="scripted backend script")
    drift.add_argument("--config", type=Path, help="rollout YAML for the rollout")
    drift.add_argument("--n-samples", type=int, default=4)
    drift.add_argument("--max-response-len", type=int, default=256)
    drift.add_argument("--tokenizer", help="tokenizer directory (default: bundled Qwen3)")
    drift.add_argument(
        "--chat-template", type=Path, help="chat template file used by the rollout, if not the tokenizer's"
    )
    drift.add_argument("--out", type=Path, default=Path("runs") / "drift")
    drift.add_argument(
        "--template-check",
        type=Path,
        metavar="MODEL_DIR",
        help="instead of an audit: check that incremental prompts equal full renders for this tokenizer",
    )
    drift.add_argument("--chat-family", help="the chat family (qwen3, glm47, ...), if not detected")
    drift.add_argument("--conversations", type=int, default=50, help="with --template-check: how many")
    drift.add_argument(
        "--reference",
        type=Path,
        metavar="FILE",
        help="with --template-check, for a model without a chat template: its own encoder (default: "
        "MODEL_DIR/encoding/encoding_*.py, or SGLang's copy of DeepSeek V3.2's)",
    )
    view = commands.add_parser("view", help="write a self-contained HTML report of a rollout's trajectories")
    view.add_argument("source", type=Path, help="a rollout output directory or its samples.jsonl")
    view.add_argument(
        "-o", "--output", type=Path, help="HTML file (default: report.html next to the samples)"
    )
    tokenizer_choice = view.add_mutually_exclusive_group()
    tokenizer_choice.add_argument(
        "--tokenizer", default="qwen3", help="decodes token ids to text (default: the bundled Qwen3)"
    )
    tokenizer_choice.add_argument(
        "--no-tokenizer", dest="tokenizer", action="store_const", const=None, help="show token ids"
    )
    commands.add_parser("serve", help="SGLang-compatible CPU dev server (see `serve --help`)", add_help=False)
    commands.add_parser(
        "data", help="download DAPO-math-17k / AIME-2024 as slime JSONL (see `data --help`)", add_help=False
    )
    configs = commands.add_parser("configs", help="the packaged default configs: list, print or locate one")
    configs.add_argument("name", nargs="?", help="e.g. strands_math.yaml; without it: list them")
    configs.add_argument("--path", action="store_true", help="print its path (for --custom-config-path)")
    return parser


def _version() -> str:
    """The installed distribution's version (a checkout run without installing has none)."""
    try:
        return importlib.metadata.version("strands-slime")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def _view(ns: argparse.Namespace) -> int:
    from strands_slime.viewer import ReportError, write_report

    try:
        path = write_report(ns.source, ns.output, tokenizer=ns.tokenizer)
    except (ReportError, OSError) as exc:
        raise CommandError(str(exc)) from exc
    print(f"report: {path}")
    return 0


def _run_command(ns: argparse.Namespace) -> int:
    if ns.command in ("rollout", "demo"):
        if ns.command == "demo" and ns.print_paths:
            return _print_paths(ns.print_paths)
        try:
            return _rollout(ns, ns.data if ns.command == "rollout" else _bundled(DEMO_DATA))
        except KeyboardInterrupt:  # before the episodes started: nothing was written
            print("interrupted before any sample started; nothing was written", file=sys.stderr)
            return 128 + signal.SIGINT
        except ModuleNotFoundError as exc:  # --backend hf on a plain install
            if exc.name != "torch":
                raise
            raise CommandError(str(exc)) from exc
    if ns.command == "configs":
        return _configs(ns.name, ns.path)
    if ns.command == "view":
        return _view(ns)
    if ns.command == "drift":
        if ns.template_check is not None:
            return _template_check(ns)
        return asyncio.run(_drift(ns))
    raise CommandError(f"unknown command {ns.command}")


def main(argv: Sequence[str] | None = None) -> int:
    """The ``strands-slime`` entry point.

    Args:
        argv: the arguments after the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit status (``strands_slime.usage``): 0 ok, 1 the work failed (too many failed samples,
        an early stop, a failed template check), 2 a usage, data or configuration error shown as one
        ``error:`` line, ``128 + signal`` when interrupted.

    Raises:
        SystemExit: argparse's exits (``--help``: 0; a bad flag: 2, after its one ``error:`` line).
    """
    from strands_slime.wandb_log import WandbError

    argv = list(sys.argv[1:] if argv is None else argv)
    # transformers' "PyTorch was not found" advice: a plain install needs no torch for tokenizers
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if argv and argv[0] == "serve":
        from strands_slime.devserver import serve_main

        return serve_main(argv[1:], prog="strands-slime serve")
    if argv and argv[0] == "data":
        from .data_prep.download import main as data_main

        return data_main(argv[1:], prog="strands-slime data")
    ns = build_parser().parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        return _run_command(ns)
    except (CommandError, RolloutError, WandbError) as exc:
        if getattr(ns, "debug", False):
            raise
        return usage_error(exc)


if __name__ == "__main__":
    sys.exit(main())
