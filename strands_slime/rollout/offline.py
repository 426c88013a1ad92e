"""The offline rollout runner behind ``strands-slime rollout`` and ``demo``.

It runs slime's code path (``generate`` then ``reward_func`` on a slime-like ``args``) over a JSONL or
parquet dataset, against a running SGLang server (``--base-url``) or an embedded dev server. Each
finished sample is appended to ``samples.jsonl`` at once, so an interrupted run loses nothing and
``resume=True`` picks up where it stopped, running the failed samples again (``run_files`` owns the
output directory, ``run_monitor`` what is shown while the run goes and when it stops early).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import platform
import signal
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TextIO, TypeVar
from urllib.parse import urlparse

from strands_slime.episode_metadata import EpisodeMetadata
from strands_slime.rollout.run_files import (
    AGENT_SAMPLES,
    LOG,
    RunDir,
    RunDirError,
    SampleLines,
    SamplesFileError,
    check_writable,
    refuse_earlier_results,
    refuse_if_in_use,
)
from strands_slime.rollout.run_monitor import RunMonitor, failed, run_logging
from strands_slime.rollout.run_summary import build_summary, write_summary

T = TypeVar("T")
DEMO_DATA = "demo_problems.jsonl"
DEMO_SCRIPT = "demo_script.json"
DEFAULT_MAX_FAILURE_RATE = 0.1
DEFAULT_HEALTH_TIMEOUT_S = 5.0
DEFAULT_UNHEALTHY_TIMEOUT_S = 300.0
PROBE_RETRY_S = 0.25
"""How often the health probe tries again a server that refuses connections (one starting up)."""
MEANING_SETTINGS = {
    "temperature": "--temperature",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "max_response_len": "--max-response-len",
    "max_context_len": "--max-context-len",
    "evaluation": "--eval",
    "input_key": "--input-key",
    "label_key": "--label-key",
    "config": "--config",
    "tokenizer": "--tokenizer",
}
"""The settings that change what a sample means: ``--resume`` refuses other values than the run's."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""A tokenizer directory holds one of these at least (Hugging Face's fast, config, SentencePiece, BPE)."""
_CONFIG_NOT_MEANING = ("keep_transcript", "gc_tuning", "client", "executor")
"""Rollout config sections that change how a run goes, not what its samples mean."""
_VERSIONED_PACKAGES = ("strands-slime", "strands-agents", "transformers", "aiohttp", "slime", "sglang")


class RolloutError(Exception):
    """A problem the user can fix (data, configuration, tokenizer, server): shown as one line."""


def bundled(name: str) -> Path:
    """The path of a file shipped in ``strands_slime/data`` (the demo problems and script)."""
    return Path(str(resources.files("strands_slime") / "data" / name))


@dataclass
class RolloutOptions:
    """The settings of one offline rollout: the CLI's flags, one field each (see ``rollout --help``).

    ``base_url`` None runs an embedded dev server (``backend``, ``script``, ``model``); the sampling
    fields become slime's sampling params and the counts slime's ``args``.
    """

    data: Path
    out: Path
    base_url: str | None = None
    backend: str = "scripted"
    script: Path | None = None
    model: str | None = None
    tokenizer: str | None = None
    config: Path | None = None
    n_samples: int = 1
    concurrency: int = 32
    limit: int | None = None
    input_key: str = "prompt"
    label_key: str = "label"
    max_response_len: int = 4096
    max_context_len: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    evaluation: bool = False
    keep_transcript: bool = False
    quiet: bool = False
    resume: bool = False
    overwrite: bool = False
    max_failure_rate: float = DEFAULT_MAX_FAILURE_RATE
    health_timeout_s: float = DEFAULT_HEALTH_TIMEOUT_S
    unhealthy_timeout_s: float = DEFAULT_UNHEALTHY_TIMEOUT_S

    def validate(self) -> None:
        """Refuse settings that could only fail later: before any data is read or server started.

        Raises:
            RolloutError: a count, limit, rate or timeout out of range (the flag is named), an ``out``
                that cannot be written, or one holding samples without ``resume``/``overwrite``.
        """
        if self.n_samples < 1 or self.concurrency < 1:
            raise RolloutError("--n-samples and --concurrency must be >= 1")
        if self.limit is not None and self.limit < 1:
            raise RolloutError(f"--limit must be >= 1 (got {self.limit}); leave it out to use every row")
        if not 0.0 <= self.max_failure_rate <= 1.0:
            raise RolloutError(f"--max-failure-rate must be between 0 and 1, got {self.max_failure_rate}")
        if self.health_timeout_s <= 0:
            raise RolloutError(f"--health-timeout must be > 0, got {self.health_timeout_s}")
        if self.unhealthy_timeout_s < 0:
            raise RolloutError(f"--unhealthy-timeout must be >= 0 (0: never), got {self.unhealthy_timeout_s}")
        if self.resume and self.overwrite:
            raise RolloutError("--resume continues the samples in --out, --overwrite deletes them: pick one")
        try:
            check_writable(self.out)
            refuse_if_in_use(self.out)
            if not self.resume and not self.overwrite:
                refuse_earlier_results(self.out)
        except RunDirError as exc:
            raise RolloutError(str(exc)) from exc


# --------------------------------------------------------------------------- data


def _jsonl_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RolloutError(f"{path}:{number}: not JSON ({exc})") from exc
            if not isinstance(row, dict):
                raise RolloutError(f"{path}:{number}: a row must be a JSON object, got {type(row).__name__}")
            yield f"{path}:{number}", row


def _parquet_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise RolloutError(f"reading {path} needs pyarrow: pip install pyarrow") from exc
    try:
        parquet = pq.ParquetFile(path)
        number = 0
        for batch in parquet.iter_batches():
            for row in batch.to_pylist():
                number += 1
                yield f"{path} row {number}", row
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise RolloutError(f"{path}: not a readable parquet file ({exc})") from exc


def load_rows(path: Path, input_key: str, label_key: str, limit: int | None) -> list[dict[str, Any]]:
    """Read a slime-style dataset (``.jsonl`` or ``.parquet``), naming the place of any bad row.

    Args:
        path: the dataset file (``.parquet`` by suffix, anything else is read as JSONL).
        input_key: the prompt's key; every row must have it.
        label_key: the label's key; every row must have it.
        limit: read only the first ``limit`` rows (None: all).

    Raises:
        RolloutError: the file is missing, empty or unreadable, a line is not a JSON object, a row
            lacks a key, or reading parquet needs pyarrow.
    """
    if not path.is_file():
        raise RolloutError(f"dataset {path} does not exist")
    reader = _parquet_rows(path) if path.suffix == ".parquet" else _jsonl_rows(path)
    rows: list[dict[str, Any]] = []
    for where, row in reader:
        for key in (input_key, label_key):
            if key not in row:
                raise RolloutError(f"{where}: missing key {key!r} (see --input-key/--label-key)")
        rows.append(row)
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise RolloutError(f"dataset {path} has no rows")
    return rows


# --------------------------------------------------------------------------- slime-like args


def slime_args(options: RolloutOptions, url: str, tokenizer: str | None) -> SimpleNamespace:
    """The subset of slime's ``args`` our generate/reward read, as slime would set it."""
    parsed = urlparse(url if "://" in url else f"http://{url}")
    return SimpleNamespace(
        sglang_router_ip=parsed.hostname,
        sglang_router_port=parsed.port or (443 if parsed.scheme == "https" else 80),
        sglang_server_concurrency=options.concurrency,
        rollout_num_gpus=1,
        rollout_num_gpus_per_engine=1,
        router_policy="consistent_hashing",
        hf_checkpoint=tokenizer,
        rollout_max_response_len=options.max_response_len,
        rollout_max_context_len=options.max_context_len,
        eval_max_response_len=options.max_response_len,
        eval_max_context_len=options.max_context_len,
        n_samples_per_prompt=options.n_samples,
        n_samples_per_eval_prompt=options.n_samples,
        partial_rollout=False,
        reward_key=None,
        eval_reward_key=None,
        strands_slime_config=str(options.config) if options.config else None,
        abort_event=None,
    )


