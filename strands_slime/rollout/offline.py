"""The offline rollout runner behind ``strands-slime rollout`` and ``demo``.

It runs slime's code path (``generate`` then ``reward_func`` on a slime-like ``args``) over a JSONL or
parquet dataset, against a running SGLang server (``--base-url``) or an embedded dev server. Each
finished sample is appended to ``samples.jsonl`` at once, so an interrupted run loses nothing and
``resume=True`` picks up where it stopped.
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
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TextIO
from urllib.parse import urlparse

from strands_slime.episode_metadata import EpisodeMetadata

DEMO_DATA = "demo_problems.jsonl"
DEMO_SCRIPT = "demo_script.json"
DEFAULT_MAX_FAILURE_RATE = 0.1
DEFAULT_HEALTH_TIMEOUT_S = 5.0
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
    max_failure_rate: float = DEFAULT_MAX_FAILURE_RATE
    health_timeout_s: float = DEFAULT_HEALTH_TIMEOUT_S
    wandb: bool = False
    wandb_project: str = "strands-slime"
    wandb_run_name: str | None = None

    def validate(self) -> None:
        """Refuse settings that could only fail later (before any server starts or data is read).

        Raises:
            RolloutError: a count, limit, rate or timeout out of range (the flag is named).
        """
        if self.n_samples < 1 or self.concurrency < 1:
            raise RolloutError("--n-samples and --concurrency must be >= 1")
        if self.limit is not None and self.limit < 1:
            raise RolloutError(f"--limit must be >= 1 (got {self.limit}); leave it out to use every row")
        if not 0.0 <= self.max_failure_rate <= 1.0:
            raise RolloutError(f"--max-failure-rate must be between 0 and 1, got {self.max_failure_rate}")
        if self.health_timeout_s <= 0:
            raise RolloutError(f"--health-timeout must be > 0, got {self.health_timeout_s}")


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
    """``GET /health`` then ``/model_info`` within ``timeout_s``: a dead URL fails in seconds, not after retries.

    Returns:
        The server's ``/model_info`` (empty when it has none: not every server implements it).

    Raises:
        RolloutError: the server is unreachable, unhealthy or silent for ``timeout_s``.
    """
    import aiohttp

    base = (url if "://" in url else f"http://{url}").rstrip("/")
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
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


async def _resolve_tokenizer(options: RolloutOptions, model_info: dict[str, Any]) -> str:
    """``--tokenizer``, else what the server reports, else the bundled Qwen3; loaded once to fail early."""
    from strands_slime.provider.tokenizer import load_tokenizer, resolve_tokenizer_path

    name = options.tokenizer
    source = "--tokenizer"
    if name is None and options.base_url:
        name = model_info.get("tokenizer_path") or model_info.get("model_path")
        source = f"the server's /model_info ({options.base_url})"
        if not name:
            raise RolloutError("the server does not report its tokenizer (/model_info); pass --tokenizer")

    def load() -> str:
        if name and name.startswith(("/", ".", "~")) and not Path(name).expanduser().exists():
            raise RolloutError(f"the tokenizer directory {name} from {source} does not exist")
        path = resolve_tokenizer_path(name)
        load_tokenizer(path)
        return path

    try:
        return await asyncio.to_thread(load)
    except RolloutError:
        raise
    except Exception as exc:  # transformers raises OSError, ValueError, ... for a bad directory
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = "; pass --tokenizer with a local tokenizer directory" if source != "--tokenizer" else ""
        raise RolloutError(f"cannot load the tokenizer {name!r} from {source}: {detail}{hint}") from exc


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


def _read_finished(path: Path) -> list[dict[str, Any]]:
    """Records already in ``samples.jsonl``; a torn last line (killed mid-write) is cut off."""
    if not path.is_file():
        return []
    records: list[dict[str, Any]] = []
    good_bytes = 0
    with path.open("rb") as handle:
        for number, line in enumerate(handle, 1):
            if not line.endswith(b"\n"):  # each record is written with its newline: this one is torn
                break
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                if handle.read(1):  # not the last line: the file is damaged, not just torn
                    raise RolloutError(f"{path}:{number}: not JSON; cannot resume from it") from exc
                break
            if not isinstance(record, dict) or "group_index" not in record:
                raise RolloutError(f"{path}:{number}: not a strands-slime sample; cannot resume from it")
            try:  # the summary reads every record's episode metadata
                EpisodeMetadata.from_metadata(record.get("metadata"))
            except TypeError as exc:
                raise RolloutError(f"{path}:{number}: {exc}; cannot resume from it") from exc
            records.append(record)
            good_bytes += len(line)
    if good_bytes < path.stat().st_size:
        with path.open("r+b") as handle:
            handle.truncate(good_bytes)
    return records


def _failed(record: dict[str, Any]) -> bool:
    return record.get("status") == "failed" or bool(record.get("remove_sample"))


def failure_reasons(records: list[dict[str, Any]], top: int = 3) -> list[tuple[str, int]]:
    """The most common ``infra_error`` (episode metadata) of failed samples, first line, shortened.

    Returns:
        Up to ``top`` ``(reason, samples)`` pairs, the most frequent first.
    """
    reasons: Counter[str] = Counter()
    for record in records:
        if _failed(record):
            reason = str(
                EpisodeMetadata.from_metadata(record.get("metadata")).infra_error or "no reason recorded"
            )
            reasons[reason.strip().splitlines()[0][:200] if reason.strip() else "no reason recorded"] += 1
    return reasons.most_common(top)


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


class _Interrupt:
    """SIGINT/SIGTERM: stop starting episodes, cancel the running ones, remember the signal.

    A second signal exits at once: every finished sample is already flushed to ``samples.jsonl``."""

    def __init__(self, tasks: list[asyncio.Task[None]], abort_event: asyncio.Event) -> None:
        self.tasks = tasks
        self.abort_event = abort_event
        self.signal_name: str | None = None

    def __call__(self, signal_name: str) -> None:
        if self.signal_name is not None:  # a second Ctrl-C: stop now (finished samples are on disk)
            print(f"{signal_name} again: exiting without a summary", file=sys.stderr, flush=True)
            os._exit(128 + int(getattr(signal, signal_name)))
        self.signal_name = signal_name
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


async def run_rollout(options: RolloutOptions) -> dict[str, Any]:
    """Generate + reward every (prompt, sample) pair not yet in ``samples.jsonl``; write the summary.

    Returns:
        The summary (also in ``summary.json``/``summary.md``); ``summary["interrupted"]`` names the
        signal when one stopped the run.

    Raises:
        RolloutError: bad options, data, config, tokenizer or server, or a ``--resume`` file that is
            not this run's; all are found before any episode starts.
    """
    from tqdm.auto import tqdm

    from strands_slime import config as config_module
    from strands_slime.reward.dapo import reward_func
    from strands_slime.rollout.episode import generate
    from strands_slime.rollout.executor import shutdown_executors
    from strands_slime.rollout.slime_compat import sample_class, status_name

    options.validate()
    samples_path = options.out / "samples.jsonl"
    rows, finished = await asyncio.to_thread(_prepare_files, options, samples_path)
    done = _check_resumable(finished, rows, options)
    plan = [(group_index, k) for group_index in range(len(rows)) for k in range(options.n_samples)]
    todo = [key for key in plan if key not in done]
    sample_cls = sample_class()
    interrupt: _Interrupt | None = None
    try:  # the config and a local tokenizer are checked before an embedded server starts
        config = config_module.get_rollout_config(slime_args(options, "http://127.0.0.1:0", None))
    except config_module.ConfigError as exc:
        raise RolloutError(str(exc)) from exc
    tokenizer = await _resolve_tokenizer(options, {}) if options.tokenizer or not options.base_url else None
    async with _server(options) as url:
        model_info = await probe_server(url, options.health_timeout_s)
        tokenizer = tokenizer or await _resolve_tokenizer(options, model_info)
        started = time.perf_counter()
        args = slime_args(options, url, tokenizer)
        args.strands_slime = config
        if options.keep_transcript and not config.keep_transcript:
            config = config.model_copy(update={"keep_transcript": True})
            args.strands_slime = config
        params = sampling_params(options)
        abort_event = asyncio.Event()
        args.abort_event = abort_event
        semaphore = asyncio.Semaphore(options.concurrency)
        progress = tqdm(
            total=len(rows) * options.n_samples,
            initial=len(plan) - len(todo),
            desc="rollout",
            unit="sample",
            disable=options.quiet,
        )
        with samples_path.open("a" if options.resume else "w", encoding="utf-8") as output:

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
                    await generate(args, sample, params, evaluation=options.evaluation)
                    if sample.reward is None and status_name(sample) != "aborted":
                        sample.reward = await reward_func(args, sample)
                if status_name(sample) == "aborted":  # only an interrupt aborts here; rerun it on --resume
                    return
                _append(output, sample_record(sample, k), finished)
                progress.update(1)

            tasks = [asyncio.create_task(one(g, k)) for g, k in todo]
            interrupt = _Interrupt(tasks, abort_event)
            try:
                with interrupt.installed():
                    results = await asyncio.gather(*tasks, return_exceptions=True)
            finally:  # also after SIGINT/SIGTERM: no episode executor worker outlives the run
                await shutdown_executors()
            progress.close()
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                raise result
    wall = time.perf_counter() - started
    planned = [r for r in finished if r["group_index"] < len(rows) and r["sample_index"] < options.n_samples]
    summary = build_summary(options, rows, planned, wall, params, config, tokenizer)
    summary["interrupted"] = interrupt.signal_name if interrupt else None
    write_summary(options.out, summary)
    if options.wandb and not summary["interrupted"]:
        await asyncio.to_thread(log_to_wandb, options, summary)
    return summary


def _prepare_files(
    options: RolloutOptions, samples_path: Path
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The dataset rows and, with ``resume``, the samples already written (file work, off the loop)."""
    rows = load_rows(options.data, options.input_key, options.label_key, options.limit)
    options.out.mkdir(parents=True, exist_ok=True)
    return rows, _read_finished(samples_path) if options.resume else []


