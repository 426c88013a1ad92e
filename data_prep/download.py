"""Download DAPO-math-17k and AIME-2024 into the JSONL layout slime reads.

    strands-slime data --dataset all --out ./data     # in a checkout also: python -m data_prep.download
    strands-slime data --dataset aime --source /root/aime-2024   # a local copy, no network

Writes ``<out>/dapo-math-17k.jsonl`` and ``<out>/aime-2024.jsonl``, one row per line:
``{"prompt": [{"role": "user", "content": ...}], "label": "34", ...}`` for slime's
``--input-key prompt --label-key label``. Every row is validated before anything is written; the
file is replaced atomically, and an existing valid file is kept (``--force`` to rebuild), so the
command is safe to re-run. ``datasets`` (extra ``data``) is imported only when needed.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strands_slime.reward.math_answer import normalize_label, parse_number
from strands_slime.usage import EXIT_USAGE, ArgumentParser, usage_error

__all__ = [
    "DATASETS",
    "DataPrepError",
    "DatasetSpec",
    "PrepareResult",
    "default_out_dir",
    "load_rows",
    "main",
    "prepare",
    "validate_row",
]

_ROLES = frozenset({"system", "user", "assistant"})
_MAX_ERRORS_SHOWN = 5


@dataclass(frozen=True)
class DatasetSpec:
    """Where a dataset lives on the Hugging Face hub and what file slime expects."""

    key: str
    hub_id: str
    filename: str
    expected_rows: int | None
    integer_labels: bool


DATASETS: dict[str, DatasetSpec] = {
    "dapo": DatasetSpec("dapo", "zhuzilin/dapo-math-17k", "dapo-math-17k.jsonl", 17_398, integer_labels=True),
    "aime": DatasetSpec("aime", "zhuzilin/aime-2024", "aime-2024.jsonl", 30, integer_labels=True),
}


class DataPrepError(Exception):
    """A problem the user must fix (offline, missing package, invalid rows); the message says how."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        """``exit_code``: what ``main`` exits with (2, as every ``strands-slime`` error line)."""
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class PrepareResult:
    """What :func:`prepare` did: the file, rows read/written/invalid, and whether a valid file was kept."""

    path: Path
    rows_read: int
    rows_written: int
    rows_invalid: int
    reused_existing: bool


def default_out_dir() -> Path:
    """``$DATA_DIR`` (what the launch scripts read) or ``./data``."""
    return Path(os.environ.get("DATA_DIR") or "data")


# ----------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------


def _clean_message(message: object, where: str) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise ValueError(f"{where} is {type(message).__name__}, expected {{'role': ..., 'content': ...}}")
    role, content = message.get("role"), message.get("content")
    if role not in _ROLES:
        raise ValueError(f"{where}.role is {role!r}, expected one of {sorted(_ROLES)}")
    if not isinstance(content, str) or not content.strip():
        raise ValueError(f"{where}.content must be a non-empty string, got {content!r:.60}")
    # datasets fills keys missing from some messages with None; drop those, keep real extras.
    return {key: value for key, value in message.items() if value is not None}


def validate_row(row: Mapping[str, Any], spec: DatasetSpec) -> dict[str, Any]:
    """The row in slime's layout, or ValueError saying what is wrong.

    ``prompt`` must be a non-empty list of chat messages ending with a user turn (a bare string
    becomes one user message); ``label`` a non-empty string or integer, integer-valued for
    DAPO/AIME. Other non-null columns are kept as they are.

    Raises:
        ValueError: the row is not an object, or its prompt or label is malformed (the message says how).
    """
    if not isinstance(row, Mapping):
        raise ValueError(f"row is {type(row).__name__}, expected an object")
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt:
        raise ValueError(f"prompt must be a non-empty list of messages, got {prompt!r:.60}")
    messages = [_clean_message(message, f"prompt[{i}]") for i, message in enumerate(prompt)]
    if messages[-1]["role"] != "user":
        raise ValueError(f"the last prompt message must be from the user, not {messages[-1]['role']!r}")

    label = row.get("label")
    if isinstance(label, bool) or not isinstance(label, (str, int)):
        raise ValueError(f"label must be a string or an integer, got {label!r:.60}")
    label = str(label).strip()
    if not label:
        raise ValueError("label is empty")
    if spec.integer_labels:
        value = parse_number(normalize_label(label))
        if value is None or value.denominator != 1:
            raise ValueError(f"label {label!r:.60} is not an integer ({spec.key} answers are integers)")

    cleaned = {key: value for key, value in row.items() if value is not None}
    cleaned["prompt"], cleaned["label"] = messages, label
    try:  # a column that can't be written as JSON is an error here, not half-way through a write
        json.dumps(cleaned, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"row is not writable as JSON (NaN, Infinity or a non-JSON value): {error}"
        ) from error
    return cleaned


def _validate_all(
    rows: Iterable[Mapping[str, Any]], spec: DatasetSpec, origin: str
) -> tuple[list[dict[str, Any]], list[str], int]:
    valid: list[dict[str, Any]] = []
    errors: list[str] = []
    count = 0
    for index, row in enumerate(rows):
        count += 1
        try:
            valid.append(validate_row(row, spec))
        except (ValueError, TypeError) as error:
            errors.append(f"{origin} row {index}: {error}")
    return valid, errors, count


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------


def _import_datasets() -> Any:
    try:
        import datasets
    except ImportError as error:
        raise DataPrepError(
            "the 'datasets' package is needed: pip install 'strands-slime[data]' (or pip install datasets)",
            exit_code=2,
        ) from error
    return datasets


def _resolve_source(source: Path, spec: DatasetSpec) -> Path:
    """A file, or a directory holding ``spec.filename`` (e.g. from ``hf download --local-dir``)."""
    if source.is_dir():
        candidate = source / spec.filename
        if candidate.is_file():
            return candidate
        raise DataPrepError(f"{source} is a directory without {spec.filename}")
    if not source.is_file():
        raise DataPrepError(f"source file {source} does not exist")
    return source


def _offline_message(spec: DatasetSpec, out_path: Path, error: BaseException) -> str:
    return (
        f"cannot reach the Hugging Face hub for {spec.hub_id} ({type(error).__name__}: {error}).\n"
        "  - on a machine with internet access run this same command and copy "
        f"{out_path.name} into {out_path.parent}/, or\n"
        f"  - download it elsewhere (hf download --repo-type dataset {spec.hub_id} --local-dir DIR) and run "
        f"python -m data_prep.download --dataset {spec.key} --source DIR, or\n"
        "  - point HF_ENDPOINT at a reachable hub mirror (and unset HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)."
    )


def load_rows(
    spec: DatasetSpec,
    *,
    source: Path | None = None,
    out_path: Path | None = None,
    cache_dir: Path | None = None,
) -> list[dict[str, Any]]:
    """The dataset's rows via ``datasets``: from the hub, or from a local JSONL/Parquet ``source``.

    Args:
        spec: the dataset.
        source: a local file (or directory holding ``spec``'s file) instead of the hub.
        out_path: where the result will go (named in the offline hint).
        cache_dir: the ``datasets`` cache (default: its own).

    Raises:
        DataPrepError: ``datasets`` is missing, the source is unreadable, the hub has no such dataset
            or is unreachable (then ``exit_code`` 2 and how to proceed offline).
    """
    datasets = _import_datasets()
    out_path = out_path or default_out_dir() / spec.filename
    cache = str(cache_dir) if cache_dir is not None else None
    if source is not None:
        path = _resolve_source(source, spec)
        builder = "parquet" if path.suffix == ".parquet" else "json"
        try:
            dataset = datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=cache)
        except Exception as error:  # pyarrow/json decode errors: report which file and why
            raise DataPrepError(
                f"could not read {path} as {builder}: {type(error).__name__}: {error}"
            ) from error
        return list(dataset)
    try:
        dataset = datasets.load_dataset(spec.hub_id, split="train", cache_dir=cache)
    except ConnectionError as error:  # datasets raises ConnectionError both offline and when DNS fails
        raise DataPrepError(_offline_message(spec, out_path, error), exit_code=2) from error
    except datasets.exceptions.DatasetNotFoundError as error:
        raise DataPrepError(f"{spec.hub_id} was not found on the hub (or needs a login): {error}") from error
    return list(dataset)


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------


def _read_jsonl(path: Path) -> Iterable[dict[str, Any]]:
    with path.open(encoding="utf-8") as file:
        for line_number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as error:
                raise DataPrepError(
                    f"{path}:{line_number} is not valid JSON ({error}); rebuild with --force"
                ) from error


def _write_atomically(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            for row in rows:
                file.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _summarize_errors(errors: list[str]) -> str:
    shown = "\n  ".join(errors[:_MAX_ERRORS_SHOWN])
    more = f"\n  ... and {len(errors) - _MAX_ERRORS_SHOWN} more" if len(errors) > _MAX_ERRORS_SHOWN else ""
    return f"{shown}{more}"


def prepare(
    spec: DatasetSpec,
    out_dir: Path,
    *,
    source: Path | None = None,
    force: bool = False,
    skip_invalid: bool = False,
    cache_dir: Path | None = None,
    log: Callable[[str], None] = print,
) -> PrepareResult:
    """Build ``out_dir/spec.filename``; keeps an existing valid file unless ``force``.

    Invalid rows stop the build with a list of what is wrong (nothing is written) unless
    ``skip_invalid``, which drops them and reports how many.

    Raises:
        DataPrepError: the existing file or the new rows are invalid, no row is valid, or loading
            failed (see :func:`load_rows`); nothing is written then.
    """
    out_path = Path(out_dir) / spec.filename
    if out_path.exists() and not force:
        rows, errors, count = _validate_all(_read_jsonl(out_path), spec, str(out_path))
        if errors:
            raise DataPrepError(
                f"{out_path} exists but has {len(errors)} invalid rows; rebuild it with --force:\n  "
                + _summarize_errors(errors)
            )
        log(f"{spec.key}: {out_path} already has {count} valid rows; kept (use --force to rebuild)")
        return PrepareResult(out_path, count, count, 0, reused_existing=True)

    origin = str(source) if source is not None else spec.hub_id
    log(f"{spec.key}: loading {origin} ...")
    raw_rows = load_rows(spec, source=source, out_path=out_path, cache_dir=cache_dir)
    rows, errors, count = _validate_all(raw_rows, spec, origin)
    if errors and not skip_invalid:
        raise DataPrepError(
            f"{origin}: {len(errors)} of {count} rows are invalid; nothing was written "
            f"(--skip-invalid drops them):\n  " + _summarize_errors(errors)
        )
    if not rows:
        raise DataPrepError(f"{origin}: no valid rows; nothing was written")
    _write_atomically(out_path, rows)
    log(
        f"{spec.key}: read {count} rows, wrote {len(rows)} to {out_path}"
        + (f", skipped {len(errors)} invalid" if errors else "")
        + f" ({out_path.stat().st_size / 1e6:.2f} MB)"
    )
    if spec.expected_rows is not None and source is None and count != spec.expected_rows:
        log(
            f"{spec.key}: note: expected {spec.expected_rows} rows upstream, got {count} (has the dataset changed?)"
        )
    return PrepareResult(out_path, count, len(rows), len(errors), reused_existing=False)


def main(argv: list[str] | None = None, prog: str = "python -m data_prep.download") -> int:
    """CLI entry point; returns the process exit code (0 ok, 2 bad data or usage, offline or a missing
    package: one ``error:`` line)."""
    parser = ArgumentParser(prog=prog, description="Download DAPO-math-17k / AIME-2024 as slime JSONL.")
    parser.add_argument("--dataset", choices=[*DATASETS, "all"], default="all")
    parser.add_argument(
        "--out", type=Path, default=None, help="output directory (default: $DATA_DIR or ./data)"
    )
    parser.add_argument(
        "--source",
        type=Path,
        default=None,
        help="read a local JSONL/Parquet file, or a directory holding <name>.jsonl, instead of the hub",
    )
    parser.add_argument("--force", action="store_true", help="rebuild files that already exist")
    parser.add_argument("--skip-invalid", action="store_true", help="drop invalid rows instead of stopping")
    parser.add_argument("--cache-dir", type=Path, default=None, help="datasets cache directory")
    args = parser.parse_args(argv)

    keys = list(DATASETS) if args.dataset == "all" else [args.dataset]
    if args.source is not None and len(keys) > 1 and not args.source.is_dir():
        parser.error("--source FILE needs a single --dataset (or pass a directory holding every file)")
    out_dir = args.out if args.out is not None else default_out_dir()
    try:
        for key in keys:
            prepare(
                DATASETS[key],
                out_dir,
                source=args.source,
                force=args.force,
                skip_invalid=args.skip_invalid,
                cache_dir=args.cache_dir,
            )
    except DataPrepError as error:
        usage_error(error)
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
