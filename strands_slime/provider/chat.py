"""Incremental chat templating: Strands messages to prompt token ids, one delta at a time.

The first call renders the whole prompt (system, tools, history) with the tokenizer's chat template.
Later calls render only the new messages (tool results, user follow-ups) after an anchor assistant
message, and take the text the template writes after that anchor: the closing of the assistant turn,
the new messages and the generation prompt. Where the anchor ends is measured on a render whose new
messages are blanked, so no message content can move or fake it. The closing's stop token is dropped
when the model's own output already ends with it, so the model's tokens are never re-encoded.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from strands_slime.provider.chat_families import (
    Appends,
    ChatFamily,
    UnsupportedChatTemplate,
    resolve_chat_family,
    template_digest,
    token_id,
)
from strands_slime.provider.fast_tokenizer import FAST_ENCODE_MAX_CHARS, byte_level_decoder, fast_encoder
from strands_slime.provider.tool_parsers import THINK_CLOSE, THINK_OPEN
from strands_slime.runtime import get_runtime

logger = logging.getLogger(__name__)

ANCHOR = "\u27e6strands-slime-anchor\u27e7"
"""Content of the anchor assistant message; it never reaches the model. It is only looked for in a
render whose other content is ours, so a message containing this text changes nothing."""

OFFLOAD_CHARS = 2048
"""Texts longer than this are tokenized in the tokenizer's worker thread (≈1.6 µs/token here)."""

_PROBE_TEXT = "probe-1f4e"
"""A user turn's text no template writes otherwise (where the assistant header starts)."""
_TRAILING_THINK = re.compile(rf"{re.escape(THINK_OPEN)}\s*(?:{re.escape(THINK_CLOSE)})?\s*\Z")
"""An empty or open thinking block at the end of a generation prompt (``enable_thinking`` on or off)."""
_APPEND_PROBES: tuple[list[dict[str, Any]], ...] = (
    [{"role": "tool", "content": "out", "tool_call_id": "call_0"}],
    [
        {"role": "tool", "content": " \n<tool_response>x</tool_response>\n ", "tool_call_id": "call_0"},
        {"role": "tool", "content": "", "tool_call_id": "call_1"},
    ],
    [{"role": "user", "content": "go on"}],
    [
        {"role": "tool", "content": "</think>1", "tool_call_id": "call_0"},
        {"role": "user", "content": "\n u \n"},
    ],
)
"""New messages a family's appends must write as the template renders them before they are used (the
template's options may change the text around the contents; the proof over contents is in the tests)."""
_ASSISTANT_HEADER_MARKERS = (
    "<|im_start|>assistant",
    "<|assistant|>",
    "<|start_header_id|>assistant",
    "<|im_assistant|>",
    "]~b]ai",
    "<\uff5cAssistant\uff5c>",
)


def tool_specs_to_template_tools(
    tool_specs: Sequence[Mapping[str, Any]] | None,
) -> list[dict[str, Any]] | None:
    """Strands ``ToolSpec``s to the OpenAI-style function schemas chat templates expect."""
    if not tool_specs:
        return None
    tools = []
    for spec in tool_specs:
        schema = spec.get("inputSchema", {})
        parameters = schema.get("json", schema) if isinstance(schema, Mapping) else {}
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": spec["name"],
                    "description": spec.get("description", ""),
                    "parameters": parameters,
                },
            }
        )
    return tools


def _content_text(blocks: Sequence[Mapping[str, Any]]) -> str:
    """Text of a message's text-like blocks; media become short placeholders instead of crashing."""
    parts: list[str] = []
    for block in blocks:
        if "text" in block:
            parts.append(str(block["text"]))
        elif "json" in block:
            parts.append(json.dumps(block["json"], ensure_ascii=False))
        elif "image" in block:
            parts.append("[image omitted]")
        elif "document" in block:
            name = block["document"].get("name", "") if isinstance(block["document"], Mapping) else ""
            parts.append(f"[document omitted{': ' + name if name else ''}]")
        elif "video" in block:
            parts.append("[video omitted]")
    return "\n".join(parts)


