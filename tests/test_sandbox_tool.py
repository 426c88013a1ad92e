"""The execute_python_code Strands tool: spec, result text, stats, and a real Strands Agent using it."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from strands import Agent
from strands.agent.conversation_manager import NullConversationManager
from strands.models.model import Model
from strands.types.tools import ToolUse

from strands_slime.sandbox import (
    ExecutionResult,
    ResultKind,
    Sandbox,
    SandboxConfig,
    ToolStats,
    create_python_tool,
    format_result,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(60)]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def sandbox() -> AsyncIterator[Sandbox]:
    config = SandboxConfig(preload_modules=("math",), timeout_s=3, max_output_bytes=512, cpu_time_s=1)
    async with Sandbox(config) as box:
        yield box


async def call(tool: Any, tool_input: Any, tool_use_id: str = "call_1") -> dict[str, Any]:
    tool_use: ToolUse = {"toolUseId": tool_use_id, "name": "execute_python_code", "input": tool_input}
    events = [event async for event in tool.stream(tool_use, {})]
    return events[-1]["tool_result"]


def result(kind: ResultKind, **fields: Any) -> ExecutionResult:
    defaults: dict[str, Any] = {
        "stdout": "",
        "stderr": "",
        "exit_code": 0,
        "timed_out": False,
        "truncated": False,
        "duration_s": 0.01,
    }
    defaults.update(fields)
    return ExecutionResult(kind=kind, **defaults)


async def test_tool_spec(sandbox: Sandbox) -> None:
    tool = create_python_tool(sandbox)
    assert tool.tool_name == "execute_python_code"
    spec = tool.tool_spec
    schema = spec["inputSchema"]["json"]
    assert schema["required"] == ["code"] and schema["properties"]["code"]["type"] == "string"
    assert list(schema["properties"]) == ["code"]
    description = spec["description"]
    assert "3 s wall clock" in description and "512 bytes" in description and "no network" in description
    assert "math is available" in description and "sympy" not in description, "only what it preloaded"


async def test_description_names_only_modules_the_sandbox_imported() -> None:
    config = SandboxConfig(preload_modules=("math", "json", "no_such_module_for_the_test"), timeout_s=3)
    unstarted = Sandbox(config)
    assert unstarted.available_modules is None
    assert "math and json are available" in create_python_tool(unstarted).tool_spec["description"]
    async with Sandbox(config) as box:
        assert box.available_modules == ["math", "json"]
        description = create_python_tool(box).tool_spec["description"]
        assert "math and json are available." in description and "no_such_module" not in description
        ran = await call(create_python_tool(box), {"code": "import no_such_module_for_the_test"})
        assert "ModuleNotFoundError" in ran["content"][0]["text"]


@pytest.mark.slow  # 6 s
async def test_tool_runs_code_and_counts(sandbox: Sandbox) -> None:
    stats = ToolStats()
    tool = create_python_tool(sandbox, stats=stats)
    ok = await call(tool, {"code": "print(6 * 7)"}, "call_ok")
    assert ok == {"toolUseId": "call_ok", "status": "success", "content": [{"text": "42"}]}
    failed = await call(tool, {"code": "import sys\nprint('partial')\nsys.exit(2)"})
    assert failed["status"] == "error"
    assert failed["content"][0]["text"] == "partial\n[exit code 2]"
    raised = await call(tool, {"code": "1/0"})
    text = raised["content"][0]["text"]
    assert (
        text.startswith("[stderr]\nTraceback")
        and "ZeroDivisionError" in text
        and text.endswith("[exit code 1]")
    )
    timed_out = await call(tool, {"code": "import time\ntime.sleep(10)"})
    assert timed_out["content"][0]["text"] == "[timed out after 3 s]"
    cpu = await call(tool, {"code": "while True:\n    pass"})
    # 1 CPU-second normally comes first; on a heavily loaded machine the 3 s wall clock may.
    assert cpu["content"][0]["text"] in ("[CPU time limit of 1 s exceeded]", "[timed out after 3 s]")
    quiet = await call(tool, {"code": "x = 1"})
    assert quiet["content"][0]["text"] == "[no output]" and quiet["status"] == "success"
    assert (stats.calls, stats.errors, stats.timeouts, stats.infra_failures) == (6, 2, 2, 0)
    assert stats.seconds > 3


@pytest.mark.parametrize("bad_input", [{}, {"code": 5}, "print(1)", None, {"source": "print(1)"}])
async def test_malformed_tool_input_is_a_readable_error(sandbox: Sandbox, bad_input: Any) -> None:
    stats = ToolStats()
    tool = create_python_tool(sandbox, stats=stats)
    answer = await call(tool, bad_input)
    assert answer["status"] == "error"
    assert answer["content"][0]["text"].startswith(
        "[rejected: the tool input must be an object with a string field"
    )
    assert (stats.calls, stats.errors, stats.infra_failures) == (1, 1, 0)


async def test_broken_sandbox_is_an_infra_failure() -> None:
    box = Sandbox(SandboxConfig(preload_modules=("math",)))
    await box.close()
    stats = ToolStats()
    answer = await call(create_python_tool(box, stats=stats), {"code": "print(1)"})
    assert answer["status"] == "error"
    assert answer["content"][0]["text"] == "[sandbox error: sandbox is closed]"
    assert (stats.calls, stats.errors, stats.infra_failures) == (1, 0, 1)


async def test_truncated_output_is_marked(sandbox: Sandbox) -> None:
    answer = await call(create_python_tool(sandbox), {"code": "print('y' * 5000)"})
    text = answer["content"][0]["text"]
    assert "bytes omitted ...]" in text
    assert text.endswith("[output truncated: 512 of 5001 bytes shown]")
    assert answer["status"] == "success"


async def test_format_result_for_every_kind() -> None:
    assert format_result(result(ResultKind.OK, stdout="a\n", stderr="warn\n")) == "a\n[stderr]\nwarn"
    assert format_result(result(ResultKind.ERROR, exit_code=3)) == "[exit code 3]"
    assert format_result(result(ResultKind.TIMEOUT, limit_s=2.5)) == "[timed out after 2.5 s]"
    assert format_result(result(ResultKind.CPU_LIMIT, limit_s=4.0)) == "[CPU time limit of 4 s exceeded]"
    assert format_result(result(ResultKind.KILLED, exit_code=-11)) == "[killed by signal SIGSEGV]"
    flood = result(
        ResultKind.OUTPUT_LIMIT, stdout="x", truncated=True, error="output limit exceeded: 9 bytes"
    )
    assert format_result(flood) == "x\n[output limit exceeded: 9 bytes]"
    assert (
        format_result(ExecutionResult.failure(ResultKind.INVALID_INPUT, "too long")) == "[rejected: too long]"
    )
    assert (
        format_result(ExecutionResult.failure(ResultKind.INFRA, "zygote died"))
        == "[sandbox error: zygote died]"
    )


class ScriptedModel(Model):
    """Calls execute_python_code once, then answers with the tool's text: a real agent loop."""

    def __init__(self, code: str) -> None:
        self.config: dict[str, Any] = {"model_id": "scripted"}
        self.code = code
        self.tool_results: list[dict[str, Any]] = []

    def update_config(self, **model_config: Any) -> None:
        self.config.update(model_config)

    def get_config(self) -> dict[str, Any]:
        return self.config

    def structured_output(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    async def stream(
        self, messages: list[Any], tool_specs: Any = None, *args: Any, **kwargs: Any
    ) -> AsyncGenerator[Any, None]:
        yield {"messageStart": {"role": "assistant"}}
        last = messages[-1]["content"]
        results = [block["toolResult"] for block in last if "toolResult" in block]
        if not results:
            assert tool_specs and tool_specs[0]["name"] == "execute_python_code"
            yield {
                "contentBlockStart": {
                    "start": {"toolUse": {"name": "execute_python_code", "toolUseId": "call_1"}}
                }
            }
            yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps({"code": self.code})}}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "tool_use"}}
            return
        self.tool_results.extend(results)
        yield {"contentBlockDelta": {"delta": {"text": "done: " + results[0]["content"][0]["text"]}}}
        yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": "end_turn"}}


async def test_strands_agent_uses_the_tool(sandbox: Sandbox) -> None:
    stats = ToolStats()
    model = ScriptedModel("import math\nmath.factorial(10)")
    agent = Agent(
        model=model,
        tools=[create_python_tool(sandbox, stats=stats)],
        callback_handler=None,
        conversation_manager=NullConversationManager(),
    )
    outcome = await agent.invoke_async("compute 10!")
    assert str(outcome).strip() == "done: 3628800"
    assert model.tool_results[0]["status"] == "success"
    assert stats.calls == 1 and stats.errors == 0
