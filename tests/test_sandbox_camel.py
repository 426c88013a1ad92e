"""The optional camel-ai backend (parity with slime's strands example) and its output parsing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from strands_slime.sandbox import ResultKind, Sandbox, SandboxConfig
from strands_slime.sandbox.base import SandboxError
from strands_slime.sandbox.camel_backend import parse_camel_output
from strands_slime.sandbox.environment import is_secret

pytest.importorskip("camel.interpreters")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

needs_python_on_path = pytest.mark.skipif(
    shutil.which("python") is None, reason="camel runs `python` from PATH"
)


def _clean_environment(patch: pytest.MonkeyPatch, home: Path) -> None:
    """No secret within reach: camel refuses to run otherwise."""
    for name, value in list(os.environ.items()):
        if is_secret(name, value):
            patch.delenv(name)
    patch.setenv("HOME", str(home))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def camel(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Sandbox]:
    with pytest.MonkeyPatch.context() as patch:
        _clean_environment(patch, tmp_path_factory.mktemp("home"))
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
def test_camel_children_read_their_parents_environment_so_secrets_refuse_camel(tmp_path: Path) -> None:
    # Why filtering the child's copy is not enough: model code reads the environment block its parent
    # (the rollout process) started with. A harmless marker stands in for the W&B key here.
    program = (
        "import asyncio\n"
        "from strands_slime.sandbox import Sandbox, SandboxConfig\n"
        "code = \"import os\\nprint(open(f'/proc/{os.getppid()}/environ', 'rb').read().count(b'visible-4711'))\"\n"
        "async def main():\n"
        "    async with Sandbox(SandboxConfig(backend='camel', timeout_s=5)) as box:\n"
        "        result = await box.run(code)\n"
        "    print(result.kind.value, result.stdout.strip(), result.error)\n"
        "asyncio.run(main())\n"
    )
    environment = {name: value for name, value in os.environ.items() if not is_secret(name, value)}
    environment.update(HOME=str(tmp_path), STRANDS_SLIME_MARKER="visible-4711")
    environment["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, "-c", program],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:2] == ["ok", "1"], done.stdout


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("WANDB_API_KEY", "wandb-secret"),
        ("HF_TOKEN", "hf-secret"),
        ("DATABASE_URL", "postgres://u:db-secret@db/x"),
        ("HTTPS_PROXY", "http://u:proxy-secret@proxy:3128"),
        ("GITHUB_PAT", "ghp-secret"),
    ],
)
@pytest.mark.asyncio
async def test_camel_refuses_to_start_next_to_a_secret_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, value: str
) -> None:
    _clean_environment(monkeypatch, tmp_path)
    monkeypatch.setenv(name, value)
    with pytest.raises(SandboxError, match=f"could read {name} ") as refused:
        async with Sandbox(SandboxConfig(backend="camel", timeout_s=5)):
            pass
    assert value not in str(refused.value)


@pytest.mark.parametrize("relative", [".netrc", ".ray/auth_token"])
@pytest.mark.asyncio
async def test_camel_refuses_to_start_next_to_a_credential_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, relative: str
) -> None:
    _clean_environment(monkeypatch, tmp_path)
    (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / relative).write_text("secret")
    with pytest.raises(SandboxError, match=str(tmp_path / relative)):
        async with Sandbox(SandboxConfig(backend="camel", timeout_s=5)):
            pass
