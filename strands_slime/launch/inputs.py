"""The inputs every node checks before it starts or joins Ray: programs, checkouts, checkpoints, data, the
rollout config (the package's own validator, the reward's budget, math-verify), the eval config as slime
resolves it, and the Hugging Face checkpoint's architecture.

Ray may place the rollout manager, the trainer's ranks and the engines on any node, so every node checks
every input it will read. A real run collects every missing input and refuses with all of them listed; a
dry run (which may happen away from the GPU box) prints them as notes.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strands_slime.launch.settings import LaunchError, LaunchSettings

DOWNLOAD_HINT = "python -m data_prep.download --out {data_dir}"


@dataclass
class Problems:
    """Problems found by the checks, reported together: a real run refuses, a dry run notes each at once."""

    dry_run: bool
    note: Callable[[str], None]
    found: list[str] = field(default_factory=list)

    def add(self, problem: str) -> None:
        """Record ``problem`` (a dry run notes it at once)."""
        if self.dry_run:
            self.note(f"note (dry run, not fatal): {problem}")
        else:
            self.found.append(problem)

    def require_file(self, what: str, path: str, hint: str = "") -> None:
        """A problem when ``path`` is not a file; ``hint`` says how to get it."""
        if not Path(path).is_file():
            self.add(f"{what} not found: {path}" + (f" ({hint})" if hint else ""))

    def require_dir(self, what: str, path: str, hint: str = "") -> None:
        """A problem when ``path`` is not a folder."""
        if not Path(path).is_dir():
            self.add(f"{what} not found: {path}" + (f" ({hint})" if hint else ""))

    def finish(self) -> None:
        """Stop before anything starts when a check failed, listing every problem at once."""
        if self.found:
            raise LaunchError("cannot start:\n" + "\n".join(f"  - {problem}" for problem in self.found))


@dataclass(frozen=True)
class EvalSettings:
    """What the run's evaluation uses: pass@k's k, the longest eval response, and its prompts."""

    n_samples: int
    max_response_len: int
    prompts: int = 0
    """Prompts in the eval datasets (the pilot projects evaluation's time from them)."""


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return value


def eval_config_settings(
    config: Any, default_samples: int, default_max_len: int
) -> tuple[int, int, list[str]]:
    """(n_samples, max_response_len, dataset paths) shared by every dataset of a slime ``--eval-config``.

    slime reads each dataset's settings from the file, but ``--log-passrate`` groups eval rewards by the
    command line's ``--n-samples-per-eval-prompt``, and code reading ``args.eval_max_response_len`` sees
    the command line's value: the launch passes the file's values on the command line too.
    """
    if not isinstance(config, dict):
        raise ValueError("the file must hold a mapping")
    section = config.get("eval", config)
    if not isinstance(section, dict):
        raise ValueError("`eval` must be a mapping")
    defaults = section.get("defaults") or {}
    datasets = section.get("datasets") or []
    if not isinstance(defaults, dict) or not isinstance(datasets, list) or not datasets:
        raise ValueError("`eval.datasets` must list at least one dataset")
    samples: set[int] = set()
    lengths: list[int] = []
    paths: list[str] = []
    for entry in datasets:
        if not isinstance(entry, dict) or "name" not in entry or "path" not in entry:
            raise ValueError(f"every dataset needs a name and a path, got {entry!r}")
        merged = {**defaults, **entry}
        name = entry["name"]
        samples.add(
            _positive_int(
                merged.get("n_samples_per_eval_prompt", default_samples), f"{name}: n_samples_per_eval_prompt"
            )
        )
        lengths.append(
            _positive_int(merged.get("max_response_len", default_max_len), f"{name}: max_response_len")
        )
        paths.append(str(entry["path"]))
    if len(samples) > 1:
        # slime's --log-passrate groups every dataset's rewards by one group size.
        raise ValueError(
            f"datasets disagree on n_samples_per_eval_prompt {sorted(samples)}: pass@k needs one k"
        )
    return samples.pop(), max(lengths), paths


def read_eval_config(
    path: str, data_dir: str, default_samples: int, default_max_len: int
) -> tuple[int, int, list[str]]:
    """The eval config resolved as slime resolves it (OmegaConf, ``resolve=True``), with ``DATA_DIR``
    as the job will see it.

    Raises:
        LaunchError: the file is unusable, in one line.
    """
    try:
        from omegaconf import OmegaConf
    except ImportError:
        raise LaunchError(
            "EVAL_CONFIG: omegaconf is not installed (slime's image has it; pip install omegaconf)"
        ) from None
    import os

    saved = os.environ.get("DATA_DIR")
    os.environ["DATA_DIR"] = data_dir  # ${oc.env:DATA_DIR} in the file resolves as in the job
    try:
        config = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        return eval_config_settings(config, default_samples, default_max_len)
    except Exception as error:  # OmegaConf raises many types; each is one line for the user
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise LaunchError(f"EVAL_CONFIG: eval config {path}: {message}") from None
    finally:
        if saved is None:
            os.environ.pop("DATA_DIR", None)
        else:
            os.environ["DATA_DIR"] = saved


def _lines(path: str) -> int:
    try:
        with open(path, "rb") as handle:
            return sum(1 for _ in handle)
    except OSError:
        return 0


def check_inputs(
    settings: LaunchSettings, problems: Problems, search_path: str | None = None
) -> EvalSettings:
    """Every program (on ``search_path``, the launch's PATH), folder and file this node will read; the
    run's eval settings."""
    for command in ("ray", "python3", "setsid"):
        if shutil.which(command, path=search_path) is None:
            problems.add(f"command '{command}' not on PATH")
    hint = DOWNLOAD_HINT.format(data_dir=settings.data_dir)
    problems.require_dir("slime checkout (SLIME_DIR)", settings.slime_dir)
    problems.require_file("slime's train.py", f"{settings.slime_dir}/train.py")
    problems.require_dir("Megatron-LM checkout (MEGATRON_DIR)", f"{settings.megatron_dir}/megatron")
    problems.require_dir(
        "strands_slime package (STRANDS_SLIME_DIR)", f"{settings.strands_slime_dir}/strands_slime"
    )
    problems.require_file(
        "Hugging Face checkpoint (HF_CHECKPOINT)",
        f"{settings.hf_checkpoint}/config.json",
        f"hf download Qwen/Qwen3-8B --local-dir {settings.hf_checkpoint}",
    )
    problems.require_file(
        "torch_dist checkpoint (REF_LOAD)",
        f"{settings.ref_load}/latest_checkpointed_iteration.txt",
        "run scripts/convert_qwen3_8b.sh",
    )
    problems.require_file("training data (PROMPT_DATA)", settings.prompt_data, hint)
    problems.require_file("rollout config (ROLLOUT_CONFIG)", settings.rollout_config)
    samples, max_len = settings.n_samples_per_eval_prompt, settings.eval_max_response_len
    if settings.eval_interval == 0:
        return EvalSettings(samples, max_len)
    if not settings.eval_config:
        problems.require_file("eval data (EVAL_DATA)", settings.eval_data, hint)
        return EvalSettings(samples, max_len, _lines(settings.eval_data))
    if not Path(settings.eval_config).is_file():
        problems.require_file("eval config (EVAL_CONFIG)", settings.eval_config)
        return EvalSettings(samples, max_len)
    samples, max_len, paths = read_eval_config(settings.eval_config, settings.data_dir, samples, max_len)
    prompts = 0
    for dataset in paths:
        if not dataset.startswith("/"):
            raise LaunchError(
                f"EVAL_CONFIG ({settings.eval_config}) names a relative dataset path '{dataset}'; make it absolute"
            )
        problems.require_file("eval dataset named in EVAL_CONFIG", dataset, hint)
        prompts += _lines(dataset)
    return EvalSettings(samples, max_len, prompts)


def response_budget(max_response_len: int, extra_train_args: Sequence[str]) -> int:
    """The episode budget train.py gets: the last ``--rollout-max-response-len`` after ``--`` wins."""
    budget = max_response_len
    for index, token in enumerate(extra_train_args):
        if token == "--rollout-max-response-len" and index + 1 < len(extra_train_args):
            budget = int(extra_train_args[index + 1])
        elif token.startswith("--rollout-max-response-len="):
            budget = int(token.partition("=")[2])
    return budget


def check_rollout_config(settings: LaunchSettings, note: Callable[[str], None]) -> None:
    """The package's own validator on ROLLOUT_CONFIG (a misspelled key stops the launch, not the job an
    hour later), with DAPO's overlong buffer checked against the episode budget; math-verify present
    when the reward uses it (without it the reward silently falls back to string and number checks).

    Raises:
        LaunchError: in one line.
    """
    from strands_slime import config as rollout_config

    try:
        budget = response_budget(settings.max_response_len, settings.extra_train_args)
    except ValueError:
        raise LaunchError("--rollout-max-response-len after -- must be an integer") from None
    output, errors = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(errors):
        status = rollout_config.main([settings.rollout_config, "--max-response-len", str(budget)])
    if status != 0:
        verdict = errors.getvalue().strip().splitlines() or ["invalid"]
        raise LaunchError(f"ROLLOUT_CONFIG: {verdict[-1].removeprefix('error: ')}")
    note(output.getvalue().strip())
    if not rollout_config.load_config(settings.rollout_config).reward.math_verify:
        return
    # A real run imports it (a broken install fails too); a dry run only looks for it (sympy is slow).
    try:
        if settings.dry_run:
            missing = importlib.util.find_spec("math_verify") is None
        else:
            importlib.import_module("math_verify")
            missing = False
    except Exception:
        missing = True
    if missing:
        problem = (
            "ROLLOUT_CONFIG enables reward.math_verify but the math-verify package is not installed on this "
            "node: pip install 'math-verify>=0.7' (or set math_verify: false)"
        )
        if not settings.dry_run:
            raise LaunchError(problem)
        note(f"note (dry run, not fatal): {problem}")


def check_hf_checkpoint(check_script: Path, hf_checkpoint: str, model_args: Sequence[str]) -> None:
    """The Hugging Face checkpoint's config.json matches the Megatron model flags (the check names each
    mismatch on stderr).

    Raises:
        LaunchError: it does not.
    """
    result = subprocess.run(
        [sys.executable, str(check_script), hf_checkpoint, "--", *model_args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    sys.stderr.write(result.stderr)
    if result.returncode != 0:
        raise LaunchError("HF_CHECKPOINT does not hold Qwen3-8B")


def model_args(model_file: Path) -> list[str]:
    """``MODEL_ARGS`` of a bash model file (``configs/qwen3_8b_model.sh``, which the converter sources too)."""
    result = subprocess.run(
        ["bash", "-c", 'source "$1" && printf "%s\\0" "${MODEL_ARGS[@]}"', "_", str(model_file)],
        capture_output=True,
        check=False,
        timeout=30,
    )
    if result.returncode != 0:
        raise LaunchError(f"cannot read MODEL_ARGS from {model_file}: {result.stderr.decode().strip()}")
    return [token.decode() for token in result.stdout.split(b"\0")[:-1]]
