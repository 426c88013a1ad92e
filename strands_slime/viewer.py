"""``strands-slime view``: one self-contained HTML report of a rollout's trajectories.

The page needs no server and no network: the template (``templates/viewer.html``) gets the run's data
embedded. List rows are plain JSON; the heavy part (token ids, classes, logprobs, metadata) is
gzip-compressed in chunks the browser inflates only when one of their samples is opened, so 10,000
samples open at once. Token text comes from a table of the ids that occur, decoded once here. What
the page shows: docs/rollout.md, "Trajectory viewer".
"""

from __future__ import annotations

import base64
import gzip
import itertools
import json
import logging
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from strands_slime.episode_metadata import EpisodeMetadata
from strands_slime.rollout.run_files import AGENT_SAMPLES, SampleLines, SamplesFileError
from strands_slime.rollout.run_summary import sample_overview

TEMPLATE = "viewer.html"
DATA_MARKER = "/*__REPORT_DATA__*/"
CHUNK_SIZE = 200
"""Samples per compressed chunk: opening one sample inflates only its chunk."""

KIND_PROMPT, KIND_MODEL, KIND_TOOL, KIND_PLACEHOLDER = 0, 1, 2, 3
"""Token classes: the first prompt, model output (loss mask 1), later non-model text (mask 0), and the
untrained token that stands for the response of a failed or aborted sample that produced none."""
PROMPT_CHARS = 1000
"""Prompt text per list row (shown cut in the list, searched in full up to this)."""
FINAL_TEXT_CHARS = 300
"""The end of the final answer text per row, for search (where the answer is)."""

logger = logging.getLogger(__name__)


class ReportError(ValueError):
    """The input cannot be turned into a report (missing file, bad line, inconsistent lengths)."""