def tool_result_text(result: Mapping[str, Any]) -> str:
    """A tool result as the model reads it; error results say so even when the tool's text doesn't."""
    text = _content_text(result.get("content") or [])
    if result.get("status") == "error" and not text.lower().startswith("error"):
        text = f"Error: {text}" if text else "Error"
    return text


def to_template_messages(
    messages: Sequence[Mapping[str, Any]],
    call_order: Callable[[str], int | None] | None = None,
    call_ids: Callable[[str], str | None] | None = None,
) -> list[dict[str, Any]]:
    """Strands messages to chat-template messages.

    Tool results become ``tool`` messages sorted by the order of their calls (``call_order`` maps a
    toolUseId to its position; unknown ids keep their place after the known ones), with a
    ``tool_call_id``: the id the model wrote for the call where ``call_ids`` knows one (Kimi K2),
    else the toolUseId. Text in the same user message follows them as a user message.
    """
    rendered: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        blocks = message.get("content") or []
        if role == "user":
            results = [b["toolResult"] for b in blocks if "toolResult" in b]
            if results:
                if call_order is not None:
                    fallback = len(results)
                    keyed = [
                        (
                            order
                            if (order := call_order(str(r.get("toolUseId")))) is not None
                            else fallback + i,
                            i,
                        )
                        for i, r in enumerate(results)
                    ]
                    results = [results[i] for _, i in sorted(keyed)]
                for result in results:
                    use_id = str(result.get("toolUseId"))
                    native = call_ids(use_id) if call_ids is not None else None
                    rendered.append(
                        {
                            "role": "tool",
                            "content": tool_result_text(result),
                            "tool_call_id": native or use_id,
                        }
                    )
            other = [b for b in blocks if "toolResult" not in b]
            if other or not results:
                rendered.append({"role": "user", "content": _content_text(other)})
        elif role == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": _content_text(blocks)}
            reasoning = [
                b["reasoningContent"]["reasoningText"].get("text", "")
                for b in blocks
                if "reasoningContent" in b and "reasoningText" in b["reasoningContent"]
            ]
            if reasoning:
                entry["reasoning_content"] = "\n".join(reasoning)
            calls = [b["toolUse"] for b in blocks if "toolUse" in b]
            if calls:
                entry["tool_calls"] = [
                    {
                        "type": "function",
                        "id": call.get("toolUseId"),
                        "function": {"name": call.get("name"), "arguments": call.get("input") or {}},
                    }
                    for call in calls
                ]
            rendered.append(entry)
        else:
            rendered.append({"role": role, "content": _content_text(blocks)})
    return rendered


