"""What an offline rollout reports when it ends: ``summary.json``, ``summary.md`` and the terminal lines.

Accuracy is over every sample of the plan, failed ones counted as wrong (``evaluation``): a run where
most samples failed does not read as a good model. The accuracy of the samples that did not fail is
kept next to it (``evaluation_without_failures``). Throughput is this run's own: samples kept from an
earlier run (``--resume``) are in the totals, not in the rates.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TextIO

from strands_slime.episode_metadata import EpisodeMetadata
from strands_slime.rollout.run_files import LOG, SAMPLES, SUMMARY_JSON, SUMMARY_MD
from strands_slime.rollout.run_monitor import failed, failure_reason

SHOWN_FAILURE_REASONS = 10
"""Distinct failure reasons printed and kept in the summary (the log file has every failure)."""
_NOT_SETTINGS = ("quiet", "resume", "overwrite")


def prompt_text(prompt: Any) -> str:
    """A prompt as a person reads it: the string, or a chat prompt's last user message."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        for message in reversed(prompt):
            if isinstance(message, Mapping) and message.get("role") == "user":
                content = message.get("content", "")
                if isinstance(content, str):
                    return content
                return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return json.dumps(prompt, ensure_ascii=False, default=str)


def sample_overview(record: Mapping[str, Any]) -> dict[str, Any]:
    """What a person scans a run's samples by (the viewer's list, the W&B table): status, reward,
    correctness (a failed sample counts as wrong, as in the summary), label, prediction, the failure
    reason, the prompt and the final answer text.

    Raises:
        TypeError: ``metadata`` is neither None nor a mapping.
    """
    from strands_slime.reward.eval_metrics import record_from_sample

    episode = EpisodeMetadata.from_metadata(record.get("metadata"))
    is_failed = failed(record)
    details = episode.reward_details
    correct = False if is_failed else record_from_sample(SimpleNamespace(**record))["correct"]
    reward = record.get("reward")
    return {
        "index": record.get("index"),
        "group": record.get("group_index"),
        "sample": record.get("sample_index"),
        "status": str(record.get("status") or "unknown"),
        "failed": is_failed,
        "reward": reward if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None,
        "correct": correct,
        "label": record.get("label"),
        "prediction": details.get("pred") if isinstance(details, Mapping) else None,
        "failure": failure_reason(record) if is_failed else None,
        "prompt": prompt_text(record.get("prompt")),
        "final_text": episode.final_text or "",
    }