def sampling_params(options: RolloutOptions) -> dict[str, Any]:
    """What slime sends per call (``no_stop_trim``, ``skip_special_tokens=False``, ...)."""
    return {
        "temperature": options.temperature,
        "top_p": options.top_p,
        "top_k": options.top_k,
        "max_new_tokens": options.max_response_len,
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }


# --------------------------------------------------------------------------- server


async def probe_server(url: str, timeout_s: float) -> dict[str, Any]:
    """``GET /health`` then ``/model_info`` within ``timeout_s``: a dead URL fails in seconds, not after
    retries. A refused connection is tried again until then (a server started a moment ago, ``serve
    ... &``, is not listening yet); an unhealthy answer or a silent server is not.

    Returns:
        The server's ``/model_info`` (empty when it has none: not every server implements it).

    Raises:
        RolloutError: the server is unreachable, unhealthy or silent for ``timeout_s``.
    """
    import aiohttp

    base = (url if "://" in url else f"http://{url}").rstrip("/")
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=max(left, 0.01))) as session:
                async with session.get(f"{base}/health") as reply:
                    if reply.status != 200:
                        raise RolloutError(
                            f"server {base} is not healthy: GET /health answered HTTP {reply.status}"
                        )
                async with session.get(f"{base}/model_info") as reply:
                    if reply.status != 200:
                        return {}
                    info = await reply.json(content_type=None)
                    return info if isinstance(info, dict) else {}
        except asyncio.TimeoutError as exc:  # aiohttp's deadline; the builtin TimeoutError only from 3.11 on
            raise RolloutError(f"server {base} did not answer GET /health within {timeout_s:g} s") from exc
        except aiohttp.ClientConnectorError as exc:  # nothing listens there (yet)
            if deadline - time.monotonic() > PROBE_RETRY_S:
                await asyncio.sleep(PROBE_RETRY_S)
                continue
            raise RolloutError(
                f"server {base} is unreachable for {timeout_s:g} s (--health-timeout): "
                f"{exc or type(exc).__name__}"
            ) from exc
        except aiohttp.ClientError as exc:
            raise RolloutError(f"server {base} is unreachable: {exc or type(exc).__name__}") from exc


