"""The optional camel-ai backend (parity with slime's strands example) and its output parsing."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from strands_slime.sandbox import ResultKind, Sandbox, SandboxConfig
from strands_slime.sandbox.camel_backend import parse_camel_output

pytest.importorskip("camel.interpreters")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

needs_python_on_path = pytest.mark.skipif(
    shutil.which("python") is None, reason="camel runs `python` from PATH"
)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def camel() -> AsyncIterator[Sandbox]:
    async with Sandbox(SandboxConfig(backend="camel", timeout_s=5, max_output_bytes=256)) as box:
        yield box


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("2\n", ("2\n", "", 0)),
        ("(stderr: warning\n)", ("", "warning\n", 0)),
        (
            "out\n(stderr: Traceback...\nValueError: x\n)(Execution failed with return code 1)",
            ("out\n", "Traceback...\nValueError: x\n", 1),
        ),
        ("(Execution failed with return code 3)", ("", "", 3)),
        ("(Execution failed with return code -9)", ("", "", -9)),
    ],
)
def test_parse_camel_output(output: str, expected: tuple[str, str, int]) -> None:
    assert parse_camel_output(output) == expected


@needs_python_on_path
@pytest.mark.asyncio(loop_scope="module")
async def test_camel_backend_runs_code(camel: Sandbox) -> None:
    result = await camel.run("print(1 + 1)\n40 + 2")
    assert result.kind is ResultKind.OK
    assert result.stdout == "2\n42\n"
    assert camel.capabilities["isolation"] == "none"
    assert camel.available_modules == ["math", "numpy", "sympy"], "checked at start-up"


@needs_python_on_path
@pytest.mark.asyncio(loop_scope="module")
async def test_camel_backend_errors_and_truncation(camel: Sandbox) -> None:
    failed = await camel.run("raise ValueError('boom')")
    assert failed.kind is ResultKind.ERROR and failed.exit_code == 1
    assert "ValueError: boom" in failed.stderr
    long = await camel.run("print('z' * 1000)")
    assert long.truncated and long.stdout_bytes == 1001 and "bytes omitted" in long.stdout


@needs_python_on_path
@pytest.mark.asyncio(loop_scope="module")
async def test_camel_backend_timeout() -> None:
    async with Sandbox(SandboxConfig(backend="camel", timeout_s=1)) as box:
        result = await box.run("import time\ntime.sleep(5)")
    assert result.kind is ResultKind.TIMEOUT and result.timed_out


@needs_python_on_path
@pytest.mark.asyncio(loop_scope="module")
async def test_camel_children_never_see_secrets(camel: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    # On a training node the rollout process holds the W&B key and Ray's token; camel copies our
    # environment into every child, so the backend scrubs that copy.
    monkeypatch.setenv("WANDB_API_KEY", "wandb-secret-4711")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "ray-secret-4711")
    monkeypatch.setenv("STRANDS_SLIME_VISIBLE", "yes")
    code = (
        "import os\n"
        "print([n for n in ('WANDB_API_KEY', 'RAY_AUTH_TOKEN', 'STRANDS_SLIME_VISIBLE', 'PATH') if n in os.environ])\n"
        "print(open('/proc/self/environ', 'rb').read().count(b'4711'))"
    )
    result = await camel.run(code)
    assert result.kind is ResultKind.OK, result.stderr
    # the child's own environment block holds no secret either
    assert result.stdout == "['STRANDS_SLIME_VISIBLE', 'PATH']\n0\n"
    # the rest of this process is untouched: only camel's module sees the scrubbing subprocess
    import asyncio
    import os

    assert os.environ["WANDB_API_KEY"] == "wandb-secret-4711"
    child = await asyncio.create_subprocess_exec("env", stdout=asyncio.subprocess.PIPE)
    stdout, _ = await child.communicate()
    assert b"WANDB_API_KEY=wandb-secret-4711" in stdout
