"""Contracts with transformers and aiohttp: only public API, or a private one that is bounded and guarded.

* chat templates: transformers' private ``_compile_jinja_template`` (10x cheaper per render) is used only
  while it renders exactly like the public ``apply_chat_template``; without it, or when it differs, the
  templater falls back to the public path and says so once;
* aiohttp: sessions of a dead event loop are closed through the public ``ClientSession.close``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import types
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from packaging.requirements import Requirement
from packaging.version import Version
from threaded_app import serve_app_in_thread

from strands_slime.provider.chat import ChatTemplater
from strands_slime.provider.client import SGLangClient

pytestmark = pytest.mark.unit

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

CHAT_TEMPLATE_UTILS = "transformers.utils.chat_template_utils"
MESSAGES = [
    {"role": "system", "content": "You solve math problems."},
    {"role": "user", "content": "What is 6 * 7?"},
    {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "execute_python_code", "arguments": {"code": "print(6*7)"}},
            }
        ],
    },
    {"role": "tool", "content": "42"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "execute_python_code",
            "description": "Run Python.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
        },
    }
]


def _public_render(tokenizer) -> str:
    return tokenizer.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True, tokenize=False)


def test_transformers_is_bounded_below_the_next_major_version() -> None:
    pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    [requirement] = [
        Requirement(line) for line in pyproject["project"]["dependencies"] if line.startswith("transformers")
    ]
    assert not requirement.specifier.contains("6.0")
    import transformers

    assert requirement.specifier.contains(Version(transformers.__version__))


def test_the_compiled_template_renders_like_apply_chat_template(qwen3_tokenizer) -> None:
    templater = ChatTemplater(qwen3_tokenizer)
    assert templater._compiled is not None  # the fast path is in use with the installed transformers
    assert templater.render(MESSAGES, TOOLS) == _public_render(qwen3_tokenizer)


def test_without_the_private_compile_the_public_path_renders(qwen3_tokenizer, monkeypatch, caplog) -> None:
    # What `from transformers.utils.chat_template_utils import ...` finds; transformers' own code keeps
    # the real module, so apply_chat_template still works.
    monkeypatch.setitem(sys.modules, CHAT_TEMPLATE_UTILS, types.ModuleType(CHAT_TEMPLATE_UTILS))
    with caplog.at_level(logging.WARNING, logger="strands_slime.provider.chat"):
        first = ChatTemplater(qwen3_tokenizer)
        ChatTemplater(qwen3_tokenizer)
    assert first._compiled is None
    assert first.render(MESSAGES, TOOLS) == _public_render(qwen3_tokenizer)
    assert caplog.text.count("no usable _compile_jinja_template") == 1  # once per process, not per templater


def test_a_compiled_template_that_renders_differently_is_not_used(
    qwen3_tokenizer, monkeypatch, caplog
) -> None:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def compile_in_another_environment(template: str):
        # A release whose environment post-processes every printed value: same template, other text.
        environment = ImmutableSandboxedEnvironment(finalize=lambda value: str(value).upper())
        return environment.from_string(template)

    drifted = types.ModuleType(CHAT_TEMPLATE_UTILS)
    drifted._compile_jinja_template = compile_in_another_environment  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, CHAT_TEMPLATE_UTILS, drifted)
    with caplog.at_level(logging.WARNING, logger="strands_slime.provider.chat"):
        templater = ChatTemplater(qwen3_tokenizer)
    assert templater._compiled is None
    assert templater.render(MESSAGES, TOOLS) == _public_render(qwen3_tokenizer)
    assert "renders the chat template differently" in caplog.text


@pytest.fixture
def health_server() -> Iterator[str]:
    """``GET /health`` on its own loop in a thread, so clients can use it from several event loops."""

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    def build() -> web.Application:
        app = web.Application()
        app.router.add_get("/health", health)
        return app

    with serve_app_in_thread(build) as url:
        yield url


def test_a_dead_loops_session_is_closed_through_public_api(health_server: str) -> None:
    client = SGLangClient(health_server, max_retries=0)
    dead = asyncio.new_event_loop()
    assert dead.run_until_complete(client.health())
    dead.close()  # closed without asyncio.run's clean-up: its session is still open
    [session] = [state.session for state in client._loops.values()]
    assert not session.closed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        async def on_another_loop() -> None:
            assert await client.health()
            await client.close()

        asyncio.run(on_another_loop())
        assert session.closed
        del session
        gc.collect()
    noise = [w for w in caught if issubclass(w.category, (DeprecationWarning, RuntimeWarning))]
    noise += [w for w in caught if "Unclosed client session" in str(w.message)]
    assert not noise, [str(w.message) for w in noise]


def test_a_compiled_template_the_public_path_cannot_check_is_not_used(
    qwen3_tokenizer, monkeypatch, caplog
) -> None:
    """Nothing to compare with is not a match: the compiled form is used only once it is proven."""

    def refuse(*args, **kwargs):
        raise TypeError("apply_chat_template() got an unexpected keyword argument 'chat_template'")

    monkeypatch.setattr(qwen3_tokenizer, "apply_chat_template", refuse)
    with caplog.at_level(logging.WARNING, logger="strands_slime.provider.chat"):
        templater = ChatTemplater(qwen3_tokenizer)
    assert templater._compiled is None
    assert "apply_chat_template raised TypeError" in caplog.text
    with pytest.raises(TypeError, match="unexpected keyword argument"):  # and every render says why
        templater.render(MESSAGES, TOOLS)