@contextlib.asynccontextmanager
async def _server(options: RolloutOptions) -> AsyncIterator[str]:
    if options.base_url:
        yield options.base_url
        return
    from strands_slime.devserver import DevServer

    kwargs: dict[str, Any] = {"backend": options.backend, "tokenizer": options.tokenizer}
    if options.backend == "scripted":
        kwargs["script"] = options.script or bundled(DEMO_SCRIPT)
    else:
        kwargs["model"] = options.model
    server = DevServer(**kwargs)
    try:
        await server.__aenter__()
    except (ImportError, OSError, ValueError) as exc:  # bad script/model/tokenizer, missing extra
        raise RolloutError(f"the embedded {options.backend} dev server did not start: {exc}") from exc
    try:
        yield server.url
    finally:
        await server.__aexit__(None, None, None)


async def _resolve_tokenizer(options: RolloutOptions, model_info: dict[str, Any], config: Any) -> str:
    """``--tokenizer``, else what the server reports, else the bundled Qwen3; loaded once, and its chat
    format recognised as the episodes will (``config``'s family and template), to fail early: a
    look-alike we cannot append to is one line before the run, not a traceback from its first episode."""
    from strands_slime.provider.chat import get_templater
    from strands_slime.provider.chat_families import UnsupportedChatTemplate
    from strands_slime.provider.tokenizer import load_tokenizer, resolve_tokenizer_path
    from strands_slime.rollout.startup import chat_template

    name = options.tokenizer
    source = "--tokenizer"
    if name is None and options.base_url:
        name = model_info.get("tokenizer_path") or model_info.get("model_path")
        source = f"the server's /model_info ({options.base_url})"
        if not name:
            raise RolloutError("the server does not report its tokenizer (/model_info); pass --tokenizer")

    def load() -> str:
        if name and name.startswith(("/", ".", "~")):
            folder = Path(name).expanduser()
            if not folder.exists():
                raise RolloutError(f"the tokenizer directory {name} from {source} does not exist")
            if folder.is_dir() and not any((folder / file).exists() for file in TOKENIZER_FILES):
                raise RolloutError(
                    f"the directory {name} from {source} holds no tokenizer: none of "
                    f"{', '.join(TOKENIZER_FILES)} is in it"
                )
        path = resolve_tokenizer_path(name)
        tokenizer = load_tokenizer(path)
        try:
            get_templater(
                tokenizer,
                chat_template=chat_template(config),
                enable_thinking=config.enable_thinking,
                chat_family=config.chat_family,
            )
        except UnsupportedChatTemplate as exc:
            raise RolloutError(f"the tokenizer {name or path!r} from {source}: {exc}") from exc
        return path

    try:
        return await _in_daemon_thread(load)
    except RolloutError:
        raise
    except Exception as exc:  # transformers raises OSError, ValueError, ... for a bad directory
        detail = " ".join(str(exc).split()) or type(exc).__name__  # transformers' advice spans lines
        hint = "; pass --tokenizer with a local tokenizer directory" if source != "--tokenizer" else ""
        raise RolloutError(f"cannot load the tokenizer {name!r} from {source}: {detail}{hint}") from exc


