"""``rollout --wandb``: an offline rollout as one W&B run.

The run is started before the rollout, so a missing package, login or network fails in a second with
one line instead of after the episodes. At the end (an interrupted or stopped run too) it gets the
summary's numbers, the settings, a table with one row per sample and the HTML report as an artifact,
and finishes with the rollout's exit status. ``WANDB_MODE=offline`` logs into ``OUT/wandb``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from strands_slime.rollout.run_files import SUMMARY_JSON, SUMMARY_MD, SampleLines
from strands_slime.rollout.run_summary import sample_overview

TABLE_TEXT_CHARS = 2000
"""Prompt and final-answer text per table cell (W&B shows long cells folded anyway)."""
TABLE_COLUMNS = (
    "index",
    "group",
    "sample",
    "status",
    "reward",
    "correct",
    "label",
    "prediction",
    "failure",
    "turns",
    "tool_calls",
    "model_tokens",
    "prompt",
    "final_text",
)


class WandbError(ValueError):
    """wandb is missing or cannot start a run (shown as one ``error:`` line before the rollout)."""


def start_run(out: Path, project: str, name: str | None) -> Any:
    """Start the W&B run of a rollout writing into ``out`` (created for W&B's files).

    Raises:
        WandbError: wandb is not installed, or W&B cannot start a run (no login, no network online).
    """
    try:
        import wandb
    except ImportError as exc:
        raise WandbError("--wandb needs wandb: pip install 'strands-slime[wandb]'") from exc
    out.mkdir(parents=True, exist_ok=True)
    try:
        return wandb.init(project=project, name=name, dir=str(out), job_type="rollout")
    except Exception as exc:  # no API key, no network in online mode, a bad project name, ...
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise WandbError(
            f"--wandb: W&B cannot start a run ({detail}); `wandb login`, or WANDB_MODE=offline to log locally"
        ) from exc


def flat_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """Numeric summary values as ``section/key``; zeros stay (a missing key is a gap in W&B's charts)."""
    flat: dict[str, float] = {}
    for section in ("evaluation", "evaluation_without_failures", "agent", "throughput"):
        for key, value in (summary.get(section) or {}).items():
            if isinstance(value, (int, float)):  # a bool is an int: logged as 0/1
                flat[f"{section}/{key}"] = float(value)
    flat["failures/failed"] = float(summary["failures"]["failed"])
    flat["failures/rate"] = float(summary["failures"]["rate"])
    return flat


def _table_rows(samples: Path) -> list[list[Any]]:
    rows = []
    for _number, record in SampleLines(samples):
        overview = sample_overview(record)
        metadata = record.get("metadata") or {}
        overview.update(
            turns=metadata.get("turns"),
            tool_calls=metadata.get("tool_calls"),
            model_tokens=sum(record.get("loss_mask") or []),
            prompt=overview["prompt"][:TABLE_TEXT_CHARS],
            final_text=overview["final_text"][-TABLE_TEXT_CHARS:],
        )
        rows.append([overview[column] for column in TABLE_COLUMNS])
    return rows


def log_run(run: Any, summary: dict[str, Any], out: Path, report: Path | None, exit_code: int) -> None:
    """Log the rollout's results into ``run`` and finish it with ``exit_code`` (W&B marks a run that
    did not exit 0 as failed)."""
    import wandb

    try:
        if summary.get("saved"):
            run.config.update(
                {
                    "sampling_params": summary["sampling_params"],
                    "options": summary["options"],
                    "rollout_config": summary["config"],
                    "versions": summary["versions"],
                },
                allow_val_change=True,
            )
            metrics = flat_metrics(summary)
            table = wandb.Table(columns=list(TABLE_COLUMNS), data=_table_rows(out / "samples.jsonl"))
            run.log({**metrics, "samples": table})
            run.summary.update(metrics)
            artifact = wandb.Artifact(f"rollout-report-{run.id}", type="rollout-report")
            for path in (report, out / SUMMARY_JSON, out / SUMMARY_MD):
                if path is not None and path.is_file():
                    artifact.add_file(str(path))
            run.log_artifact(artifact)
        run.summary["interrupted"] = summary.get("interrupted")
        run.summary["stopped"] = summary.get("stopped")
    finally:
        run.finish(exit_code=exit_code)
