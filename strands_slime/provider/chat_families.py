"""Chat formats (families) that incremental templating supports, and which one a tokenizer uses.

A family says what the chat template cannot: which tokens end a model turn (the stop tokens SGLang
stops on), which text closes an assistant turn in the template, how tool calls are written (the
tool parser), and what the template needs before a tool message. It is picked from the chat
template's text and the tokenizer's special tokens; ``chat_family=`` overrides the pick. A template
that matches no family is refused: appending with the wrong rules would produce a trajectory that
differs from what the model was trained to read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from strands_slime.provider.deepseek_v32 import ASSISTANT, BOS, EOS, USER, render_deepseek_v32


class UnsupportedChatTemplate(ValueError):
    """The tokenizer's chat template matches no supported family (or the override is unknown)."""


@dataclass(frozen=True)
class ChatFamily:
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
    template_markers: tuple[str, ...] = ()
    """Texts that all appear in the family's chat template."""
    vocab_markers: tuple[str, ...] = ()
    """Tokens that all exist in the family's vocabulary."""
    anchor_tool_calls: bool = False
    """The template refuses a tool message unless the assistant message before it has tool calls."""
    thinking_kwarg: str = "enable_thinking"
    """The template variable that ``enable_thinking`` is passed as (Kimi's template reads ``thinking``)."""
    encoder: Callable[..., str] | None = field(default=None, compare=False)
    """Renders messages for families that ship a Python encoder instead of a Jinja template."""


QWEN3 = ChatFamily(
    name="qwen3",
    models="Qwen3 (hybrid thinking), Qwen3-2507 Instruct/Thinking, Qwen3-Next, ChatML templates",
    tool_parser="hermes",
    stop_tokens=("<|im_end|>", "<|endoftext|>"),
    turn_end="<|im_end|>",
    template_markers=("<|im_start|>", "<|im_end|>"),
)
QWEN35 = ChatFamily(
    name="qwen35",
    models="Qwen3.5, Qwen3-Coder (XML tool calls)",
    tool_parser="qwen3_coder",
    stop_tokens=("<|im_end|>", "<|endoftext|>"),
    turn_end="<|im_end|>",
    template_markers=("<|im_start|>", "<|im_end|>", "<function="),
)
GLM47 = ChatFamily(
    name="glm47",
    models="GLM-4.5, GLM-4.6, GLM-4.7",
    tool_parser="glm47",
    stop_tokens=("<|user|>", "<|observation|>", "<|endoftext|>"),
    turn_end=None,
    template_markers=("[gMASK]<sop>", "<|assistant|>", "<|observation|>", "<arg_key>"),
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
)
DEEPSEEK_V32 = ChatFamily(
    name="deepseek_v32",
    models="DeepSeek V3.2 (no Jinja template; rendered by strands_slime.provider.deepseek_v32)",
    tool_parser="deepseek_v32",
    stop_tokens=(EOS,),
    turn_end=EOS,
    vocab_markers=(BOS, USER, ASSISTANT),
    anchor_tool_calls=True,
    encoder=render_deepseek_v32,
)

_FAMILIES: dict[str, ChatFamily] = {}
_ALIASES: dict[str, str] = {}


def register_chat_family(family: ChatFamily, *aliases: str) -> None:
    """Make a family selectable by name and, by its markers, detectable (registration order wins)."""
    _FAMILIES[family.name] = family
    for alias in (family.name, *aliases):
        _ALIASES[alias.lower()] = family.name


# Detection order: the more specific markers first (Qwen3.5 is ChatML plus XML calls).
register_chat_family(KIMI_K2, "kimi", "kimi_k25", "kimi25")
register_chat_family(MINIMAX_M2, "minimax", "minimax_m25", "minimax_m27")
register_chat_family(GLM47, "glm", "glm45", "glm46", "glm4_moe")
register_chat_family(QWEN35, "qwen3.5", "qwen3_coder", "qwen3-coder")
register_chat_family(QWEN3, "qwen", "qwen3_next", "qwennext", "qwen3_2507", "chatml")
register_chat_family(DEEPSEEK_V32, "deepseek", "deepseekv32", "deepseek_v3.2")


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


def has_token(tokenizer: Any, token: str) -> bool:
    """True when ``token`` is one token of the tokenizer's vocabulary."""
    token_id = tokenizer.convert_tokens_to_ids(token)
    return (
        isinstance(token_id, int) and token_id >= 0 and token_id != getattr(tokenizer, "unk_token_id", None)
    )


def detect_chat_family(tokenizer: Any, chat_template: str | None) -> ChatFamily:
    """The family whose markers the template (and vocabulary) has; refuse anything else.

    Raises:
        UnsupportedChatTemplate: no template, or one no registered family matches (the message says
            how to choose a family explicitly).
    """
    for family in _FAMILIES.values():
        if family.template_markers and (
            not chat_template or not all(marker in chat_template for marker in family.template_markers)
        ):
            continue
        if family.encoder is not None and chat_template:
            continue  # a Python-encoded family is only chosen when no Jinja template is shipped
        if not family.template_markers and not family.vocab_markers:
            continue
        if all(has_token(tokenizer, token) for token in family.vocab_markers):
            return family
    what = (
        "has no chat template"
        if not chat_template
        else "has a chat template that matches no supported family"
    )
    raise UnsupportedChatTemplate(
        f"the tokenizer {what}; appending with the wrong format would train on a trajectory the model "
        f"cannot read. Supported: {'; '.join(f'{f.name} ({f.models})' for f in _FAMILIES.values())}. "
        "If the model writes one of these formats, set chat_family= (rollout config: chat_family), "
        "and check it with `strands-slime drift`."
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
