"""Independent renderers that ``drift --template-check`` compares the provider's prompts with.

For a Jinja family the reference is the model's own chat template, rendered by transformers' public
``apply_chat_template`` (the provider renders a compiled copy of it, appending after an anchor). For
a template-less family (DeepSeek) it is an encoder we did not write: the one the model ships
(``encoding/encoding_dsv32.py``, ``encoding/encoding_dsv4.py`` in its directory), SGLang's copy of
DeepSeek V3.2's when SGLang is installed, or a file given explicitly. Comparing our encoder with
itself could not fail, so a template-less family without a reference is refused
(:class:`NoReferenceEncoder`).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from strands_slime.provider.chat import ChatTemplater
from strands_slime.provider.deepseek import TOOL_SCHEMAS

SGLANG_ENCODERS = {"encoding_dsv32.py": ("srt", "entrypoints", "openai", "encoding_dsv32.py")}
"""Reference encoders SGLang ships (a copy of DeepSeek's), by file name: where they are in its package."""

Render = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, bool], str]


class NoReferenceEncoder(ValueError):
    """A template-less family has no independent encoder to be compared with."""


@dataclass(frozen=True)
class ReferenceRenderer:
    """Renders a whole conversation the way the model's own format does.

    Attributes:
        description: what it is, for the check's report.
        render: ``(messages, tools, add_generation_prompt) -> text``.
        template_kwargs: options the provider's templater must render with to be comparable (DeepSeek:
            the reference's own tool instructions, where the provider's default is our wording).
    """

    description: str
    render: Render
    template_kwargs: Mapping[str, Any]


def template_reference(templater: ChatTemplater) -> ReferenceRenderer:
    """The model's chat template through transformers' ``apply_chat_template``, with the templater's
    template and options."""

    def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, generation: bool) -> str:
        return templater.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            chat_template=templater.chat_template,
            add_generation_prompt=generation,
            tokenize=False,
            **templater.template_kwargs,
        )

    return ReferenceRenderer("the chat template, rendered by transformers' apply_chat_template", render, {})


def load_encoder_module(path: Path) -> ModuleType:
    """Import a reference encoder from its file (it needs only the standard library).

    Raises:
        NoReferenceEncoder: the file cannot be imported or has no ``encode_messages``/``render_tools``.
    """
    spec = importlib.util.spec_from_file_location(f"strands_slime_reference_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise NoReferenceEncoder(f"cannot import the reference encoder {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise NoReferenceEncoder(f"cannot import the reference encoder {path}: {exc}") from exc
    if not callable(getattr(module, "encode_messages", None)) or not callable(
        getattr(module, "render_tools", None)
    ):
        raise NoReferenceEncoder(f"{path} has no encode_messages and render_tools: not a DeepSeek encoder")
    return module


def find_reference_encoder(templater: ChatTemplater, model_dir: Path | None) -> Path:
    """The model's own encoder in ``model_dir`` (``encoding/encoding_*.py`` or next to the tokenizer;
    the family's file first), else SGLang's copy of the family's.

    Raises:
        NoReferenceEncoder: none found (the message says where it looked and how to pass one).
    """
    wanted = templater.family.reference_encoder
    if wanted is None:
        raise NoReferenceEncoder(f"chat family {templater.family.name} renders with its chat template")
    looked: list[str] = []
    if model_dir is not None:
        for folder in (model_dir / "encoding", model_dir):
            looked.append(str(folder))
            found = sorted(folder.glob("encoding_*.py"), key=lambda p: p.name != wanted)
            if found:
                return found[0]
    sglang = importlib.util.find_spec("sglang")
    if wanted in SGLANG_ENCODERS and sglang is not None and sglang.submodule_search_locations:
        path = Path(next(iter(sglang.submodule_search_locations))).joinpath(*SGLANG_ENCODERS[wanted])
        if path.is_file():
            return path
    looked.append("SGLang's package" if wanted in SGLANG_ENCODERS else "(SGLang ships none for it)")
    raise NoReferenceEncoder(
        f"chat family {templater.family.name} has no Jinja template and no reference encoder was found "
        f"({wanted} in {', '.join(looked)}): comparing our encoder with itself proves nothing. Pass the "
        "model's own encoder with --reference FILE (DeepSeek ships it as encoding/" + wanted + ")."
    )


def _with_string_arguments(message: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI-style tool calls carry their arguments as a JSON string (DeepSeek V4's encoder needs it)."""
    calls = message.get("tool_calls")
    if not calls:
        return dict(message)
    converted = []
    for call in calls:
        function = dict(call.get("function", call))
        if not isinstance(function.get("arguments"), str):
            function["arguments"] = json.dumps(function.get("arguments") or {}, ensure_ascii=False)
        converted.append({**call, "function": function})
    return {**message, "tool_calls": converted}


def deepseek_reference(module: ModuleType, description: str, *, enable_thinking: bool) -> ReferenceRenderer:
    """A DeepSeek encoder module (``encode_messages``, ``render_tools``) as a reference: tools go on
    the system message (an empty one when there is none), as DeepSeek's and SGLang's servers put them."""
    mode = "thinking" if enable_thinking else "chat"

    def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, generation: bool) -> str:
        converted = [_with_string_arguments(m) for m in messages]
        if tools:
            if not converted or converted[0].get("role") != "system":
                converted.insert(0, {"role": "system", "content": ""})
            converted[0] = {**converted[0], "tools": list(tools)}
        return module.encode_messages(converted, thinking_mode=mode)

    sentinel = {"name": "strands_slime_schema_sentinel"}
    tools_text = module.render_tools([sentinel])
    marker = json.dumps(sentinel, ensure_ascii=False)
    if tools_text.count(marker) != 1:
        raise NoReferenceEncoder(f"{description}: its render_tools does not list a tool's schema once")
    tools_prompt = tools_text.replace(marker, TOOL_SCHEMAS)
    return ReferenceRenderer(description, render, {"tools_prompt": tools_prompt})


def reference_for(
    templater: ChatTemplater, *, model_dir: Path | None = None, encoder_file: Path | None = None
) -> ReferenceRenderer:
    """The independent reference for ``templater``'s family (see module doc).

    Args:
        templater: the provider's templater for the model.
        model_dir: the model's directory, searched for its own encoder (template-less families).
        encoder_file: a reference encoder file to use instead of searching.

    Raises:
        NoReferenceEncoder: a template-less family and no usable reference encoder.
    """
    if templater.family.encoder is None and encoder_file is None:
        return template_reference(templater)
    path = encoder_file or find_reference_encoder(templater, model_dir)
    thinking = templater.template_kwargs.get(templater.family.thinking_kwarg, True)
    return deepseek_reference(
        load_encoder_module(path), f"the reference encoder {path}", enable_thinking=bool(thinking)
    )


def with_reference_options(templater: ChatTemplater, reference: ReferenceRenderer) -> ChatTemplater:
    """``templater`` with the options the reference needs (the same one when it needs none)."""
    if not reference.template_kwargs:
        return templater
    return ChatTemplater(
        templater.tokenizer,
        chat_template=templater.chat_template,
        template_kwargs={**templater.template_kwargs, **reference.template_kwargs},
        chat_family=templater.family,
    )