async def _in_daemon_thread(function: Callable[[], T]) -> T:
    """``function()`` in a daemon thread: a Ctrl-C during a long load (transformers' import and a
    tokenizer take seconds, more on a busy machine) ends the run at once, where ``asyncio.to_thread``
    would hold ``asyncio.run`` and the interpreter's exit until the load finished. What it loads is
    cached for the process, so an abandoned load costs nothing more."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # the caller was cancelled
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (function(), None)
        except BaseException as exc:
            outcome = (None, exc)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=run, name="strands-slime-start-up", daemon=True).start()
    return await future


# --------------------------------------------------------------------------- results


def sample_record(sample: Any, sample_index: int) -> dict[str, Any]:
    """One line of ``samples.jsonl``; ``(group_index, sample_index)`` identifies it for ``--resume``."""
    record = sample.to_dict() if hasattr(sample, "to_dict") else dict(vars(sample))
    keep = (
        "group_index",
        "index",
        "prompt",
        "label",
        "tokens",
        "response",
        "response_length",
        "loss_mask",
        "rollout_log_probs",
        "reward",
        "status",
        "remove_sample",
        "metadata",
        "session_id",
        "non_generation_time",
    )
    out = {key: record.get(key) for key in keep}
    out["sample_index"] = sample_index
    status = out.get("status")
    out["status"] = getattr(status, "value", status)
    return out


def _read_finished(lines: SampleLines) -> list[tuple[int, dict[str, Any]]]:
    """The records already in ``samples.jsonl`` with their line numbers (a torn last line is left out).

    Raises:
        RolloutError: a line is not JSON, not one of our samples or its metadata is not a mapping.
    """
    records: list[tuple[int, dict[str, Any]]] = []
    try:
        for number, record in lines:
            if "group_index" not in record:
                raise RolloutError(
                    f"{lines.path}:{number}: not a strands-slime sample; cannot resume from it"
                )
            try:  # the summary reads every record's episode metadata
                EpisodeMetadata.from_metadata(record.get("metadata"))
            except TypeError as exc:
                raise RolloutError(f"{lines.path}:{number}: {exc}; cannot resume from it") from exc
            records.append((number, record))
    except SamplesFileError as exc:
        raise RolloutError(f"{exc}; cannot resume from it") from exc
    return records


def package_versions() -> dict[str, str | None]:
    """Python's and the relevant packages' versions for the summary (None: not installed)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


# --------------------------------------------------------------------------- the run