def find_samples(source: Path) -> tuple[Path, dict[str, Any] | None]:
    """The ``samples.jsonl`` of ``source`` (the file, or a run directory holding it) and the run's
    ``summary.json`` when there is a readable one (a broken summary is skipped, not fatal).

    Raises:
        ReportError: there is no such file, or the directory has no ``samples.jsonl``.
    """
    path = source / "samples.jsonl" if source.is_dir() else source
    if not path.is_file():
        where = f"{source} has no samples.jsonl" if source.is_dir() else f"{source} does not exist"
        raise ReportError(f"{where} (pass a rollout's output directory or its samples.jsonl)")
    summary = None
    summary_path = path.parent / "summary.json"
    if summary_path.is_file():
        try:
            summary = json.loads(summary_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            summary = None  # the report does not need it; a broken summary must not block the view
    return path, summary


def iter_samples(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a ``samples.jsonl``, one at a time (10,000 samples never sit in memory as JSON).
    A torn last line (a run killed mid-write; ``--resume`` drops it too) is skipped with a note.

    Raises:
        ReportError: a line is not JSON or not a sample record (the line's number is named).
    """
    lines = SampleLines(path)
    try:
        for number, record in lines:
            if not isinstance(record.get("tokens"), list):
                raise ReportError(f"{path}:{number}: not a sample record (no 'tokens' list)")
            yield record
    except SamplesFileError as exc:
        raise ReportError(str(exc)) from exc
    if lines.torn:
        logger.warning(
            "note: the last line of %s was cut short (a killed run?) and is not in the report", path
        )


def token_classes(record: Mapping[str, Any]) -> tuple[list[int], int]:
    """Run-length token classes over all of ``tokens`` as ``[kind, length, kind, length, ...]``,
    and the prompt length. ``loss_mask`` covers the response (slime's layout). A failed or aborted
    sample without a model token has only the placeholder slime needs as its response.

    Raises:
        ReportError: ``loss_mask``, ``response_length`` and ``tokens`` disagree on the lengths.
    """
    tokens = record["tokens"]
    mask = list(record.get("loss_mask") or [])
    response_length = int(record.get("response_length") or len(mask))
    if not mask:
        mask = [0] * response_length
    if len(mask) != response_length or response_length > len(tokens):
        raise ReportError(
            f"sample {record.get('index')}: loss_mask has {len(mask)} entries, response_length is "
            f"{response_length}, tokens has {len(tokens)}"
        )
    prompt_length = len(tokens) - response_length
    runs: list[int] = []
    if prompt_length:
        runs += [KIND_PROMPT, prompt_length]
    ended_early = record.get("status") in ("failed", "aborted") or bool(record.get("remove_sample"))
    if ended_early and response_length and not any(mask):
        return [*runs, KIND_PLACEHOLDER, response_length], prompt_length
    for value in mask:
        kind = KIND_MODEL if value else KIND_TOOL
        if runs and runs[-2] == kind:
            runs[-1] += 1
        else:
            runs += [kind, 1]
    return runs, prompt_length


def _centi(logprobs: Iterable[Any]) -> list[int | None]:
    """Logprobs as integers in hundredths (enough for a heat map and a tooltip); NaN/None: None."""
    return [
        None
        if lp is None or lp != lp
        else (round(lp * 100) if -999.99 < lp < 1e9 else (-99_999 if lp < 0 else 0))
        for lp in logprobs
    ]


def _number(value: Any) -> float | None:
    """``value`` as a finite float, else None (a reward may be missing, a dict or NaN)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _episode(record: Mapping[str, Any]) -> EpisodeMetadata:
    """The sample's episode metadata as the record our generate and reward write.

    Raises:
        ReportError: ``metadata`` is not a JSON object.
    """
    try:
        return EpisodeMetadata.from_metadata(record.get("metadata"))
    except TypeError as exc:
        raise ReportError(f"sample {record.get('index')}: {exc}") from exc


def _metadata_number(record: Mapping[str, Any], name: str, value: Any) -> float:
    """A numeric metadata value for the list row; another generate function may store anything.

    Raises:
        ReportError: the value is not a finite number (the sample and the key are named).
    """
    number = _number(value)
    if number is None or isinstance(value, bool):
        raise ReportError(f"sample {record.get('index')}: metadata {name} is {value!r}, not a number")
    return number


def _count(record: Mapping[str, Any], name: str, value: Any) -> int:
    """A metadata count for the list row; None is an unset key (``to_metadata`` leaves None out): 0."""
    return 0 if value is None else int(_metadata_number(record, name, value))


def _row(
    position: int, record: Mapping[str, Any], runs: Sequence[int], episode: EpisodeMetadata
) -> dict[str, Any]:
    """The list row of one sample: what the page filters, searches, sorts and plots without inflating."""
    overview = sample_overview(record)
    model_tokens = sum(runs[i + 1] for i in range(0, len(runs), 2) if runs[i] == KIND_MODEL)
    latencies = episode.turn_seconds or []
    if not isinstance(latencies, list):
        raise ReportError(f"sample {record.get('index')}: metadata turn_seconds is {latencies!r}, not a list")
    return {
        "p": position,
        "i": record.get("index", position),
        "g": record.get("group_index"),
        "s": overview["status"],
        "r": _number(record.get("reward")),
        "c": overview["correct"],
        "n": len(record["tokens"]),
        "m": model_tokens,
        "tc": _count(record, "tool_calls", episode.tool_calls),
        "t": _count(record, "turns", episode.turns),
        "f": episode.finish_reason,
        "lat": [round(_metadata_number(record, "turn_seconds", x), 4) for x in latencies],
        "l": overview["label"],
        "pr": overview["prediction"],
        "x": overview["failure"],
        "pt": overview["prompt"][:PROMPT_CHARS],
        "ft": overview["final_text"][-FINAL_TEXT_CHARS:],
        "rm": bool(record.get("remove_sample")),
    }


def _heavy(record: Mapping[str, Any], runs: Sequence[int], episode: EpisodeMetadata) -> dict[str, Any]:
    """What opening a sample needs (tokens, classes, model logprobs, metadata), compressed in chunks."""
    mask = record.get("loss_mask") or []
    logprobs = record.get("rollout_log_probs") or []
    if len(logprobs) == len(mask):
        model_logprobs = _centi(itertools.compress(logprobs, mask))
    else:  # a run without logprobs: keep the tokens, show no heat
        model_logprobs = [None] * sum(1 for value in mask if value)
    metadata = dict(record.get("metadata") or {})
    if episode.transcript is not None:
        # the page does not show the transcript (often most of the record); from_metadata keeps the
        # stored object, so identity finds its key without spelling it a second time
        metadata = {key: value for key, value in metadata.items() if value is not episode.transcript}
    return {"tok": record["tokens"], "seg": list(runs), "lp": model_logprobs, "meta": metadata}


def _agent(record: Mapping[str, Any]) -> str | None:
    metadata = record.get("metadata")
    return metadata.get("agent") if isinstance(metadata, Mapping) else None


def _node(record: Mapping[str, Any], position: int) -> dict[str, Any]:
    """One segment in its episode's agent tree: agent, parent agent, segment number, the tool call
    that started it and where its sample is in the report."""
    metadata = record.get("metadata") or {}
    return {
        "a": metadata.get("agent"),
        "pa": metadata.get("parent_agent"),
        "sg": metadata.get("agent_segment"),
        "tc": metadata.get("parent_tool_call"),
        "p": position,
    }


def _tree_node(
    trees: dict[tuple[Any, Any], list[dict[str, Any]]], record: Mapping[str, Any], position: int
) -> None:
    if _agent(record) is not None:
        key = (record.get("group_index"), record.get("sample_index"))
        trees.setdefault(key, []).append(_node(record, position))


def _pack(value: Any) -> str:
    raw = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode("ascii")


def distinctive_prompts(prompts: Sequence[str]) -> list[str]:
    """Each prompt without the paragraph it shares with other prompts at its start or end (a dataset's
    instruction, its answer-format reminder), marked ``… ``/`` …``: in the list, rows show what tells
    them apart, not the same instruction again. A prompt that is nothing but shared text stays whole."""
    paragraphs = {text: [p for p in re.split(r"\n\s*\n", text) if p.strip()] for text in set(prompts)}
    heads = Counter(parts[0] for parts in paragraphs.values() if len(parts) > 1)
    tails = Counter(parts[-1] for parts in paragraphs.values() if len(parts) > 1)
    shown: dict[str, str] = {}
    for text, parts in paragraphs.items():
        start, end = 0, len(parts)
        if end - start > 1 and heads[parts[0]] > 1:
            start += 1
        if end - start > 1 and tails[parts[-1]] > 1:
            end -= 1
        if (start, end) == (0, len(parts)):
            shown[text] = text
            continue
        middle = "\n\n".join(parts[start:end])
        shown[text] = ("… " if start else "") + middle + (" …" if end < len(parts) else "")
    return [shown[text] for text in prompts]


def token_texts(tokenizer: Any, ids: Iterable[int]) -> dict[str, str]:
    """``{id: text}`` for every distinct id, special tokens included, decoded one id at a time."""
    unique = sorted(set(ids))
    texts = tokenizer.batch_decode(
        [[i] for i in unique], skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    return {str(i): text for i, text in zip(unique, texts, strict=True)}


def build_report(
    records: Iterable[Mapping[str, Any]],
    *,
    tokenizer: Any = None,
    summary: Mapping[str, Any] | None = None,
    title: str = "rollout",
    agent_records: Iterable[Mapping[str, Any]] = (),
) -> str:
    """The report's HTML text (see the module docstring). ``records`` is read once, one at a time:
    only the list rows and the compressed chunks are kept.

    Args:
        records: ``samples.jsonl`` records (``tokens``, ``loss_mask``, ``response_length``, ...).
        tokenizer: decodes the ids that occur; None shows ids.
        summary: the run's ``summary.json``, shown above the list.
        title: the page title.
        agent_records: ``agent_samples.jsonl`` records: the further samples of episodes with several
            agents (or fan-out segments); not in the list, reached from their episode's agent tree.

    Raises:
        ReportError: a record is inconsistent, its metadata is not the episode record's shape, or
            the packaged template lacks its data marker.
    """
    rows: list[dict[str, Any]] = []
    chunks: list[str] = []
    pending: list[dict[str, Any]] = []
    token_ids: set[int] = set()
    for position, record in enumerate(records):
        runs, _prompt_length = token_classes(record)
        episode = _episode(record)
        rows.append(_row(position, record, runs, episode))
        rows[-1]["si"] = record.get("sample_index")
        if _agent(record) is not None:
            rows[-1]["node"] = _node(record, position)
        pending.append(_heavy(record, runs, episode))
        token_ids.update(record["tokens"])
        if len(pending) == CHUNK_SIZE:
            chunks.append(_pack(pending))
            pending = []
    # an episode's agents as a tree: its main sample's node first, then its further samples' (their
    # heavy data follow the rows' in the chunks; their rows are not in the list)
    trees: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for row in rows:
        node = row.pop("node", None)
        if node is not None:
            trees.setdefault((row["g"], row["si"]), []).append(node)
    agent_rows: list[dict[str, Any]] = []
    for position, record in enumerate(agent_records, start=len(rows)):
        runs, _prompt_length = token_classes(record)
        episode = _episode(record)
        agent_rows.append(_row(position, record, runs, episode))
        agent_rows[-1]["si"] = record.get("sample_index")
        pending.append(_heavy(record, runs, episode))
        token_ids.update(record["tokens"])
        _tree_node(trees, record, position)
        if len(pending) == CHUNK_SIZE:
            chunks.append(_pack(pending))
            pending = []
    if pending:
        chunks.append(_pack(pending))
    for row in [*rows, *agent_rows]:
        tree = trees.get((row["g"], row.pop("si", None)))
        if tree is not None and len(tree) > 1:
            row["ag"] = tree
    for row, shown in zip(rows, distinctive_prompts([row["pt"] for row in rows]), strict=True):
        if shown != row["pt"]:
            row["ps"] = shown  # the list's prompt cell; its tooltip and the search keep the whole prompt
    data = {
        "title": title,
        "summary": dict(summary) if summary else None,
        "rows": rows,
        "agentRows": agent_rows,
        "chunkSize": CHUNK_SIZE,
        "chunks": chunks,
        "vocab": _pack(token_texts(tokenizer, token_ids)) if tokenizer is not None else None,
    }
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    # "<" occurs only inside JSON strings; escaped, no "</script>" or "<!--" can end the element early
    payload = payload.replace("<", "\\u003c")
    template = (resources.files("strands_slime") / "templates" / TEMPLATE).read_text(encoding="utf-8")
    if DATA_MARKER not in template:
        raise ReportError(f"the viewer template has no {DATA_MARKER} marker")
    head, tail = template.split(DATA_MARKER, 1)
    return head + payload + tail


def write_report(
    source: Path,
    output: Path | None = None,
    *,
    tokenizer: Any = None,
) -> Path:
    """Write the report for a run directory or ``samples.jsonl``; an earlier report is replaced only
    once the new one is complete.

    Args:
        source: a rollout's output directory or its ``samples.jsonl``.
        output: the HTML file; default ``report.html`` next to the samples.
        tokenizer: a loaded tokenizer, a path/name for :func:`strands_slime.provider.tokenizer.load_tokenizer`,
            or None to show token ids.

    Returns:
        The path written.

    Raises:
        ReportError: the samples cannot be read or are inconsistent (see :func:`build_report`).
        OSError: the output cannot be written (or a tokenizer directory read).
    """
    samples_path, summary = find_samples(source)
    if isinstance(tokenizer, str):
        from strands_slime.provider.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(tokenizer)
    output = output or samples_path.parent / "report.html"
    title = str(summary.get("data")) if summary and summary.get("data") else str(samples_path)
    agents_path = samples_path.parent / AGENT_SAMPLES
    agent_records = iter_samples(agents_path) if agents_path.is_file() else ()
    html = build_report(
        iter_samples(samples_path),
        tokenizer=tokenizer,
        summary=summary,
        title=title,
        agent_records=agent_records,
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    partial.write_text(html, encoding="utf-8")
    partial.replace(output)  # an earlier report stays whole until the new one is complete
    return output
