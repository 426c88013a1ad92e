"""The one definition of what an episode writes into ``sample.metadata``.

``generate`` and the reward write these keys; the rollout metrics, the dynamic-sampling filters, the
reward, the offline runner's summary, the eval metrics, the viewer and the drift audit read them
(through :meth:`EpisodeMetadata.from_metadata`, never by a key string); ``reset_attempt`` removes them from a sample slime sends back; the table in
``docs/rollout.md`` is generated from them (``python -m strands_slime.episode_metadata``). Adding a
key is one field below with its description (and, if it should reach W&B, its metrics); a test fails
until the docs table is regenerated.

The JSON keys are the field names. Values are stored as plain JSON types, so slime, W&B and
``samples.jsonl`` see them unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

MEAN = "mean"
"""Metric ``<key>/mean``: the mean over the samples that carry a number for the key (0.0 if none)."""
MAX = "max"
"""Metric ``<key>/max``: the maximum over the samples that carry a number for the key (0.0 if none)."""
ANY = "episodes_with_any"
"""Metric ``<key>/episodes_with_any``: the share of samples whose value is non-zero."""
TOTAL = "total"
"""Metric ``<key>/total``: the sum over the samples (a count of events in the rollout)."""

GENERATE = "generate"
REWARD = "reward"
RESET = "reset_attempt"


@dataclass(frozen=True)
class MetricSpec:
    """Which rollout metrics a key feeds (``rollout/strands/*``, ``eval/strands/<dataset>/*``).

    Attributes:
        aggregates: per-key aggregates among :data:`MEAN`, :data:`MAX`, :data:`ANY`, :data:`TOTAL`.
        shares: for a categorical key, the values whose share (``<key>/<value>``) is logged even when
            zero, so W&B charts have no gaps; other values seen are logged too.
        missing: the value a sample without the key counts as in the shares (None: not counted).
        count_as: log the number of samples with a truthy value under this metric name.
        ratio: ``(metric name, denominator key)``: the key's sum over the rollout divided by the
            denominator key's sum (0.0 when that is 0).
    """

    aggregates: tuple[str, ...] = ()
    shares: tuple[str, ...] | None = None
    missing: str | None = None
    count_as: str | None = None
    ratio: tuple[str, str] | None = None


def _key(
    default: Any = None,
    doc: str = "",
    *,
    writer: str = GENERATE,
    always: bool = False,
    per_attempt: bool = True,
    metrics: MetricSpec | None = None,
    factory: Any = None,
) -> Any:
    """A metadata key: its default, description and who writes it.

    Args:
        default: the value a reader gets when the key is absent.
        doc: one line for the docs table.
        writer: who writes it (``generate``, ``reward`` or ``reset_attempt``).
        always: write the key even when its value is None (readers and tests rely on its presence).
        per_attempt: an attempt writes it, so a recycled sample loses it (``reset_attempt``).
        metrics: the rollout metrics it feeds.
        factory: a default factory for mutable defaults.
    """
    info = {"doc": doc, "writer": writer, "always": always, "per_attempt": per_attempt, "metrics": metrics}
    if factory is not None:
        return field(default_factory=factory, metadata=info)
    return field(default=default, metadata=info)


_COUNTER = MetricSpec((MEAN, MAX, ANY))
_NUMBER = MetricSpec((MEAN, MAX))


@dataclass
class EpisodeMetadata:
    """What one attempt (``generate``, then the reward) records about an episode, one field per key.

    Write with :meth:`to_metadata` (a dict to merge into ``sample.metadata``); read with
    :meth:`from_metadata`. Keys that are None are left out of the dict unless the field is marked
    ``always``.
    """

    evaluation: bool = _key(False, "true for evaluation episodes (the reward never shapes them)", always=True)
    tool_iterations: int = _key(
        0, "tool rounds (parallel calls in one message are one round)", metrics=_NUMBER
    )
    tool_calls: int = _key(0, "tool calls in all (malformed ones included)", metrics=_COUNTER)
    parse_errors: int = _key(
        0,
        "malformed tool calls (answered with the expected format)",
        metrics=MetricSpec((MEAN, MAX, ANY), ratio=("parse_errors/per_call", "tool_calls")),
    )
    tool_errors: int = _key(
        0, "runs of the model's code that failed (exception, non-zero exit, crash, ...)", metrics=_COUNTER
    )
    tool_timeouts: int = _key(0, "runs stopped by the sandbox's wall-clock or CPU limit", metrics=_COUNTER)
    sandbox_seconds: float = _key(0.0, "seconds spent in the sandbox", metrics=_NUMBER)
    finish_reason: str | None = _key(
        None,
        "how the last model call or the episode ended: `stop`, `length`, `abort`, `error`, or the limit "
        "that ended it",
        metrics=MetricSpec(shares=("stop", "length", "abort", "error"), missing="unknown"),
    )
    truncation: str | None = _key(
        None,
        "why a TRUNCATED episode stopped (`length`, a tool/model-call limit, the context or budget)",
        metrics=MetricSpec(shares=()),
    )
    turns: int = _key(0, "model calls", metrics=_NUMBER)
    final_text: str | None = _key(None, "the last assistant message (what the reward scores)")
    infra_error: str | None = _key(
        None,
        "the root cause when the infrastructure failed (the sample is removed); null otherwise",
        always=True,
        metrics=MetricSpec(count_as="infra_failures"),
    )
    abort_source: str | None = _key(None, "ABORTED only: `slime` (its abort flag) or `server`")
    prompt_tokens: int = _key(0, "prompt tokens summed over the model calls")
    cached_tokens: int = _key(
        0,
        "prefix-cache hits summed over the model calls",
        metrics=MetricSpec(ratio=("prefix_cache_hit_rate", "prompt_tokens")),
    )
    completion_tokens: int = _key(0, "generated tokens summed over the model calls")
    retried_turns: int = _key(0, "model turns Strands re-ran and we rolled back", metrics=_NUMBER)
    # _key returns a dataclasses.field (ruff cannot see it; RUF009 is about shared mutable defaults)
    turn_seconds: list[float] = _key(doc="each model call's latency in seconds", factory=list)  # noqa: RUF009
    masked_null_logprobs: int = _key(
        0,
        "model tokens the server sent no logprob for, masked out of training (logged once per process)",
        metrics=MetricSpec((MEAN, MAX, ANY, TOTAL)),
    )
    abort_detection: str | None = _key(
        None,
        "the abort flag the episode watched: `slime` (`GenerateState.aborted`), `abort_event` "
        "(`args.abort_event`) or `off` (none: logged once per process with the cause)",
        metrics=MetricSpec(shares=("slime", "abort_event", "off")),
    )
    generate_seconds: float | None = _key(None, "wall time of the whole generate call", metrics=_NUMBER)
    transcript: list[dict[str, Any]] | None = _key(  # noqa: RUF009
        None, "the parsed conversation (`keep_transcript: true`)"
    )
    fanout_segment: int | None = _key(None, "fan-out only: this sample's segment number (from 0)")
    fanout_segments: int | None = _key(None, "fan-out only: the episode's number of segments")
    agent: str | None = _key(
        None, "several agents only: the agent whose segment this sample is (`main`, or its name)"
    )
    agent_role: str | None = _key(None, "several agents only: `main` or `sub`")
    parent_agent: str | None = _key(
        None, "several agents only: the agent whose tool call started this segment (None: none did)"
    )
    parent_tool_call: str | None = _key(None, "several agents only: the `toolUseId` of that tool call")
    agent_segment: int | None = _key(
        None, "several agents only: this segment's number among its agent's segments (from 0)"
    )
    agent_samples: int | None = _key(None, "several agents only: the episode's number of samples")
    reward_track: str | None = _key(
        None,
        "several agents only: the agent whose own reward function (`agents.rewards`) scored this sample; "
        "None: the episode's reward",
    )
    raw_reward: float | None = _key(
        None,
        "the unshaped score (slime logs it; the zero-std filter reads it); the preset on removed samples",
        writer=REWARD,
    )
    reward_details: dict[str, Any] | None = _key(  # noqa: RUF009
        None, "the reward's verdict: `acc`, `pred`, `reason`, `source`, `method`, ...", writer=REWARD
    )
    restarts: int | None = _key(
        None,
        "how many earlier attempts slime sent this sample back after (kept across attempts)",
        writer=RESET,
        per_attempt=False,
    )
    resumes: int | None = _key(
        None,
        "how many attempts went on from an aborted attempt's saved state (`--partial-rollout`; kept "
        "across attempts)",
        writer=RESET,
        per_attempt=False,
    )
    strands_resume: dict[str, Any] | None = _key(  # noqa: RUF009
        None,
        "ABORTED under `--partial-rollout` only: the episode state the recycled sample resumes from "
        "(see [partial rollout](#--partial-rollout-aborted-episodes-resume-where-they-stopped))",
    )

    def to_metadata(self) -> dict[str, Any]:
        """The keys to merge into ``sample.metadata`` (None values left out unless the key is ``always``)."""
        written: dict[str, Any] = {}
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            if value is not None or spec.metadata["always"]:
                written[spec.name] = value
        return written

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any] | None) -> EpisodeMetadata:
        """The record stored in ``metadata``: absent keys take their defaults, other keys are ignored.

        Values are taken as stored. A sample from another generate function (or an eval config's
        ``metadata_overrides``) may carry other types, so a reader that must not fail on such samples
        (the reward) checks the values it uses.

        Raises:
            TypeError: ``metadata`` is not a mapping.
        """
        if metadata is None:
            return cls()
        if not isinstance(metadata, Mapping):
            raise TypeError(f"sample.metadata must be a mapping, got {type(metadata).__name__}")
        return cls(**{name: metadata[name] for name in _NAMES if name in metadata})


_FIELDS = {spec.name: spec for spec in dataclasses.fields(EpisodeMetadata)}
_NAMES = frozenset(_FIELDS)

EPISODE_METADATA_KEYS = frozenset(name for name, spec in _FIELDS.items() if spec.metadata["per_attempt"])
"""Every ``sample.metadata`` key one attempt (generate, then the reward) writes; a sample slime sends
back (ABORTED, FAILED, any status) loses them all before the next attempt."""

RESTARTS_KEY = "restarts"
"""The key ``reset_attempt`` counts retries in (not reset: it survives every attempt)."""
RESUMES_KEY = "resumes"
"""The key ``prepare_resume`` counts resumed attempts in (not reset: it survives every attempt)."""


def write_keys(metadata: MutableMapping[str, Any], **values: Any) -> None:
    """Set some of the record's keys in ``metadata`` (a later writer, e.g. the reward).

    Raises:
        KeyError: a name that is not a field of :class:`EpisodeMetadata` (add the field first).
    """
    unknown = sorted(set(values) - _NAMES)
    if unknown:
        raise KeyError(f"not an episode metadata key: {', '.join(unknown)} (declare it in EpisodeMetadata)")
    metadata.update(values)


def metric_specs() -> dict[str, MetricSpec]:
    """The keys that feed rollout metrics, with what each one feeds, in field order."""
    return {name: spec.metadata["metrics"] for name, spec in _FIELDS.items() if spec.metadata["metrics"]}


def metric_names(spec: MetricSpec, key: str) -> list[str]:
    """The metric names (without prefix) a key's spec always produces, for the docs table."""
    names = [f"{key}/{aggregate}" for aggregate in spec.aggregates]
    if spec.shares is not None:
        names.append(f"{key}/<value>")
    if spec.count_as:
        names.append(spec.count_as)
    if spec.ratio:
        names.append(spec.ratio[0])
    return names


def metadata_table() -> str:
    """The markdown table of every key (``docs/rollout.md`` embeds it verbatim)."""
    lines = ["| key | written by | reset on a new attempt | description | metrics |", "|---|---|---|---|---|"]
    for name, spec in _FIELDS.items():
        info = spec.metadata
        metrics = ", ".join(f"`{m}`" for m in metric_names(info["metrics"], name)) if info["metrics"] else ""
        reset = "yes" if info["per_attempt"] else "no"
        lines.append(f"| `{name}` | {info['writer']} | {reset} | {info['doc']} | {metrics} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(metadata_table(), end="")