class _RunStop:
    """Ends the run before its plan is done: SIGINT/SIGTERM, or the monitor's early stop. Episodes stop
    starting, the running ones are cancelled (finished samples are already on disk), and the cause is
    kept for the summary. A second signal exits at once."""

    def __init__(self, abort_event: asyncio.Event) -> None:
        self.abort_event = abort_event
        self.tasks: list[asyncio.Task[None]] = []
        self.signal_name: str | None = None
        self.reason: str | None = None

    def __call__(self, signal_name: str) -> None:
        if self.signal_name is not None:  # a second Ctrl-C: stop now (finished samples are on disk)
            print(f"{signal_name} again: exiting without a summary", file=sys.stderr, flush=True)
            os._exit(128 + int(getattr(signal, signal_name)))
        self.signal_name = signal_name
        self._cancel()

    def early(self, reason: str) -> None:
        """Stop because the run cannot succeed (the first reason is kept)."""
        if self.reason is None and self.signal_name is None:
            self.reason = reason
            self._cancel()

    def _cancel(self) -> None:
        self.abort_event.set()
        for task in self.tasks:
            task.cancel()

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self, sig.name)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or Windows
                pass
        try:
            yield
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)


async def _watch(monitor: RunMonitor, stop: _RunStop) -> None:
    """Once a second: the monitor's live line and its early stop on a server that fails everything."""
    while True:
        await asyncio.sleep(1.0)
        monitor.tick()
        if monitor.stop_reason:
            stop.early(monitor.stop_reason)


async def run_rollout(options: RolloutOptions) -> dict[str, Any]:
    """Generate + reward every (prompt, sample) pair not yet in ``samples.jsonl``; write the summary.

    Returns:
        The summary (also in ``summary.json``/``summary.md`` when a sample was saved);
        ``summary["interrupted"]`` names the signal that stopped the run, ``summary["stopped"]`` why
        it stopped early, ``summary["saved"]`` whether ``out`` holds samples.

    Raises:
        RolloutError: bad options, output directory, data, config, tokenizer or server, or a
            ``--resume`` file that is not this run's; all are found before anything is written.
    """
    options.validate()
    run_dir = RunDir(options.out)
    try:
        return await _run(options, run_dir)
    except BaseException:  # a refusal, a configuration error found by the first episode, a cancellation
        run_dir.discard_if_unused()  # what it created, when nothing was saved (a few small files)
        raise
    finally:
        run_dir.release()


