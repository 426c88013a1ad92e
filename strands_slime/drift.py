"""Drift audit: what a text-based pipeline would have changed in token-in/token-out trajectories.

Two ways a text pipeline (OpenAI-style chat API, then re-tokenize for training) breaks a trajectory:

* **BPE round trip**: decoding the sampled ids and encoding the text again gives other ids (the model
  sampled a non-canonical split, e.g. ``"Hel"+"lo"`` instead of ``"Hello"``).
* **Template re-render**: rendering the parsed conversation (content, reasoning, structured tool
  calls, tool results) with the chat template gives other text than what the model saw and produced
  (tool-call JSON re-serialised, whitespace around ``<think>`` normalised, reasoning stripped from
  earlier turns, ...), hence other ids.

Either way the trainer would compute logprobs for tokens the sampler never produced: off-policy data.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from strands_slime.episode_metadata import EpisodeMetadata
from strands_slime.provider.chat import ChatTemplater
from strands_slime.provider.trajectory import mask_runs


@dataclass
class TrajectoryDrift:
    """What the text pipeline would change in one trajectory (summed into a :class:`DriftReport`).

    Attributes:
        output_segments: model output segments (loss-mask runs of 1) checked.
        bpe_segments: segments whose decode-then-encode gives other ids.
        bpe_tokens: tokens those segments change.
        template_tokens: tokens a template re-render changes (0 without a transcript).
        compared_tokens: tokens the re-render was compared on.
        examples: a few ``{"kind", "sampled", "text_pipeline"}`` differences.
    """

    output_segments: int = 0
    bpe_segments: int = 0
    bpe_tokens: int = 0
    template_tokens: int = 0
    compared_tokens: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class DriftReport:
    """Counts over a set of trajectories, with a few concrete examples."""

    trajectories: int = 0
    transcripts: int = 0
    """Trajectories with a transcript: only those get the template re-render check."""
    output_segments: int = 0
    bpe_segments: int = 0
    bpe_trajectories: int = 0
    bpe_tokens: int = 0
    template_trajectories: int = 0
    template_tokens: int = 0
    compared_tokens: int = 0
    model_tokens: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The report as plain JSON types (``drift.json``)."""
        return asdict(self)

    def render_markdown(self) -> str:
        """``drift.md``: what was checked, a table of changed trajectories and tokens, the examples."""

        def pct(part: int, whole: int) -> str:
            return f"{100.0 * part / whole:.1f}%" if whole else "n/a"

        if not self.trajectories:
            return "Nothing checked: no trajectories."
        if self.transcripts:
            rerender = f"the template re-render on the {self.transcripts} with a transcript"
            template_rows = [
                f"| trajectories changed by a template re-render | {self.template_trajectories} of {self.transcripts} | "
                f"{pct(self.template_trajectories, self.transcripts)} |",
                f"| tokens changed by re-render + re-tokenize | {self.template_tokens} of {self.compared_tokens} | "
                f"{pct(self.template_tokens, self.compared_tokens)} |",
            ]
        else:
            rerender = (
                "not the template re-render: no trajectory has a transcript (roll out with --keep-transcript)"
            )
            template_rows = [
                "| trajectories changed by a template re-render | not checked (no transcripts) | n/a |",
                "| tokens changed by re-render + re-tokenize | not checked (no transcripts) | n/a |",
            ]
        lines = [
            f"Checked {self.trajectories} trajectories: the BPE round trip of their {self.output_segments} "
            f"model output segments ({self.model_tokens} tokens); {rerender}.",
            "",
            "| what a text pipeline breaks | count | share |",
            "|---|---|---|",
            f"| trajectories with BPE round-trip drift | {self.bpe_trajectories} of {self.trajectories} | "
            f"{pct(self.bpe_trajectories, self.trajectories)} |",
            f"| model output segments that re-tokenize differently | {self.bpe_segments} of {self.output_segments} | "
            f"{pct(self.bpe_segments, self.output_segments)} |",
            f"| tokens changed by the BPE round trip | {self.bpe_tokens} of {self.model_tokens} model tokens | "
            f"{pct(self.bpe_tokens, self.model_tokens)} |",
            *template_rows,
        ]
        for example in self.examples:
            lines.append("")
            lines.append(f"**{example['kind']}** (trajectory {example['trajectory']}):")
            lines.append(f"- sampled:     `{example['sampled']!r}`")
            lines.append(f"- text path:   `{example['text_pipeline']!r}`")
        return "\n".join(lines)


def _changed(a: Sequence[int], b: Sequence[int]) -> int:
    """Tokens that differ between two id lists (replaced, inserted or deleted)."""
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal")