class ChatTemplater:
    """Renders and tokenizes prompts for one tokenizer + chat template (shared across episodes).

    ``family`` (:mod:`strands_slime.provider.chat_families`) is detected from the template and vocabulary or
    given as ``chat_family``; an unsupported template raises ``UnsupportedChatTemplate``.

    Tokenizer work on long texts runs in one worker thread per tokenizer (HF tokenizers must not be
    driven from several threads at once), so the event loop never stalls on a large tool output. Where
    the ``fast-tokenizer`` extra encodes this vocabulary exactly, texts up to
    ``FAST_ENCODE_MAX_CHARS`` are encoded by it on the loop (:mod:`strands_slime.provider.fast_tokenizer`).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        chat_template: str | None = None,
        enable_thinking: bool | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        offload_chars: int = OFFLOAD_CHARS,
        chat_family: str | ChatFamily | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None)
        self.family = resolve_chat_family(tokenizer, self.chat_template, chat_family)
        if not self.chat_template and self.family.encoder is None:
            raise ValueError(
                f"the tokenizer has no chat template and {self.family.name} needs one; pass chat_template="
            )
        self.template_kwargs = dict(template_kwargs or {})
        if enable_thinking is not None:
            self.template_kwargs[self.family.thinking_kwarg] = enable_thinking
        self.offload_chars = offload_chars
        self._compiled = _compile(self.chat_template) if self.family.encoder is None else None
        self._special_tokens = {
            k: v
            for k, v in (getattr(tokenizer, "special_tokens_map", None) or {}).items()
            if isinstance(v, str)
        }
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self.fast_encode = fast_encoder(tokenizer, self._encode_unlocked)
        """The exact fast encoder for this vocabulary (the ``fast-tokenizer`` extra), or None."""
        self._fast_decode = byte_level_decoder(tokenizer)
        if self._compiled is not None and not self._compiled_matches_transformers():
            self._compiled = None
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self.stop_token_ids = self._stop_token_ids()
        self._stop_texts = {token: self.decode([token]) for token in self.stop_token_ids}
        self._generation_prompt = ""
        self.appends: Appends | None = None
        """The family's appends when proven for this template and options (None: each append renders)."""
        self.appends = self._proven_appends()

    def _compiled_matches_transformers(self) -> bool:
        """Whether the privately compiled template renders a probe exactly as the public
        ``apply_chat_template`` does (a transformers release may change how it calls the template)."""
        probe = [{"role": "user", "content": "ping"}]
        try:
            expected = self.tokenizer.apply_chat_template(
                probe,
                chat_template=self.chat_template,
                add_generation_prompt=True,
                tokenize=False,
                **self.template_kwargs,
            )
        except Exception as exc:  # nothing to compare with: not a match (the public path then fails loudly)
            expected = f"<apply_chat_template raised {type(exc).__name__}: {exc}>"
        try:
            rendered = self._compiled.render(
                messages=probe,
                tools=None,
                documents=None,
                add_generation_prompt=True,
                **self._special_tokens,
                **self.template_kwargs,
            )
        except Exception as exc:
            rendered = f"<{type(exc).__name__}: {exc}>"
        if rendered == expected:
            return True
        if get_runtime().first_time("chat: compiled template differs"):
            logger.warning(
                "transformers %s renders the chat template differently from its compiled form "
                "(%.80r != %.80r); using the slower apply_chat_template",
                _transformers_version(),
                rendered,
                expected,
            )
        return False

    def _proven_appends(self) -> Appends | None:
        """The family's appends for a template they are proven for (its exact text), with no template
        option but thinking, and that writes the probes as the render does (the generation prompt is
        taken from a render); else None, with one INFO line for a family that has appends."""
        appends = self.family.appends
        if appends is None or self.family.encoder is not None or not self.chat_template:
            return None
        digest = template_digest(self.chat_template)
        reason = None
        if digest not in appends.templates:
            reason = f"its text ({digest}) is none of the {self.family.name} templates they are proven for"
        elif set(self.template_kwargs) - {self.family.thinking_kwarg}:
            reason = f"template options besides {self.family.thinking_kwarg} ({sorted(self.template_kwargs)})"
        else:
            try:
                probe = [{"role": "user", "content": "x"}]
                closed = self.render(probe, add_generation_prompt=False)
                opened = self.render(probe, add_generation_prompt=True)
                self._generation_prompt = opened[len(closed) :] if opened.startswith(closed) else ""
                wrong = [
                    p
                    for p in _APPEND_PROBES
                    if appends.text(p, self._generation_prompt) != self.rendered_continuation(p)
                ]
            except Exception as exc:  # a template that cannot render the probes: render as before
                reason = f"the probes do not render ({type(exc).__name__}: {exc})"
            else:
                if wrong or not self._generation_prompt:
                    reason = (
                        f"the template writes {len(wrong) or 'the generation prompt of'} probe(s) otherwise"
                    )
        if reason is None:
            return appends
        if get_runtime().first_time(f"chat appends: {digest} {sorted(self.template_kwargs)}"):
            logger.info("tool results and user turns are rendered with the chat template: %s", reason)
        return None

    def _stop_token_ids(self) -> frozenset[int]:
        """The eos token and the family's end-of-turn tokens (GLM stops on the next role's token)."""
        ids: set[int] = set()
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        for token in self.family.stop_tokens:
            if (found := token_id(self.tokenizer, token)) is not None:
                ids.add(found)
        return frozenset(ids)

    # ------------------------------------------------------------------ rendering

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        """Render messages to text with the chat template (no tokenization)."""
        if self.family.encoder is not None:
            return self.family.encoder(
                messages, tools, add_generation_prompt=add_generation_prompt, **self.template_kwargs
            )
        if self._compiled is not None:
            return self._compiled.render(
                messages=messages,
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self._special_tokens,
                **self.template_kwargs,
            )
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **self.template_kwargs,
        )

    def initial_prompt_text(
        self,
        messages: list[dict[str, Any]],
        system_prompt: str | None,
        tools: list[dict[str, Any]] | None,
    ) -> str:
        """The full first prompt: system, tools, every message so far, and the generation prompt."""
        full = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + messages
        return self.render(full, tools)

    def continuation_text(self, new_messages: list[dict[str, Any]], last_output_token: int | None) -> str:
        """Text to append after the model's last output: the turn closing, new messages, generation prompt.
        Without a render where the family's appends are proven for this template, else rendered."""
        tail = self._appended(new_messages)
        if tail is None:
            tail = self.rendered_continuation(new_messages)
        return self._after_output(tail, last_output_token)

    async def continuation_text_async(
        self, new_messages: list[dict[str, Any]], last_output_token: int | None, size_hint: int
    ) -> str:
        """:meth:`continuation_text`, a render (where one is needed) off the loop when the messages are large."""
        tail = self._appended(new_messages)
        if tail is None:
            tail = await self.render_async(lambda: self.rendered_continuation(new_messages), size_hint)
        return self._after_output(tail, last_output_token)

    def _appended(self, new_messages: list[dict[str, Any]]) -> str | None:
        """The family's appended text for this proven template, or None (render)."""
        if self.appends is None:
            return None
        return self.appends.text(new_messages, self._generation_prompt)

    def _after_output(self, tail: str, last_output_token: int | None) -> str:
        """``tail`` less the stop token the model's own output already ends with."""
        stop_text = self._stop_texts.get(last_output_token) if last_output_token is not None else None
        if stop_text and tail.startswith(stop_text):
            return tail[len(stop_text) :]
        return tail

    def rendered_continuation(self, new_messages: list[dict[str, Any]]) -> str:
        """What the template renders after an anchor assistant turn's content: the turn closing, the new
        messages and the generation prompt (the reference the family appends are proven against)."""
        anchor = self._anchor(new_messages)
        text = self.render(anchor + new_messages)
        # The anchor's end is found where only our own text can be: in a render with the new messages'
        # content blanked. The real render must agree up to there.
        blank = self.render(anchor + [{**m, "content": ""} for m in new_messages])
        if blank.count(ANCHOR) != 1:
            raise ValueError("the chat template does not render assistant content verbatim; cannot append")
        end = blank.index(ANCHOR) + len(ANCHOR)
        if anchor[-1].get("tool_calls"):
            # The anchor's tool calls are rendered after its content; the turn closing starts after them.
            turn_end = self.family.turn_end
            end = blank.find(turn_end, end) if turn_end else -1
            if end == -1:
                raise ValueError(f"the chat template does not close an assistant turn with {turn_end!r}")
        if text[:end] != blank[:end]:
            raise ValueError(
                "the chat template renders earlier messages differently depending on the new messages' "
                "content; cannot append"
            )
        return text[end:]

    def _anchor(self, new_messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A user message and an assistant message to render the new messages after. Templates that
        refuse a tool message after an assistant message without calls get one call per result."""
        assistant: dict[str, Any] = {"role": "assistant", "content": ANCHOR}
        results = 0
        while results < len(new_messages) and new_messages[results].get("role") == "tool":
            results += 1
        if self.family.anchor_tool_calls and results:
            assistant["tool_calls"] = [
                {
                    "type": "function",
                    "id": message.get("tool_call_id") or f"anchor_{i}",
                    "function": {"name": "anchor", "arguments": {}},
                }
                for i, message in enumerate(new_messages[:results])
            ]
        return [{"role": "user", "content": "anchor"}, assistant]

    @functools.cached_property
    def assistant_header(self) -> str:
        """The text the template's generation prompt opens an assistant turn with (before any
        thinking block), e.g. ``<|im_start|>assistant`` for Qwen3, ``<｜Assistant｜>`` for DeepSeek (whose
        render of a user turn always opens the assistant's).

        Raises:
            UnsupportedChatTemplate: no render of a user turn (alone or after a system turn) shows it.
        """
        failures = []
        user = {"role": "user", "content": _PROBE_TEXT}
        for messages in ([user], [{"role": "system", "content": "s"}, user]):
            try:
                closed = self.render(messages, add_generation_prompt=False)
                opened = self.render(messages, add_generation_prompt=True)
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
                continue
            added = opened[len(closed) :] if opened.startswith(closed) and opened != closed else None
            if added is None and _PROBE_TEXT in opened:  # what follows the user's turn, if anything does
                added = opened[opened.rindex(_PROBE_TEXT) + len(_PROBE_TEXT) :].lstrip()
                added = added.removeprefix(self.family.turn_end or "")
            if header := (added or "").split(THINK_OPEN, 1)[0].strip():
                return header
            failures.append(f"no assistant header after the user turn ({closed[-30:]!r} -> {opened[-30:]!r})")
        raise UnsupportedChatTemplate(
            "cannot read the chat template's generation prompt from a render of a user turn "
            f"({'; '.join(failures)}), so a prompt templated already (slime's --apply-chat-template) "
            "cannot be told from a plain one: fix the template or pass chat_template="
        )

    def ends_with_generation_prompt(self, text: str) -> bool:
        """True when ``text`` ends like a prompt this template rendered for generation: its assistant
        header, optionally followed by a thinking block the template opened or left empty. A plain
        prompt that merely ends with the word "assistant" does not. "Cannot tell" is never an answer:
        :attr:`assistant_header` raises."""
        return _TRAILING_THINK.sub("", text).rstrip().endswith(self.assistant_header)

    @staticmethod
    def prompt_opens_reasoning(prompt_text: str) -> bool:
        """True when the generation prompt left a ``<think>`` open (thinking-only templates)."""
        start = max(prompt_text.rfind(marker) for marker in _ASSISTANT_HEADER_MARKERS)
        tail = prompt_text[start:] if start != -1 else prompt_text[-64:]
        return tail.count(THINK_OPEN) > tail.count(THINK_CLOSE)

    # ------------------------------------------------------------------ tokenization

    def encode(self, text: str) -> list[int]:
        """Encode with special tokens recognised and none added (what SGLang does with rendered text)."""
        if self.fast_encode is not None and len(text) <= FAST_ENCODE_MAX_CHARS:
            return self.fast_encode(text)
        with self._lock:
            return self._encode_unlocked(text)

    def _encode_unlocked(self, text: str) -> list[int]:
        # The batch entry points release the GIL (and skip offsets), so a worker thread encoding a huge
        # tool output does not stall the event loop; the single-text ``encode`` holds the GIL throughout.
        if self._backend is not None:
            batch = getattr(self._backend, "encode_batch_fast", None) or self._backend.encode_batch
            return batch([text], add_special_tokens=False)[0].ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        """Decode with special tokens kept (the exact text of the ids)."""
        with self._lock:
            return self._decode_unlocked(token_ids)

    def _decode_unlocked(self, token_ids: Sequence[int]) -> str:
        if self._fast_decode is not None:
            text = self._fast_decode(token_ids)
            if text is not None:
                return text
        if self._backend is not None:
            return self._backend.decode_batch([list(token_ids)], skip_special_tokens=False)[0]
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False)

    def _worker(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="strands-slime-tokenizer")
        return self._executor

    async def encode_async(self, text: str) -> list[int]:
        """Encode, off the event loop when the text is long or the tokenizer is busy (the fast encoder,
        where there is one, takes texts up to ``FAST_ENCODE_MAX_CHARS`` on the loop)."""
        if self.fast_encode is not None and len(text) <= FAST_ENCODE_MAX_CHARS:
            return self.fast_encode(text)
        if len(text) <= self.offload_chars and self._lock.acquire(blocking=False):
            try:
                return self._encode_unlocked(text)
            finally:
                self._lock.release()
        return await asyncio.get_running_loop().run_in_executor(self._worker(), self.encode, text)

    async def decode_async(self, token_ids: Sequence[int]) -> str:
        """Decode, off the event loop when the ids are many or the tokenizer is busy.

        Decoding a token costs about what encoding a character does (~0.2 µs here), so up to
        ``offload_chars`` ids stay on the loop (~0.4 ms, the bound encoding has); handing them to the
        worker thread costs ~0.08 ms on a busy core, more than decoding a typical turn's output."""
        if len(token_ids) <= self.offload_chars and self._lock.acquire(blocking=False):
            try:
                return self._decode_unlocked(token_ids)
            finally:
                self._lock.release()
        return await asyncio.get_running_loop().run_in_executor(self._worker(), self.decode, token_ids)

    async def render_async(self, render: Callable[[], str], size_hint: int) -> str:
        """Run a render callable, off the loop when the messages are large."""
        if size_hint <= self.offload_chars * 8:
            return render()
        return await asyncio.get_running_loop().run_in_executor(self._worker(), render)


def _plain_types() -> frozenset[type]:
    """Types whose attribute safety in Jinja's sandbox depends only on the attribute's name: builtins
    and the loop and namespace objects of Jinja itself."""
    kinds: set[type] = {str, dict, list, tuple, int, float, bool, type(None)}
    try:
        from jinja2.runtime import LoopContext
        from jinja2.utils import Namespace
    except ImportError:  # pragma: no cover - jinja2 comes with transformers' chat templates
        return frozenset(kinds)
    return frozenset(kinds | {LoopContext, Namespace})


_PLAIN_TYPES = _plain_types()


def _compile(chat_template: str) -> Any:
    """transformers' cached, sandboxed Jinja compile (10x cheaper than apply_chat_template per call),
    recompiled in an overlay of its environment whose attribute check is memoized (same sandbox, same
    output; the templater also checks a probe render against ``apply_chat_template``).

    ``_compile_jinja_template`` is private (pyproject bounds transformers below 6): on a version without
    it, or where it takes other arguments, this logs a warning once and returns None, and the templater
    renders through the public ``apply_chat_template``. Template syntax errors are raised as before.
    """
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        environment = _compile_jinja_template(chat_template).environment.overlay()
    except (ImportError, AttributeError, TypeError) as exc:
        if get_runtime().first_time("chat: no compiled templates"):
            logger.warning(
                "transformers %s has no usable _compile_jinja_template (%s: %s); rendering chat templates "
                "with the slower apply_chat_template",
                _transformers_version(),
                type(exc).__name__,
                exc,
            )
        return None
    environment.is_safe_attribute = _memoized_attribute_check(environment.is_safe_attribute)
    return environment.from_string(chat_template)


def _memoized_attribute_check(check: Callable[[Any, str, Any], bool]) -> Callable[[Any, str, Any], bool]:
    """The sandbox's ``is_safe_attribute`` decided once per (builtin type, attribute name).

    Templates read ``.startswith``, ``.split``, ``.items`` ... of plain strings and dicts on every
    message; jinja's check runs ABC ``isinstance`` tests each time (about half of a render), yet for
    these types its answer depends only on the type and the name. Other objects are checked as before.
    """
    decided: dict[tuple[type, str], bool] = {}

    def is_safe_attribute(obj: Any, attr: str, value: Any) -> bool:
        kind = type(obj)
        if kind not in _PLAIN_TYPES:
            return check(obj, attr, value)
        safe = decided.get((kind, attr))
        if safe is None:
            safe = decided[(kind, attr)] = check(obj, attr, value)
        return safe

    return is_safe_attribute


def _transformers_version() -> str:
    try:
        from importlib.metadata import version

        return version("transformers")
    except Exception:
        return "(unknown version)"


def get_templater(
    tokenizer: Any,
    *,
    chat_template: str | None = None,
    enable_thinking: bool | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    chat_family: str | None = None,
) -> ChatTemplater:
    """One shared templater per (tokenizer, template, options): its worker thread and lock are shared."""
    key = (
        id(tokenizer),
        chat_template,
        json.dumps(
            {"enable_thinking": enable_thinking, **dict(template_kwargs or {})}, sort_keys=True, default=str
        ),
        chat_family,
    )
    templaters = get_runtime().templaters
    templater = templaters.get(key)
    if templater is None or templater.tokenizer is not tokenizer:
        templater = ChatTemplater(
            tokenizer,
            chat_template=chat_template,
            enable_thinking=enable_thinking,
            template_kwargs=template_kwargs,
            chat_family=chat_family,
        )
        templaters[key] = templater
    return templater
