"""Check a tokenizer's chat format before training: incremental prompts must equal a full render.

For random tool-calling conversations (reasoning, parallel calls, typed arguments, unicode, several
rounds) the model's outputs are written as an independent reference writes an assistant turn (the
model's own chat template through transformers, or for template-less families the model's own
encoder: :mod:`strands_slime.provider.reference_encoders`), parsed back with the family's tool parser,
and the episode is templated incrementally as the provider does it. The ids must equal the
reference's full render of the same conversation; every difference is reported with the text around
it. ``strands-slime drift --template-check MODEL_DIR`` runs it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from strands_slime.provider.chat import ChatTemplater, to_template_messages, tool_specs_to_template_tools
from strands_slime.provider.reference_encoders import ReferenceRenderer, reference_for, with_reference_options
from strands_slime.provider.tool_parsers import ParsedOutput, get_tool_parser, parse_output

CHECK_TOOL_SPECS = [
    {
        "name": "execute_python_code",
        "description": "Run Python code and return its output.",
        "inputSchema": {
            "json": {
                "type": "object",
                "properties": {"code": {"type": "string"}, "timeout": {"type": "integer"}},
                "required": ["code"],
            }
        },
    }
]
Turn = tuple[str, str, list[dict[str, Any]], list[str]]
"""One model turn: reasoning, content, the arguments of each tool call, each call's result."""


_WORDS = ["The", "value", "is", "x", "Now", "check", "结果", "café", "ß", "42", "(a+b)", "😀", "done."]
_OUTPUTS = ["out", "Error: boom", "1\n2", "结果 é", '{"k": [1, 2]}', "line\twith tab", "  padded  "]


@dataclass
class TemplateCheckReport:
    """The outcome of :func:`check_template`.

    Attributes:
        family: the chat family checked.
        tool_parser: the parser that read the simulated outputs back.
        conversations: conversations run (the check stops at the first failing one).
        appends: incremental appends compared with a full render.
        failures: each difference found, with the text around it.
    """

    family: str
    tool_parser: str
    reference: str = ""
    """What the incremental prompts were compared with."""
    conversations: int = 0
    appends: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every incremental prompt equalled the full render."""
        return not self.failures

    def render_text(self) -> str:
        """What ``drift --template-check`` prints: the counts, then the first ten failures."""
        head = (
            f"chat family {self.family} (tool parser {self.tool_parser}): {self.conversations} conversations, "
            f"{self.appends} incremental appends, {len(self.failures)} failures\ncompared with {self.reference}"
        )
        if self.ok:
            return head + "\nincremental prompts equal a full render of every conversation"
        return "\n".join([head, *(f"- {failure}" for failure in self.failures[:10])])


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 6)))


def _conversation(rng: random.Random) -> tuple[str, str, list[Turn]]:
    turns = []
    for _ in range(rng.randint(1, 3)):
        calls = []
        for _ in range(rng.randint(1, 3)):
            args: dict[str, Any] = {"code": f"print({_sentence(rng)!r})"}
            if rng.random() < 0.4:
                args["timeout"] = rng.randint(1, 300)
            calls.append(args)
        results = [rng.choice(_OUTPUTS) + " " + _sentence(rng) for _ in calls]
        turns.append(("Think: " + _sentence(rng), "So " + _sentence(rng), calls, results))
    return "You help. " + _sentence(rng), "Task: " + _sentence(rng), turns


def model_output(templater: ChatTemplater, assistant: dict[str, Any], reference: ReferenceRenderer) -> str:
    """What the model writes for ``assistant`` after the generation prompt, without its stop token, as
    the reference writes an assistant turn.

    Raises:
        ValueError: the reference's assistant turn does not start with its own generation prompt, or
            does not end with the family's turn end.
    """
    user = [{"role": "user", "content": "q"}]
    prompt = reference.render(user, None, True)
    rendered = reference.render([*user, assistant], None, False)
    if not rendered.startswith(prompt):
        raise ValueError(
            "the template renders an assistant turn that does not start with its own generation prompt "
            f"(prompt ends {prompt[-40:]!r}, turn {rendered[len(prompt) - 40 : len(prompt) + 40]!r})"
        )
    body = rendered[len(prompt) :]
    turn_end = templater.family.turn_end
    if turn_end:
        if turn_end not in body:
            raise ValueError(f"the template does not close an assistant turn with {turn_end!r}")
        body = body[: body.rindex(turn_end)]
    return body


def stop_token_id(templater: ChatTemplater) -> int:
    """The token a tool-calling turn ends on (GLM: ``<|observation|>``)."""
    family = templater.family
    token = "<|observation|>" if "<|observation|>" in family.stop_tokens else family.stop_tokens[0]
    return int(templater.tokenizer.convert_tokens_to_ids(token))


@dataclass
class SimulatedEpisode:
    """An episode templated as the provider does it, and the template's full render of it."""

    incremental_ids: list[int]
    full_ids: list[int] | None
    """None when a turn's output did not parse back into its own calls and text (the last output)."""
    outputs: list[tuple[str, ParsedOutput]]
    """Each turn's output as the template writes it, and what the family's parser read from it."""