def _first_difference(templater: ChatTemplater, a: Sequence[int], b: Sequence[int]) -> tuple[str, str]:
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            pieces_a = [templater.decode([t]) for t in a[max(0, i1 - 2) : i2 + 2]]
            pieces_b = [templater.decode([t]) for t in b[max(0, j1 - 2) : j2 + 2]]
            return "|".join(pieces_a), "|".join(pieces_b)
    return "", ""


def audit_trajectory(
    templater: ChatTemplater,
    token_ids: Sequence[int],
    loss_mask: Sequence[int],
    transcript: Sequence[Mapping[str, Any]] | None = None,
    *,
    prompt_length: int | None = None,
    max_examples: int = 2,
) -> TrajectoryDrift:
    """Audit one trajectory. ``loss_mask`` covers all of ``token_ids`` (prompt included) or only the
    response (then ``prompt_length`` says where it starts). ``transcript`` enables the re-render check."""
    drift = TrajectoryDrift()
    if prompt_length is None:
        prompt_length = len(token_ids) - len(loss_mask)
    full_mask = [0] * prompt_length + list(loss_mask)
    for value, start, end in mask_runs(full_mask):
        if value != 1:
            continue
        sampled = list(token_ids[start:end])
        stop = sampled[-1] if sampled and sampled[-1] in templater.stop_token_ids else None
        body = sampled[:-1] if stop is not None else sampled
        again = templater.encode(templater.decode(body)) + ([stop] if stop is not None else [])
        drift.output_segments += 1
        if again != sampled:
            drift.bpe_segments += 1
            drift.bpe_tokens += _changed(sampled, again)
            if len(drift.examples) < max_examples:
                a, b = _first_difference(templater, sampled, again)
                drift.examples.append({"kind": "BPE round trip", "sampled": a, "text_pipeline": b})
    if transcript:
        drift.template_tokens, drift.compared_tokens, example = _template_drift(
            templater, token_ids, prompt_length, transcript
        )
        if example and len(drift.examples) < max_examples + 1:
            drift.examples.append(example)
    return drift


def _template_drift(
    templater: ChatTemplater,
    token_ids: Sequence[int],
    prompt_length: int,
    transcript: Sequence[Mapping[str, Any]],
) -> tuple[int, int, dict[str, Any] | None]:
    """Compare everything after the first prompt with a re-render of the parsed conversation.

    The first prompt (system, tools, question) is rendered the same way by both pipelines, so the
    comparison starts after it; tools need not be known."""
    messages = [dict(m) for m in transcript]
    first_assistant = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    head = templater.encode(templater.render(messages[:first_assistant], add_generation_prompt=True))
    whole = templater.encode(templater.render(messages, add_generation_prompt=False))
    ours = list(token_ids[prompt_length:])
    theirs = whole[len(head) :]
    # the template closes the last turn with "<|im_end|>\n"; the sampler stopped at <|im_end|>
    stops = templater.stop_token_ids
    if ours and ours[-1] in stops and len(theirs) >= 2 and theirs[-2] in stops:
        if templater.decode(theirs[-1:]).strip() == "":
            theirs = theirs[:-1]
    changed = _changed(ours, theirs)
    example = None
    if changed:
        a, b = _first_difference(templater, ours, theirs)
        example = {"kind": "template re-render", "sampled": a, "text_pipeline": b}
    return changed, len(ours), example


def audit(
    templater: ChatTemplater,
    trajectories: Iterable[Mapping[str, Any]],
    *,
    max_examples: int = 6,
) -> DriftReport:
    """Audit records with ``tokens``, ``loss_mask``, ``response_length`` and optionally the episode
    metadata's ``transcript`` (as written by ``strands-slime rollout --keep-transcript``).

    Raises:
        ValueError: a record's ``metadata`` is not a mapping (the trajectory's position is named).
    """
    report = DriftReport()
    for index, record in enumerate(trajectories):
        tokens = record["tokens"]
        mask = record.get("loss_mask") or []
        response_length = int(record.get("response_length") or len(mask))
        try:
            transcript = EpisodeMetadata.from_metadata(record.get("metadata")).transcript
        except TypeError as exc:
            raise ValueError(f"trajectory {index}: {exc}") from exc
        drift = audit_trajectory(
            templater, tokens, mask, transcript, prompt_length=len(tokens) - response_length
        )
        report.trajectories += 1
        report.transcripts += 1 if transcript else 0
        report.output_segments += drift.output_segments
        report.bpe_segments += drift.bpe_segments
        report.bpe_tokens += drift.bpe_tokens
        report.bpe_trajectories += 1 if drift.bpe_segments else 0
        report.template_tokens += drift.template_tokens
        report.template_trajectories += 1 if drift.template_tokens else 0
        report.compared_tokens += drift.compared_tokens
        report.model_tokens += sum(mask)
        for example in drift.examples:
            if len(report.examples) < max_examples:
                report.examples.append({"trajectory": index, **example})
    return report