async def _run(options: RolloutOptions, run_dir: RunDir) -> dict[str, Any]:
    from strands_slime import config as config_module
    from strands_slime.reward.dapo import reward_func
    from strands_slime.rollout.episode import generate
    from strands_slime.rollout.executor import shutdown_executors
    from strands_slime.rollout.slime_compat import sample_class, status_name

    rows, lines, finished = await asyncio.to_thread(_read_inputs, options, run_dir)
    retry = _check_resumable(finished, rows, options)
    records = [record for number, record in finished if number not in retry]
    done = {(record["group_index"], record["sample_index"]) for record in records}
    plan = [(group_index, k) for group_index in range(len(rows)) for k in range(options.n_samples)]
    todo = [key for key in plan if key not in done]
    sample_cls = sample_class()
    try:  # the config and a local tokenizer are checked before an embedded server starts
        config = config_module.get_rollout_config(slime_args(options, "http://127.0.0.1:0", None))
    except config_module.ConfigError as exc:
        raise RolloutError(str(exc)) from exc
    local = options.tokenizer or not options.base_url
    tokenizer = await _resolve_tokenizer(options, {}, config) if local else None
    async with _server(options) as url:
        model_info = await probe_server(url, options.health_timeout_s)
        tokenizer = tokenizer or await _resolve_tokenizer(options, model_info, config)
        settings = _meaning_settings(options, config, tokenizer, prompts=len(rows))
        if options.resume:
            _check_same_settings(run_dir, settings, options)
        args = slime_args(options, url, tokenizer)
        args.strands_slime = config
        if options.keep_transcript and not config.keep_transcript:
            config = config.model_copy(update={"keep_transcript": True})
            args.strands_slime = config
        params = sampling_params(options)
        abort_event = asyncio.Event()
        args.abort_event = abort_event
        semaphore = asyncio.Semaphore(options.concurrency)
        monitor = RunMonitor(
            total=len(plan),
            done=len(plan) - len(todo),
            todo=len(todo),
            concurrency=options.concurrency,
            unhealthy_timeout_s=options.unhealthy_timeout_s,
            server=options.base_url or f"embedded dev server ({options.backend})",
            quiet=options.quiet,
        )
        stop = _RunStop(abort_event)
        ran: list[dict[str, Any]] = []
        try:
            run_dir.lock()
        except RunDirError as exc:  # a run started since the check in validate()
            raise RolloutError(str(exc)) from exc
        started = time.perf_counter()
        # from here a signal stops the run with its summary (earlier, asyncio.run's own handler ends it
        # before anything is written); episodes made after it see the abort and do not start
        with (
            stop.installed(),
            run_dir.open_for_run(overwrite=options.overwrite, retry_lines=retry, lines=lines) as output,
            run_logging(options.out / LOG, monitor),
        ):
            run_dir.record_settings(settings)
            extra_path = options.out / AGENT_SAMPLES
            if not options.resume:
                extra_path.unlink(missing_ok=True)  # what an earlier run there wrote

            async def one(group_index: int, k: int) -> None:
                row = rows[group_index]
                sample = sample_cls(
                    group_index=group_index,
                    index=group_index * options.n_samples + k,
                    prompt=row[options.input_key],
                    label=str(row[options.label_key]),
                    metadata=dict(row.get("metadata") or {}),
                )
                sample.session_id = str(uuid.uuid4())
                async with semaphore:
                    if abort_event.is_set():
                        return
                    result = await generate(args, sample, params, evaluation=options.evaluation)
                    # fan-out and several agents: every sample of the episode, the episode's own first
                    samples = result if isinstance(result, list) else [sample]
                    for each in samples:
                        if each.reward is None and status_name(each) != "aborted":
                            each.reward = await reward_func(args, each)
                if status_name(sample) == "aborted":  # only a stop aborts here; rerun it on --resume
                    return
                record = sample_record(sample, k)
                _append(output, record)
                if len(samples) > 1:  # the summary counts episodes: the others go next to it
                    with extra_path.open("a", encoding="utf-8") as extra_output:
                        for each in samples[1:]:
                            _append(extra_output, sample_record(each, k))
                ran.append(record)
                monitor.sample_finished(record)
                if monitor.stop_reason:
                    stop.early(monitor.stop_reason)

            stop.tasks = [asyncio.create_task(one(g, k)) for g, k in todo]
            watcher = asyncio.create_task(_watch(monitor, stop))
            try:
                results = await asyncio.gather(*stop.tasks, return_exceptions=True)
            finally:  # also after SIGINT/SIGTERM: no episode executor worker outlives the run
                watcher.cancel()
                monitor.close()
                await shutdown_executors()
        for result in results:
            if isinstance(result, config_module.ConfigError):  # every episode would fail alike
                raise RolloutError(str(result)) from result
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                raise result
    wall = time.perf_counter() - started
    records += ran
    summary = build_summary(options, rows, records, ran, wall, params, config, tokenizer, package_versions())
    summary["interrupted"] = stop.signal_name
    summary["stopped"] = stop.reason
    summary["stopped_by_rejections"] = stop.reason is not None and monitor.stopped_by_rejections
    summary["saved"] = not await asyncio.to_thread(run_dir.discard_if_unused)
    if summary["saved"]:
        await asyncio.to_thread(write_summary, options.out, summary)
    return summary


def _read_inputs(
    options: RolloutOptions, run_dir: RunDir
) -> tuple[list[dict[str, Any]], SampleLines | None, list[tuple[int, dict[str, Any]]]]:
    """The dataset rows and, with ``resume``, the samples already written (file work, off the loop)."""
    rows = load_rows(options.data, options.input_key, options.label_key, options.limit)
    if not options.resume or not run_dir.samples.is_file():
        return rows, None, []
    lines = SampleLines(run_dir.samples)
    return rows, lines, _read_finished(lines)