def failure_reasons(records: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """Every distinct reason of the failed samples with its count, the most frequent first."""
    return Counter(failure_reason(record) for record in records if failed(record)).most_common()


def build_summary(
    options: Any,
    rows: list[dict[str, Any]],
    records: list[dict[str, Any]],
    ran: list[dict[str, Any]],
    wall: float,
    params: dict[str, Any],
    config: Any,
    tokenizer: str,
    versions: dict[str, str | None],
) -> dict[str, Any]:
    """The run's summary: evaluation (accuracy, pass@k), agent metrics, failures, throughput and settings.

    Args:
        rows: the dataset rows (for the expected sample count).
        records: every record of ``samples.jsonl`` (kept ones of a resumed run included).
        ran: the records this run wrote (throughput is theirs).
        wall: seconds this run's episodes took.
    """
    from strands_slime.reward.eval_metrics import record_from_sample, summarize
    from strands_slime.rollout.metrics import compute_rollout_metrics
    from strands_slime.rollout.slime_compat import Sample

    samples = [Sample.from_dict(record) for record in records]
    eval_records = [record_from_sample(s) for s in samples]
    failures = [failed(record) for record in records]
    for eval_record, is_failed in zip(eval_records, failures, strict=True):
        if is_failed:  # lost to the infrastructure: not a correct answer
            eval_record["status"], eval_record["correct"] = "failed", False
    evaluation = summarize(eval_records, exclude_statuses=("aborted",))
    without_failures = summarize(
        [r for r, is_failed in zip(eval_records, failures, strict=True) if not is_failed],
        exclude_statuses=("aborted",),
    )
    model_tokens = sum(sum(r.get("loss_mask") or []) for r in ran)
    count_failed = sum(failures)
    reasons = failure_reasons(records)
    settings = {key: value for key, value in asdict(options).items() if key not in _NOT_SETTINGS}
    return {
        "data": str(options.data),
        "samples": len(records),
        "expected_samples": len(rows) * options.n_samples,
        "prompts": len(rows),
        "n_samples_per_prompt": options.n_samples,
        "server": options.base_url or f"embedded dev server ({options.backend})",
        "failures": {
            "failed": count_failed,
            "rate": count_failed / len(records) if records else 0.0,
            "max_rate": options.max_failure_rate,
            "distinct_reasons": len(reasons),
            "top_reasons": [
                {"reason": reason, "count": count} for reason, count in reasons[:SHOWN_FAILURE_REASONS]
            ],
        },
        "evaluation": evaluation.as_dict(),
        "evaluation_without_failures": without_failures.as_dict() if count_failed else None,
        "agent": compute_rollout_metrics(samples),
        "throughput": {
            "samples_this_run": len(ran),
            "wall_seconds": round(wall, 3),
            "samples_per_second": round(len(ran) / wall, 3) if wall else None,
            "model_tokens_per_second": round(model_tokens / wall, 1) if wall else None,
            "model_tokens": model_tokens,
            "total_tokens": sum(len(r.get("tokens") or []) for r in ran),
        },
        "sampling_params": params,
        "options": json.loads(json.dumps(settings, default=str)),
        "config": config.model_dump(mode="json") if hasattr(config, "model_dump") else None,
        "tokenizer": tokenizer,
        "versions": versions,
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def write_summary(out: Path, summary: dict[str, Any]) -> None:
    """Write ``summary.json`` and ``summary.md`` into ``out``."""
    (out / SUMMARY_JSON).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (out / SUMMARY_MD).write_text(summary_markdown(summary), encoding="utf-8")


def _how_it_ended(summary: dict[str, Any]) -> str | None:
    finished = f"{summary['samples']} of {summary['expected_samples']} samples finished"
    if summary.get("interrupted"):
        return f"Interrupted by {summary['interrupted']}: {finished}."
    if summary.get("stopped"):
        return f"Stopped early: {summary['stopped']}; {finished}."
    return None


def summary_markdown(summary: dict[str, Any]) -> str:
    """``summary.md``: the summary's evaluation, agent, throughput, failure and version tables."""
    agent = summary["agent"]
    throughput = summary["throughput"]
    lines = [
        f"# Rollout summary: {summary['data']}",
        "",
        f"{summary['samples']} samples ({summary['prompts']} prompts x {summary['n_samples_per_prompt']}) "
        f"on {summary['server']}, {summary['date']}, {summary['machine']}.",
        "",
    ]
    ended = _how_it_ended(summary)
    if ended:
        lines += [ended, ""]
    sections = [("evaluation", summary["evaluation"])]
    if summary.get("evaluation_without_failures"):
        lines += ["Failed samples count as wrong in `evaluation`; `without failures` leaves them out.", ""]
        sections.append(("evaluation without failures", summary["evaluation_without_failures"]))
    for title, evaluation in sections:
        lines += [f"| {title} | value |", "|---|---|"]
        for key, value in evaluation.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                lines.append(
                    f"| {key} | {value:.4f} |" if isinstance(value, float) else f"| {key} | {value} |"
                )
        lines.append("")
    lines += ["| agent | value |", "|---|---|"]
    for key in sorted(agent):
        value = agent[key]
        lines.append(f"| {key} | {value:.4f} |" if isinstance(value, float) else f"| {key} | {value} |")
    lines += ["", "| throughput | value |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in throughput.items()]
    failures = summary["failures"]
    if failures["failed"]:
        lines += ["", "| failure reason | samples |", "|---|---|"]
        lines += [f"| {item['reason']} | {item['count']} |" for item in failures["top_reasons"]]
        hidden = failures["distinct_reasons"] - len(failures["top_reasons"])
        if hidden > 0:
            lines.append(f"| {hidden} more reasons (see {LOG}) | |")
    lines += ["", "| version | |", "|---|---|"]
    lines += [f"| {name} | {version or 'not installed'} |" for name, version in summary["versions"].items()]
    return "\n".join(lines) + "\n"


def print_summary(summary: dict[str, Any], out: Path, stream: TextIO) -> None:
    """A few lines for the terminal (accuracy, statuses, tool use, throughput, failures, file paths)."""
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
        without = summary.get("evaluation_without_failures")
        note = ""
        if without:
            kept = without["num_samples"]
            finished_accuracy = without.get("accuracy")
            shown = f"{finished_accuracy:.3f}" if finished_accuracy is not None else "–"
            note = f" (failed samples count as wrong; {shown} over the {kept} that did not fail)"
        say(f"accuracy: {accuracy:.3f}{note}  {passes}".rstrip())
    statuses = "  ".join(f"{k.split('/', 1)[1]}={v:.2f}" for k, v in agent.items() if k.startswith("status/"))
    say(f"statuses: {statuses}")
    say(
        f"tool calls/episode: {agent.get('tool_calls/mean', 0):.2f}  parse errors/episode: "
        f"{agent.get('parse_errors/mean', 0):.2f}  sandbox s/episode: {agent.get('sandbox_seconds/mean', 0):.3f}"
    )
    say(
        f"this run: {throughput['samples_this_run']} samples in {throughput['wall_seconds']} s  "
        f"samples/s: {throughput['samples_per_second']}  model tokens/s: {throughput['model_tokens_per_second']}"
    )
    print_failures(summary, out, stream)
    say(f"results: {out / SAMPLES}\nsummary: {out / SUMMARY_JSON} and {out / SUMMARY_MD}")


def print_failures(summary: dict[str, Any], out: Path, stream: TextIO) -> None:
    """The failed-sample count and one line per distinct reason; nothing when no sample failed."""
    failures = summary["failures"]
    if not failures["failed"]:
        return
    count = failures["distinct_reasons"]
    print(
        f"failed: {failures['failed']} of {summary['samples']} samples ({failures['rate']:.1%}), "
        f"{count} reason{'s' if count != 1 else ''}:",
        file=stream,
    )
    for item in failures["top_reasons"]:
        print(f"  {item['count']:>6}  {item['reason']}", file=stream)
    hidden = count - len(failures["top_reasons"])
    if hidden > 0:
        print(f"  and {hidden} more reasons", file=stream)
    print(f"  details: {out / LOG}", file=stream)
