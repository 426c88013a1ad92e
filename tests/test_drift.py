"""Drift audit: BPE round-trip and template re-render drift are found, clean trajectories pass."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import noncanonical_reply

from strands_slime.cli import RolloutOptions, run_rollout
from strands_slime.drift import audit, audit_trajectory
from strands_slime.provider.chat import ChatTemplater

pytestmark = pytest.mark.integration

IM_END = 151645


def trajectory(
    templater: ChatTemplater, outputs: list[list[int]], tool_text: str
) -> tuple[list[int], list[int]]:
    ids = templater.encode(templater.initial_prompt_text([{"role": "user", "content": "q"}], None, None))
    mask = [0] * len(ids)
    for i, out in enumerate(outputs):
        ids += out
        mask += [1] * len(out)
        if i < len(outputs) - 1:
            delta = templater.encode(
                templater.continuation_text([{"role": "tool", "content": tool_text}], out[-1])
            )
            ids += delta
            mask += [0] * len(delta)
    return ids, mask


def test_canonical_outputs_have_no_bpe_drift(qwen3_tokenizer: Any) -> None:
    templater = ChatTemplater(qwen3_tokenizer)
    outputs = [templater.encode("<think>\nok\n</think>\n\nHello world") + [IM_END]]
    ids, mask = trajectory(templater, outputs, "x")
    drift = audit_trajectory(templater, ids, mask, prompt_length=0)
    assert drift.output_segments == 1 and drift.bpe_segments == 0 and drift.bpe_tokens == 0


def test_non_canonical_split_is_bpe_drift(qwen3_tokenizer: Any) -> None:
    templater = ChatTemplater(qwen3_tokenizer)
    hello = templater.encode("Hel") + templater.encode("lo") + templater.encode(" world") + [IM_END]
    assert templater.decode(hello[:-1]) == "Hello world"
    ids, mask = trajectory(templater, [hello], "x")
    drift = audit_trajectory(templater, ids, mask, prompt_length=0)
    assert drift.bpe_segments == 1 and drift.bpe_tokens == 2
    assert drift.examples[0]["sampled"].startswith("Hel|lo")


def test_reformatted_tool_call_is_template_drift(qwen3_tokenizer: Any) -> None:
    templater = ChatTemplater(qwen3_tokenizer)
    compact = '<think>\nrun\n</think>\n\n<tool_call>\n{"name":"f","arguments":{"code":"1"}}\n</tool_call>'
    first = templater.encode(compact) + [IM_END]
    final = templater.encode("<think>\ndone\n</think>\n\nAnswer: 1") + [IM_END]
    ids, mask = trajectory(templater, [first, final], "1")
    transcript = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "reasoning_content": "run",
         "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"code": "1"}}}]},
        {"role": "tool", "content": "1"},
        {"role": "assistant", "content": "Answer: 1", "reasoning_content": "done"},
    ]  # fmt: skip
    drift = audit_trajectory(templater, ids, mask, transcript, prompt_length=0)
    assert drift.bpe_segments == 0
    assert drift.template_tokens > 0, 'the template re-serialises the call as {"name": "f", ...}'
    assert any(e["kind"] == "template re-render" for e in drift.examples)


async def test_audit_over_a_rollout(tmp_path: Path) -> None:
    from strands_slime.provider.tokenizer import load_tokenizer

    script = {
        "rules": [
            {
                "match": "sum of the first 100",
                "replies": [noncanonical_reply(load_tokenizer(), "<think>\nadd\n</think>\n\nThe sum is 5050.\n\nAnswer: \\boxed{5050}")],
            },
            {"match": None, "replies": ["<think>\nhm\n</think>\n\nAnswer: \\boxed{1}"]},
        ]
    }  # fmt: skip
    script_path = tmp_path / "script.json"
    script_path.write_text(json.dumps(script))
    config = tmp_path / "config.yaml"
    config.write_text("strands_slime:\n  tools: []\n")
    options = RolloutOptions(
        data=Path(__file__).resolve().parents[1] / "strands_slime" / "data" / "demo_problems.jsonl",
        out=tmp_path,
        script=script_path,
        config=config,
        keep_transcript=True,
        quiet=True,
    )
    await run_rollout(options)
    records = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert all("transcript" in r["metadata"] for r in records)
    report = audit(ChatTemplater(load_tokenizer()), records)
    assert report.trajectories == 5 and report.bpe_trajectories == 1
    assert "BPE round trip" in report.render_markdown()


@pytest.mark.slow  # 12 s
def test_drift_command_on_saved_samples(tmp_path: Path, qwen3_tokenizer: Any) -> None:
    templater = ChatTemplater(qwen3_tokenizer)
    hello = templater.encode("Hel") + templater.encode("lo") + [IM_END]
    ids, mask = trajectory(templater, [hello], "x")
    prompt_len = mask.index(1)
    record = {
        "tokens": ids,
        "loss_mask": mask[prompt_len:],
        "response_length": len(ids) - prompt_len,
        "metadata": {},
    }
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps(record) + "\n")
    out = tmp_path / "report"
    result = subprocess.run(
        [sys.executable, "-m", "strands_slime.cli", "drift", "--samples", str(samples), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "1 of 1" in result.stdout
    assert json.loads((out / "drift.json").read_text())["bpe_segments"] == 1


def test_samples_without_transcripts_say_what_was_not_checked(qwen3_tokenizer: Any) -> None:
    templater = ChatTemplater(qwen3_tokenizer)
    ids, mask = trajectory(templater, [templater.encode("Hello") + [IM_END]], "x")
    prompt_len = mask.index(1)
    record = {"tokens": ids, "loss_mask": mask[prompt_len:], "response_length": len(ids) - prompt_len}
    report = audit(templater, [record] * 3)
    text = report.render_markdown()
    assert report.transcripts == 0 and "not checked (no transcripts)" in text
    assert "re-render | 0 of" not in text and "--keep-transcript" in text
    assert text.startswith("Checked 3 trajectories: the BPE round trip of their 3 model output segments")
    assert audit(templater, []).render_markdown() == "Nothing checked: no trajectories."


def test_readme_rollout_then_drift(tmp_path: Path, capsys: Any) -> None:
    """The README's example (rollout --keep-transcript, then drift --samples --tokenizer), on the
    embedded dev server instead of a GPU server."""
    from strands_slime.cli import main

    demo = Path(__file__).resolve().parents[1] / "strands_slime" / "data" / "demo_problems.jsonl"
    run = tmp_path / "aime"
    assert main(["rollout", "--data", str(demo), "--n-samples", "2", "--tokenizer", "qwen3", "--eval"]
                + ["--keep-transcript", "--out", str(run), "--quiet"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["drift", "--samples", str(run / "samples.jsonl"), "--tokenizer", "qwen3"]
                + ["--out", str(tmp_path / "drift")]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "Checked 10 trajectories" in out and "the template re-render on the 10 with a transcript" in out
    assert json.loads((tmp_path / "drift" / "drift.json").read_text())["transcripts"] == 10
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert main(["drift", "--samples", str(empty), "--out", str(tmp_path / "drift2")]) == 2
    assert capsys.readouterr().err == f"error: {empty} has no samples\n"
    foreign = tmp_path / "foreign.jsonl"
    record = json.loads((run / "samples.jsonl").read_text().splitlines()[0])
    foreign.write_text(json.dumps(record) + "\n" + json.dumps({**record, "metadata": "transcript"}) + "\n")
    assert main(["drift", "--samples", str(foreign), "--out", str(tmp_path / "drift3")]) == 2
    (error,) = capsys.readouterr().err.splitlines()
    assert re.match(r"error: .*foreign\.jsonl: trajectory 1: sample\.metadata must be a mapping", error)