def _check_resumable(
    finished: list[dict[str, Any]], rows: list[dict[str, Any]], options: RolloutOptions
) -> set[tuple[int, int]]:
    done: set[tuple[int, int]] = set()
    for record in finished:
        group, k = record.get("group_index"), record.get("sample_index")
        if not isinstance(group, int) or not isinstance(k, int):
            raise RolloutError(f"{options.out / 'samples.jsonl'}: a record has no group_index/sample_index")
        if group < len(rows) and record.get("prompt") != rows[group][options.input_key]:
            raise RolloutError(
                f"{options.out / 'samples.jsonl'} holds other prompts than {options.data} "
                f"(prompt {group} differs): use another --out or drop --resume"
            )
        done.add((group, k))
    return done


def _append(output: TextIO, record: dict[str, Any], finished: list[dict[str, Any]]) -> None:
    """One line per finished sample, flushed at once (a few KB to the page cache: no loop stall)."""
    output.write(json.dumps(record, ensure_ascii=False) + "\n")
    output.flush()
    finished.append(record)


def build_summary(
    options: RolloutOptions,
    rows: list[dict[str, Any]],
    records: list[dict[str, Any]],
    wall: float,
    params: dict[str, Any],
    config: Any,
    tokenizer: str,
) -> dict[str, Any]:
    """The run's summary: evaluation (accuracy, pass@k), agent metrics, failures, throughput and settings.

    Args:
        options: the run's settings.
        rows: the dataset rows (for the expected sample count).
        records: the finished ``samples.jsonl`` records this run planned (resumed ones included).
        wall: seconds the episodes took.
        params: the sampling params sent.
        config: the rollout config (a pydantic model; dumped as JSON).
        tokenizer: the tokenizer path used.
    """
    from strands_slime.reward.eval_metrics import record_from_sample, summarize
    from strands_slime.rollout.metrics import compute_rollout_metrics
    from strands_slime.rollout.slime_compat import Sample

    samples = [Sample.from_dict(record) for record in records]
    eval_records = [record_from_sample(s) for s in samples]
    for eval_record, record in zip(eval_records, records, strict=True):
        if record.get("remove_sample"):
            eval_record["status"] = "failed"
    evaluation = summarize(eval_records, exclude_statuses=("aborted", "failed"))
    model_tokens = sum(sum(r.get("loss_mask") or []) for r in records)
    failed = sum(1 for r in records if _failed(r))
    settings = {
        key: value for key, value in asdict(options).items() if key not in ("quiet", "resume", "wandb")
    }
    return {
        "data": str(options.data),
        "samples": len(records),
        "expected_samples": len(rows) * options.n_samples,
        "prompts": len(rows),
        "n_samples_per_prompt": options.n_samples,
        "server": options.base_url or f"embedded dev server ({options.backend})",
        "failures": {
            "failed": failed,
            "rate": failed / len(records) if records else 0.0,
            "max_rate": options.max_failure_rate,
            "top_reasons": [{"reason": reason, "count": count} for reason, count in failure_reasons(records)],
        },
        "evaluation": evaluation.as_dict(),
        "agent": compute_rollout_metrics(samples),
        "throughput": {
            "wall_seconds": round(wall, 3),
            "samples_per_second": round(len(records) / wall, 3) if wall else None,
            "model_tokens_per_second": round(model_tokens / wall, 1) if wall else None,
            "model_tokens": model_tokens,
            "total_tokens": sum(len(r.get("tokens") or []) for r in records),
        },
        "sampling_params": params,
        "options": json.loads(json.dumps(settings, default=str)),
        "config": config.model_dump(mode="json") if hasattr(config, "model_dump") else None,
        "tokenizer": tokenizer,
        "versions": package_versions(),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def write_summary(out: Path, summary: dict[str, Any]) -> None:
    """Write ``summary.json`` and ``summary.md`` into ``out``."""
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (out / "summary.md").write_text(summary_markdown(summary), encoding="utf-8")


def summary_markdown(summary: dict[str, Any]) -> str:
    """``summary.md``: the summary's evaluation, agent, throughput, failure and version tables."""
    agent = summary["agent"]
    throughput = summary["throughput"]
    evaluation = summary["evaluation"]
    lines = [
        f"# Rollout summary: {summary['data']}",
        "",
        f"{summary['samples']} samples ({summary['prompts']} prompts x {summary['n_samples_per_prompt']}) "
        f"on {summary['server']}, {summary['date']}, {summary['machine']}.",
        "",
    ]
    if summary.get("interrupted"):
        lines += [
            f"Interrupted by {summary['interrupted']}: {summary['samples']} of "
            f"{summary['expected_samples']} samples finished.",
            "",
        ]
    lines += ["| evaluation | value |", "|---|---|"]
    for key, value in evaluation.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            lines.append(f"| {key} | {value:.4f} |" if isinstance(value, float) else f"| {key} | {value} |")
    lines += ["", "| agent | value |", "|---|---|"]
    for key in sorted(agent):
        value = agent[key]
        lines.append(f"| {key} | {value:.4f} |" if isinstance(value, float) else f"| {key} | {value} |")
    lines += ["", "| throughput | value |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in throughput.items()]
    failures = summary["failures"]
    if failures["failed"]:
        lines += ["", "| failure reason | samples |", "|---|---|"]
        lines += [f"| {item['reason']} | {item['count']} |" for item in failures["top_reasons"]]
    lines += ["", "| version | |", "|---|---|"]
    lines += [f"| {name} | {version or 'not installed'} |" for name, version in summary["versions"].items()]
    return "\n".join(lines) + "\n"


def print_summary(summary: dict[str, Any], out: Path, stream: TextIO | None = None) -> None:
    """A few lines for the terminal (accuracy, statuses, tool use, throughput, failures, file paths).

    Args:
        summary: what :func:`build_summary` returned.
        out: the run's output directory (its files are named).
        stream: where to print (default: stdout).
    """
    stream = stream or sys.stdout
    evaluation = summary["evaluation"]
    agent = summary["agent"]
    throughput = summary["throughput"]
    accuracy = evaluation.get("accuracy")

    def say(text: str) -> None:
        print(text, file=stream)

    say(f"samples: {summary['samples']}  prompts: {summary['prompts']}  server: {summary['server']}")
    if accuracy is not None:
        passes = "  ".join(
            f"{k}={v:.3f}" for k, v in evaluation.items() if k.startswith(("pass@", "avg@")) and v is not None
        )
        say(f"accuracy: {accuracy:.3f}  {passes}")
    statuses = "  ".join(f"{k.split('/', 1)[1]}={v:.2f}" for k, v in agent.items() if k.startswith("status/"))
    say(f"statuses: {statuses}")
    say(
        f"tool calls/episode: {agent.get('tool_calls/mean', 0):.2f}  parse errors/episode: "
        f"{agent.get('parse_errors/mean', 0):.2f}  sandbox s/episode: {agent.get('sandbox_seconds/mean', 0):.3f}"
    )
    say(
        f"wall: {throughput['wall_seconds']} s  samples/s: {throughput['samples_per_second']}  "
        f"model tokens/s: {throughput['model_tokens_per_second']}"
    )
    print_failures(summary, stream)
    say(f"results: {out / 'samples.jsonl'}\nsummary: {out / 'summary.json'} and {out / 'summary.md'}")


def print_failures(summary: dict[str, Any], stream: TextIO) -> None:
    """The failed-sample count and its top reasons; nothing when no sample failed."""
    failures = summary["failures"]
    if not failures["failed"]:
        return
    print(
        f"failed: {failures['failed']} of {summary['samples']} ({failures['rate']:.1%}); top reasons:",
        file=stream,
    )
    for item in failures["top_reasons"]:
        print(f"  {item['count']:>6}  {item['reason']}", file=stream)


# --------------------------------------------------------------------------- W&B


def flat_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """Numeric summary values as ``section/key``; zeros stay (a missing key is a gap in W&B's charts)."""
    flat: dict[str, float] = {}
    for section in ("evaluation", "agent", "throughput"):
        for key, value in (summary.get(section) or {}).items():
            if isinstance(value, bool):
                flat[f"{section}/{key}"] = float(value)
            elif isinstance(value, (int, float)):
                flat[f"{section}/{key}"] = float(value)
    flat["failures/failed"] = float(summary["failures"]["failed"])
    flat["failures/rate"] = float(summary["failures"]["rate"])
    return flat


def log_to_wandb(options: RolloutOptions, summary: dict[str, Any]) -> str:
    """Log the run's metrics and settings to W&B (``WANDB_MODE=offline`` works).

    Returns:
        The W&B run directory.

    Raises:
        RolloutError: wandb is not installed or cannot start a run (the results are already written).
    """
    try:
        import wandb
    except ImportError as exc:
        raise RolloutError("--wandb needs wandb: pip install 'strands-slime[wandb]'") from exc
    try:
        run = wandb.init(
            project=options.wandb_project,
            name=options.wandb_run_name,
            dir=str(options.out),
            job_type="rollout",
            config={
                "sampling_params": summary["sampling_params"],
                "options": summary["options"],
                "rollout_config": summary["config"],
                "versions": summary["versions"],
            },
        )
    except Exception as exc:  # no API key, no network in online mode, ...: the results are written
        raise RolloutError(
            f"W&B logging failed ({exc}); the results are in {options.out} (WANDB_MODE=offline logs locally)"
        ) from exc
    try:
        metrics = flat_metrics(summary)
        run.log(metrics)
        run.summary.update(metrics)
        return str(run.dir)
    finally:
        run.finish()