def simulate_episode(
    templater: ChatTemplater,
    system: str,
    user: str,
    turns: list[Turn],
    tool_specs: list[dict[str, Any]] = CHECK_TOOL_SPECS,
    *,
    reference: ReferenceRenderer | None = None,
) -> SimulatedEpisode:
    """Write each turn as the reference writes an assistant turn, parse it back with the family's
    parser, append the tool results incrementally (our call ids, the model's own ids where it writes
    them), and render the whole conversation in full with the reference. Stops at a turn whose output
    does not parse back into its own calls and text: later turns could not be appended.

    ``reference`` defaults to :func:`~strands_slime.provider.reference_encoders.reference_for` the
    templater (its chat template; a template-less family needs one given). The templater must render
    with the reference's options (:func:`~strands_slime.provider.reference_encoders.with_reference_options`).
    """
    reference = reference or reference_for(templater)
    parser = get_tool_parser(templater.family.tool_parser)
    tools = tool_specs_to_template_tools(tool_specs)
    prompt_text = templater.initial_prompt_text([{"role": "user", "content": user}], system, tools)
    ids = templater.encode(prompt_text)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": user},
    ]
    stop = stop_token_id(templater)
    outputs: list[tuple[str, ParsedOutput]] = []
    count = 0
    for reasoning, content, arguments, results in turns:
        calls = []
        for args in arguments:
            calls.append(
                {
                    "type": "function",
                    "id": f"functions.execute_python_code:{count}",
                    "function": {"name": "execute_python_code", "arguments": args},
                }
            )
            count += 1
        assistant = {
            "role": "assistant",
            "content": content,
            "reasoning_content": reasoning,
            "tool_calls": calls,
        }
        output = model_output(templater, assistant, reference)
        opened = templater.prompt_opens_reasoning(prompt_text)
        parsed = parse_output(output, parser, tool_specs, prompt_opened_reasoning=opened)
        outputs.append((output, parsed))
        got = [(c.name, c.arguments) for c in parsed.tool_calls]
        if got != [("execute_python_code", args) for args in arguments] or parsed.text != content:
            return SimulatedEpisode(ids, None, outputs)
        ids += templater.encode(output) + [stop]
        ours = [f"call_{i}" for i in range(len(calls))]
        native = {o: c.call_id for o, c in zip(ours, parsed.tool_calls, strict=True) if c.call_id}
        blocks = [
            {"toolResult": {"toolUseId": o, "status": "success", "content": [{"text": text}]}}
            for o, text in zip(ours, results, strict=True)
        ]
        order = {o: i for i, o in enumerate(ours)}
        new = to_template_messages([{"role": "user", "content": blocks}], order.get, native.get)
        prompt_text = templater.continuation_text(new, stop)
        ids += templater.encode(prompt_text)
        messages.append(assistant)
        messages += [
            {"role": "tool", "content": text, "tool_call_id": call["id"]}
            for call, text in zip(calls, results, strict=True)
        ]
    return SimulatedEpisode(ids, templater.encode(reference.render(messages, tools, True)), outputs)


def _check_one(
    templater: ChatTemplater,
    reference: ReferenceRenderer,
    conversation: Any,
    report: TemplateCheckReport,
    index: int,
) -> None:
    episode = simulate_episode(templater, *conversation, reference=reference)
    if episode.full_ids is None:
        output, parsed = episode.outputs[-1]
        got = [(c.name, c.arguments) for c in parsed.tool_calls]
        report.failures.append(
            f"conversation {index}: the {templater.family.tool_parser} parser read {got!r} and text "
            f"{parsed.text!r} from {output!r}"
        )
        return
    report.appends += len(episode.outputs)
    ids, full = episode.incremental_ids, episode.full_ids
    if ids != full:
        at = next(
            (i for i, (a, b) in enumerate(zip(ids, full, strict=False)) if a != b), min(len(ids), len(full))
        )
        report.failures.append(
            f"conversation {index}: incremental ids differ from a full render at token {at}: "
            f"incremental {templater.decode(ids[max(0, at - 8) : at + 8])!r} vs "
            f"full {templater.decode(full[max(0, at - 8) : at + 8])!r}"
        )


def check_template(
    templater: ChatTemplater,
    *,
    reference: ReferenceRenderer | None = None,
    conversations: int = 50,
    seed: int = 0,
) -> TemplateCheckReport:
    """Run ``conversations`` random tool-calling episodes through ``templater`` and compare them with
    ``reference`` (default: the model's chat template; see module doc).

    Raises:
        NoReferenceEncoder: no reference given for a template-less family.
    """
    reference = reference or reference_for(templater)
    templater = with_reference_options(templater, reference)
    report = TemplateCheckReport(
        family=templater.family.name,
        tool_parser=templater.family.tool_parser,
        reference=reference.description,
    )
    rng = random.Random(seed)
    for index in range(conversations):
        report.conversations += 1
        try:
            _check_one(templater, reference, _conversation(rng), report, index)
        except Exception as exc:  # our templater or the reference refused the conversation: report it
            report.failures.append(f"conversation {index}: {type(exc).__name__}: {exc}")
            break
    return report