def _check_resumable(
    finished: list[tuple[int, dict[str, Any]]], rows: list[dict[str, Any]], options: RolloutOptions
) -> set[int]:
    """Refuse samples of another dataset or outside this run's plan; return the lines to run again
    (the failed samples)."""
    samples_path = options.out / "samples.jsonl"
    retry: set[int] = set()
    for number, record in finished:
        group, k = record.get("group_index"), record.get("sample_index")
        if not isinstance(group, int) or not isinstance(k, int):
            raise RolloutError(f"{samples_path}:{number}: a record has no group_index/sample_index")
        if group >= len(rows) or k >= options.n_samples:
            raise RolloutError(
                f"{samples_path} holds sample {k} of prompt {group}, outside this run's {len(rows)} "
                f"prompts x {options.n_samples} samples (its summary would disagree with the file): "
                "resume with at least the earlier --limit and --n-samples, or use another --out"
            )
        if record.get("prompt") != rows[group][options.input_key]:
            raise RolloutError(
                f"{samples_path} holds other prompts than {options.data} "
                f"(prompt {group} differs): use another --out or drop --resume"
            )
        if failed(record):
            retry.add(number)
    return retry


def _meaning_settings(
    options: RolloutOptions, config: Any, tokenizer: str, *, prompts: int
) -> dict[str, Any]:
    """:data:`MEANING_SETTINGS` of this run (the config as JSON), with the dataset's size."""
    values: dict[str, Any] = {key: getattr(options, key, None) for key in MEANING_SETTINGS}
    dumped = config.model_dump(mode="json") if hasattr(config, "model_dump") else {}
    values["config"] = {key: value for key, value in dumped.items() if key not in _CONFIG_NOT_MEANING}
    values["tokenizer"] = tokenizer
    return {**json.loads(json.dumps(values, default=str)), "data": str(options.data), "prompts": prompts}


def _check_same_settings(run_dir: RunDir, settings: dict[str, Any], options: RolloutOptions) -> None:
    """Refuse a resume whose samples would mean something else than the run's, naming each setting;
    say so when the dataset grew since (its new prompts are run too).

    Raises:
        RolloutError: a :data:`MEANING_SETTINGS` value differs from the one the run recorded.
    """
    recorded = run_dir.recorded_settings()
    if recorded is None:  # samples of a run that recorded nothing (or its files are unreadable)
        return
    if isinstance(recorded.get("config"), dict):  # a summary.json holds the whole config
        recorded["config"] = {k: v for k, v in recorded["config"].items() if k not in _CONFIG_NOT_MEANING}
    differ = []
    for key, flag in MEANING_SETTINGS.items():
        if key not in recorded or recorded[key] == settings[key]:
            continue
        if key == "config":
            keys = sorted(_differing_keys(recorded[key], settings[key]))
            differ.append(f"the rollout config ({flag}: {', '.join(keys) or 'its content'})")
        else:
            differ.append(f"{flag} {_shown(settings[key])} (the run used {_shown(recorded[key])})")
    if differ:
        raise RolloutError(
            f"--resume would mix samples of other settings into {options.out}: {'; '.join(differ)}; "
            "resume with the run's settings, or use another --out"
        )
    before = recorded.get("prompts")
    if isinstance(before, int) and settings["prompts"] > before and not options.quiet:
        grown = settings["prompts"] - before
        print(
            f"note: {options.data} has {settings['prompts']} prompts, {before} when the run in {options.out} "
            f"began: --resume runs the {grown} new one{'s' if grown != 1 else ''} too",
            file=sys.stderr,
        )


def _differing_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two JSON values."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = sorted(set(old) | set(new))
        return [
            found for key in keys for found in _differing_keys(old.get(key), new.get(key), f"{prefix}{key}.")
        ]
    return [prefix.rstrip(".")] if old != new else []


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _append(output: TextIO, record: dict[str, Any]) -> None:
    """One line per finished sample, flushed at once (a few KB to the page cache: no loop stall)."""
    output.write(json.dumps(record, ensure_ascii=False) + "\n")
    output.flush()
