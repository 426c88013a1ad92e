"""Sandbox behaviour and isolation, through the public API with a real zygote and real processes.

The attack tests at the bottom each try one escape and check both what the model would read and
what is left on the machine afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from helpers import NAME_ITSELF, pid_alive, processes_named

from strands_slime.sandbox import (
    ExecutionResult,
    ResultKind,
    Sandbox,
    SandboxConfig,
    SandboxError,
    get_shared_sandbox,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(60)]

IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="uid drop and namespaces need root")

LIGHT = {"preload_modules": ("math",), "timeout_s": 10.0}


def dedent(code: str) -> str:
    return textwrap.dedent(code).strip() + "\n"


SET_NAME = NAME_ITSELF


async def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return predicate()


def exists_any(paths: list[str]) -> bool:
    return any(os.path.exists(path) for path in paths)


def beside_tests(name: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), name)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def sandbox() -> AsyncIterator[Sandbox]:
    async with Sandbox(SandboxConfig(**LIGHT)) as box:
        yield box


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def limited() -> AsyncIterator[Sandbox]:
    config = SandboxConfig(
        preload_modules=("math",),
        timeout_s=30.0,  # far above the CPU limit, so that a loaded machine still hits the CPU limit
        cpu_time_s=1.0,
        memory_mb=200,
        max_processes=16,
        max_output_bytes=1024,
        output_kill_bytes=256 * 1024,
        max_file_size_mb=1,
        max_concurrency=4,
    )
    async with Sandbox(config) as box:
        yield box


# ---------------------------------------------------------------- running code


async def test_runs_code_and_captures_output(sandbox: Sandbox) -> None:
    result = await sandbox.run("import sys\nprint('hello')\nprint('oops', file=sys.stderr)")
    assert isinstance(result, ExecutionResult)
    assert result.kind is ResultKind.OK and result.ok
    assert result.stdout == "hello\n"
    assert result.stderr == "oops\n"
    assert result.exit_code == 0
    assert not result.timed_out and not result.truncated
    assert result.duration_s > 0
    assert result.cpu_s is not None and result.cpu_s >= 0
    assert result.stdout_bytes == 6 and result.stderr_bytes == 5


async def test_last_expression_is_printed_like_a_repl(sandbox: Sandbox) -> None:
    assert (await sandbox.run("x = 6\nx * 7")).stdout == "42\n"
    assert (await sandbox.run("'text'")).stdout == "'text'\n"
    assert (await sandbox.run("None")).stdout == ""
    assert (await sandbox.run("print('once')")).stdout == "once\n"


async def test_exception_gives_a_clean_traceback(sandbox: Sandbox) -> None:
    result = await sandbox.run("def f(n):\n    return 1 / n\nf(0)")
    assert result.kind is ResultKind.ERROR and result.exit_code == 1
    assert 'File "<code>", line 2, in f' in result.stderr
    assert "return 1 / n" in result.stderr  # source lines are shown
    assert result.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "_zygote" not in result.stderr  # no sandbox frames


async def test_syntax_error(sandbox: Sandbox) -> None:
    result = await sandbox.run("def f(:\n    pass")
    assert result.kind is ResultKind.ERROR and result.exit_code == 1
    assert "SyntaxError" in result.stderr and "<code>" in result.stderr


@pytest.mark.parametrize(
    ("code", "exit_code", "kind"),
    [
        ("import sys; sys.exit(0)", 0, ResultKind.OK),
        ("import sys; sys.exit(3)", 3, ResultKind.ERROR),
        ("raise SystemExit('bad input')", 1, ResultKind.ERROR),
        ("import os; os._exit(7)", 7, ResultKind.ERROR),
    ],
)
async def test_exit_codes(sandbox: Sandbox, code: str, exit_code: int, kind: ResultKind) -> None:
    result = await sandbox.run(code)
    assert (result.exit_code, result.kind) == (exit_code, kind)


async def test_code_that_kills_itself_is_reported_with_the_signal(sandbox: Sandbox) -> None:
    result = await sandbox.run(
        "import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)"
    )
    assert result.kind is ResultKind.KILLED
    assert result.exit_code == -signal.SIGKILL and result.signal_name == "SIGKILL"
    assert result.stdout == "before\n"


async def test_each_call_is_a_fresh_process(sandbox: Sandbox) -> None:
    first = await sandbox.run("import os, math\nsecret = 1\nmath.pi = 3\nprint(os.getpid())")
    second = await sandbox.run("import os, math\nprint(os.getpid(), math.pi)\nsecret")
    assert first.ok
    assert second.kind is ResultKind.ERROR and "NameError" in second.stderr
    pid, pi = second.stdout.split()
    assert pid != first.stdout.strip() and float(pi) == pytest.approx(3.141592653589793)


async def test_random_generators_differ_between_calls() -> None:
    async with Sandbox(SandboxConfig(preload_modules=("numpy",), timeout_s=10)) as box:
        code = "import random, numpy\nprint(random.random(), numpy.random.rand())"
        outputs = {(await box.run(code)).stdout for _ in range(3)}
    assert len(outputs) == 3


async def test_numpy_and_sympy_are_preloaded_by_default() -> None:
    async with Sandbox(SandboxConfig(timeout_s=20)) as box:
        assert {"math", "numpy", "sympy"} <= set(box.capabilities["preloaded"])
        result = await box.run("import sympy\nx = sympy.Symbol('x')\nsympy.factor(x**2 - 1)")
    assert result.stdout == "(x - 1)*(x + 1)\n"


async def test_workdir_is_private_writable_and_the_cwd(sandbox: Sandbox) -> None:
    code = dedent(
        """
        import os
        with open("notes.txt", "w") as handle:
            handle.write("kept within this call")
        print(os.getcwd() == os.environ["HOME"] == os.environ["TMPDIR"], open("notes.txt").read())
        print(sorted(os.listdir(".")))
        """
    )
    result = await sandbox.run(code)
    assert result.stdout.splitlines() == ["True kept within this call", "['notes.txt']"]
    again = await sandbox.run("import os\nprint(os.listdir('.'))")
    assert again.stdout == "[]\n"


async def test_concurrent_calls_do_not_mix_outputs(sandbox: Sandbox) -> None:
    results = await asyncio.gather(*(sandbox.run(f"print({i} * 'x', {i})") for i in range(40)))
    for i, result in enumerate(results):
        assert result.stdout == f"{i * 'x'} {i}\n"


async def test_many_instant_calls_are_never_infra_failures() -> None:
    """Workers that finish before the zygote hears they were handed a request still count as runs."""
    async with Sandbox(SandboxConfig(max_concurrency=32, **LIGHT)) as box:
        results = await asyncio.gather(*(box.run("pass") for _ in range(150)))
        exits = await asyncio.gather(*(box.run("import os\nos._exit(3)") for _ in range(50)))
    assert [result.kind for result in results] == [ResultKind.OK] * 150
    assert [(result.kind, result.exit_code) for result in exits] == [(ResultKind.ERROR, 3)] * 50


async def test_concurrency_limit_queues_calls() -> None:
    async with Sandbox(SandboxConfig(max_concurrency=2, **LIGHT)) as box:
        code = "import time\nstarted = time.time()\ntime.sleep(0.3)\nprint(started)"
        began = time.monotonic()
        results = await asyncio.gather(*(box.run(code) for _ in range(6)))
        elapsed = time.monotonic() - began
    assert all(result.ok for result in results)
    starts = sorted(float(result.stdout) for result in results)
    assert elapsed >= 0.85  # three waves of two
    # never more than two at once: the third start comes after the first one finished
    assert starts[2] - starts[0] >= 0.25


async def test_event_loop_is_not_blocked(sandbox: Sandbox) -> None:
    """CPU spent on the loop's thread between 5 ms ticks stays small while executions run.

    Thread CPU rather than wall-clock lateness: on a loaded machine the wall clock also counts
    time spent waiting for a CPU, which says nothing about blocking.
    """
    busy: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            before = time.thread_time()
            await asyncio.sleep(0.005)
            busy.append(time.thread_time() - before)

    task = asyncio.create_task(ticker())
    results = await asyncio.gather(*(sandbox.run("import time\ntime.sleep(0.3)") for _ in range(8)))
    stop.set()
    await task
    assert all(result.ok for result in results)
    assert len(busy) > 10
    assert max(busy) < 0.05


async def test_per_call_timeout_overrides_the_config(sandbox: Sandbox) -> None:
    result = await sandbox.run("import time\ntime.sleep(5)", timeout=0.5)
    assert result.kind is ResultKind.TIMEOUT and result.timed_out
    assert result.limit_s == 0.5
    assert 0.45 < result.duration_s < 8


async def test_output_kept_is_head_and_tail(limited: Sandbox) -> None:
    result = await limited.run("for i in range(2000):\n    print(f'line {i:04d}')")
    assert result.ok and result.truncated
    assert result.stdout_bytes == 2000 * 10
    assert result.stdout.startswith("line 0000\n")
    assert result.stdout.endswith("line 1999\n")
    assert "bytes omitted ...]" in result.stdout
    assert len(result.stdout.encode()) < 1024 + 100


async def test_unicode_and_surrogates_in_code(sandbox: Sandbox) -> None:
    assert (await sandbox.run("print('π ≈ 3.14 — ok')")).stdout == "π ≈ 3.14 — ok\n"
    lone = await sandbox.run("print('\udcff')")  # a lone surrogate straight from JSON
    assert lone.kind in (ResultKind.OK, ResultKind.ERROR)


# ---------------------------------------------------------------- bad input


async def test_bad_arguments_raise_clear_errors(sandbox: Sandbox) -> None:
    with pytest.raises(TypeError, match="code must be a str"):
        await sandbox.run(b"print(1)")  # type: ignore[arg-type]
    for timeout in (0, -1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError, match="timeout must be a positive number"):
            await sandbox.run("print(1)", timeout=timeout)  # type: ignore[arg-type]


async def test_code_too_long_is_rejected_without_running() -> None:
    async with Sandbox(SandboxConfig(max_code_bytes=100, **LIGHT)) as box:
        result = await box.run("print(1)\n" + "#" * 200)
        assert result.kind is ResultKind.INVALID_INPUT
        assert "limit is 100 bytes" in (result.error or "")
        assert (await box.run("print(2)")).stdout == "2\n"


async def test_null_bytes_in_code(sandbox: Sandbox) -> None:
    result = await sandbox.run("print(1)\0")
    assert result.kind is ResultKind.ERROR
    assert "null" in result.stderr.lower()


@pytest.mark.asyncio(loop_scope="module")
async def test_config_rejects_unknown_and_invalid_fields() -> None:
    with pytest.raises(ValueError, match="extra"):
        SandboxConfig(timeout=3)  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        SandboxConfig(timeout_s=0)
    with pytest.raises(ValueError, match="not a module name"):
        SandboxConfig(preload_modules=("os; rm -rf",))
    with pytest.raises(ValueError, match="invalid variable"):
        SandboxConfig(env={"A=B": "1"})
    with pytest.raises(ValueError):
        SandboxConfig(backend="docker")  # type: ignore[arg-type]
    nested = SandboxConfig.model_validate({"timeout_s": 5, "preload_modules": ["math"], "network": "shared"})
    assert nested.preload_modules == ("math",) and nested.effective_cpu_time_s == 5


# ---------------------------------------------------------------- lifecycle


async def test_start_failure_is_an_infra_result() -> None:
    box = Sandbox(SandboxConfig(python_executable="/nonexistent/python", max_restarts=0, **LIGHT))
    with pytest.raises(SandboxError):
        await box.start()
    result = await box.run("print(1)")
    assert result.kind is ResultKind.INFRA and result.infra_failure
    assert "start" in (result.error or "")
    await box.close()


async def test_close_stops_the_zygote_and_later_calls_report_it() -> None:
    box = Sandbox(SandboxConfig(**LIGHT))
    assert (await box.run("print(1)")).ok
    zygote = box.zygote_pid
    assert zygote is not None
    await box.close()
    assert await wait_until(lambda: not pid_alive(zygote))
    result = await box.run("print(1)")
    assert result.kind is ResultKind.INFRA and "closed" in (result.error or "")


async def test_close_kills_running_executions() -> None:
    box = Sandbox(SandboxConfig(**LIGHT))
    await box.start()
    running = asyncio.create_task(box.run(SET_NAME.format(name="closeme") + "import time\ntime.sleep(30)"))
    assert await wait_until(lambda: processes_named("closeme"))
    began = time.monotonic()
    await box.close()
    result = await running
    assert time.monotonic() - began < 8
    assert result.kind in (ResultKind.KILLED, ResultKind.INFRA)


async def test_cancelled_call_kills_its_process(sandbox: Sandbox) -> None:
    code = SET_NAME.format(name="cancelme") + "import time\ntime.sleep(30)"
    task = asyncio.create_task(sandbox.run(code))
    assert await wait_until(lambda: bool(processes_named("cancelme")))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_until(lambda: not processes_named("cancelme"))
    assert (await sandbox.run("print('still fine')")).stdout == "still fine\n"


def children_of(pid: int) -> list[int]:
    """Live direct children of ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as stat:
                    fields = stat.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != b"Z":
                found.append(int(entry))
    return found


ROLLOUT_PROCESS = """
import asyncio, sys
from strands_slime.sandbox import Sandbox, SandboxConfig

async def main():
    box = Sandbox(SandboxConfig(preload_modules=("math",), timeout_s=10))
    await box.start()
    print(box.zygote_pid, flush=True)
    await asyncio.sleep(120)

asyncio.run(main())
"""


@pytest.mark.slow  # a second interpreter and its zygote: about 3 s
@needs_root
async def test_zygote_dies_with_its_rollout_process_even_when_it_cannot_notice() -> None:
    """The parent-death signal, not only the closed socket, ends the zygote.

    The zygote is stopped (SIGSTOP), so it cannot see its control socket close; only the kernel's
    parent-death SIGKILL can end it. As root the zygote switches uid for its uid sweeps, which
    clears that signal: it must have been re-armed.
    """
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        ROLLOUT_PROCESS,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert process.stdout is not None
    zygote = int(await asyncio.wait_for(process.stdout.readline(), 60))
    try:
        os.kill(zygote, signal.SIGSTOP)
        process.kill()
        await process.wait()
        assert await wait_until(lambda: not pid_alive(zygote))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(zygote, signal.SIGKILL)


async def test_cancelled_calls_leave_no_surplus_idle_workers() -> None:
    """Workers forked for calls that were cancelled meanwhile are not kept beyond ``prefork``."""
    async with Sandbox(SandboxConfig(prefork=1, max_concurrency=32, **LIGHT)) as box:
        zygote = box.zygote_pid
        assert zygote is not None
        for _ in range(3):
            calls = [asyncio.create_task(box.run("print(1)")) for _ in range(24)]
            for _ in range(3):
                await asyncio.sleep(0)  # let them ask for workers, then cancel (as slime's abort does)
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
        assert await wait_until(lambda: len(children_of(zygote)) <= 1), children_of(zygote)
        assert (await box.run("print('fine')")).stdout == "fine\n"


async def test_dead_zygote_is_restarted(sandbox: Sandbox) -> None:
    first = sandbox.zygote_pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    assert await wait_until(lambda: sandbox.zygote_pid != first)
    result = await sandbox.run("print('back')")
    assert result.stdout == "back\n"
    assert sandbox.zygote_pid not in (None, first)


async def test_zygote_death_during_a_call_is_an_infra_result() -> None:
    async with Sandbox(SandboxConfig(**LIGHT)) as box:
        running = asyncio.create_task(
            box.run(SET_NAME.format(name="zygotedies") + "import time\ntime.sleep(30)")
        )
        assert await wait_until(lambda: processes_named("zygotedies"))
        os.kill(box.zygote_pid, signal.SIGKILL)  # type: ignore[arg-type]
        result = await asyncio.wait_for(running, 10)
        assert result.kind is ResultKind.INFRA
        assert (await box.run("print(1)")).ok


async def test_preload_problems_are_reported_not_fatal(tmp_path: Path) -> None:
    (tmp_path / "raises_at_import.py").write_text("raise RuntimeError('broken module')\n")
    (tmp_path / "kills_interpreter.py").write_text("import os\nos._exit(3)\n")
    os.chmod(tmp_path, 0o755)
    config = SandboxConfig(
        preload_modules=("math", "raises_at_import", "kills_interpreter", "not_installed_anywhere"),
        extra_python_path=(str(tmp_path),),
        timeout_s=10,
    )
    async with Sandbox(config) as box:
        caps = box.capabilities
        assert caps["preloaded"] == ["math"]
        assert caps["preload_missing"] == ["not_installed_anywhere"]
        assert "broken module" in caps["preload_failed"]["raises_at_import"]
        assert "died" in caps["preload_failed"]["kills_interpreter"]
        assert (await box.run("print(2 + 2)")).stdout == "4\n"


async def test_a_start_cancelled_while_preloading_ends_without_a_crash_or_a_retry(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Ctrl-C during start-up cancels the zygote's start: it is not a preload crash to start again from."""
    marker = tmp_path / "importing"
    (tmp_path / "slow_to_import.py").write_text(
        f"import pathlib, time\npathlib.Path({str(marker)!r}).write_text('')\ntime.sleep(60)\n"
    )
    os.chmod(tmp_path, 0o755)
    config = SandboxConfig(
        preload_modules=("slow_to_import",), extra_python_path=(str(tmp_path),), timeout_s=10
    )
    box = Sandbox(config)
    starting = asyncio.create_task(box.start())
    assert await wait_until(marker.exists)  # the zygote is importing the slow module
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(starting, 10)
    assert "crashed the zygote" not in caplog.text
    assert box.zygote_pid is None
    await box.close()


async def test_get_shared_sandbox_is_one_per_config_and_loop() -> None:
    config = SandboxConfig(**LIGHT)
    shared = get_shared_sandbox(config)
    assert get_shared_sandbox(SandboxConfig(**LIGHT)) is shared
    assert get_shared_sandbox(SandboxConfig(timeout_s=3, preload_modules=("math",))) is not shared
    other: list[Sandbox] = []

    def on_other_loop() -> None:
        async def main() -> None:
            box = get_shared_sandbox(config)
            other.append(box)
            assert (await box.run("print('other loop')")).stdout == "other loop\n"
            await box.close()

        asyncio.run(main())

    thread = threading.Thread(target=on_other_loop)
    thread.start()
    thread.join(30)
    assert other and other[0] is not shared
    assert (await shared.run("print('this loop')")).ok
    await shared.close()
    assert get_shared_sandbox(config) is not shared  # a closed one is replaced


async def test_zygote_outlives_the_thread_whose_loop_started_it() -> None:
    """The zygote is forked by the sandbox's launcher thread, never by the loop's thread.

    Its parent-death signal is tied to the thread that forked it: had the loop's (short-lived)
    thread forked it, the zygote would die with that thread. Once that loop is closed, the next
    ``get_shared_sandbox`` kills it without waiting on the calling loop.
    """
    config = SandboxConfig(timeout_s=7, preload_modules=("math",))  # a config of its own
    started: list[int] = []

    def on_short_lived_thread() -> None:
        async def main() -> None:
            box = get_shared_sandbox(config)
            assert (await box.run("print('started')")).ok
            assert box.zygote_pid is not None
            started.append(box.zygote_pid)

        asyncio.run(main())  # never closed: as when a rollout process's loop goes away

    thread = threading.Thread(target=on_short_lived_thread)
    thread.start()
    await asyncio.to_thread(thread.join, 30)
    assert started, "the sandbox did not start on the other thread"
    zygote = started[0]
    # The parent-death signal would arrive as the thread exits: the zygote must not die from it.
    assert not await wait_until(lambda: not pid_alive(zygote), timeout=1.0)
    get_shared_sandbox(config)  # sees the closed loop and kills its sandbox
    assert await wait_until(lambda: not pid_alive(zygote))


async def test_respawning_the_zygote_does_not_block_the_loop(sandbox: Sandbox) -> None:
    """Loop-thread CPU between 5 ms ticks stays small while the zygote is killed and replaced."""
    busy: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            before = time.thread_time()
            await asyncio.sleep(0.005)
            busy.append(time.thread_time() - before)

    task = asyncio.create_task(ticker())
    for _ in range(3):
        first = sandbox.zygote_pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        assert await wait_until(lambda first=first: sandbox.zygote_pid != first)
        assert (await sandbox.run("print('back')")).stdout == "back\n"
    stop.set()
    await task
    assert len(busy) > 3
    assert max(busy) < 0.05


# ---------------------------------------------------------------- attacks


async def test_attack_read_environment_secrets() -> None:
    os.environ["STRANDS_SLIME_TEST_SECRET"] = "hunter2-do-not-leak"
    try:
        async with Sandbox(SandboxConfig(**LIGHT)) as box:
            code = dedent(
                f"""
                import os
                print(sorted(os.environ))
                for pid in ({os.getpid()}, os.getppid(), 1):
                    try:
                        print(pid, open(f"/proc/{{pid}}/environ", "rb").read()[:4000])
                    except OSError as exc:
                        print(pid, type(exc).__name__)
                """
            )
            result = await box.run(code)
    finally:
        del os.environ["STRANDS_SLIME_TEST_SECRET"]
    assert result.ok
    assert "hunter2" not in result.stdout + result.stderr
    assert "STRANDS_SLIME_TEST_SECRET" not in result.stdout
    if IS_ROOT:
        assert result.stdout.count("PermissionError") == 3


async def test_attack_fork_bomb(limited: Sandbox) -> None:
    code = SET_NAME.format(name="forkbomb") + dedent(
        """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """
    )
    began = time.monotonic()
    result = await limited.run(code, timeout=2)
    assert time.monotonic() - began < 10
    assert result.kind in (ResultKind.TIMEOUT, ResultKind.CPU_LIMIT)
    assert await wait_until(lambda: not processes_named("forkbomb"), timeout=5)
    assert (await limited.run("print('alive')")).stdout == "alive\n"


async def test_attack_memory_bomb(limited: Sandbox) -> None:
    result = await limited.run("chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))")
    assert result.kind is ResultKind.ERROR
    assert "MemoryError" in result.stderr
    huge = await limited.run("x = bytearray(10**11)")
    assert "MemoryError" in huge.stderr


async def test_attack_infinite_loop_hits_the_cpu_limit(limited: Sandbox) -> None:
    result = await limited.run("while True:\n    pass")
    assert result.kind is ResultKind.CPU_LIMIT and result.timed_out
    assert result.limit_s == 1
    assert result.duration_s < 25


async def test_attack_infinite_sleep_hits_the_wall_clock(sandbox: Sandbox) -> None:
    result = await sandbox.run("import time\nwhile True:\n    time.sleep(1)", timeout=1)
    assert result.kind is ResultKind.TIMEOUT and result.exit_code == -signal.SIGKILL
    assert 0.9 < result.duration_s < 8


async def test_attack_output_flood(limited: Sandbox) -> None:
    began = time.monotonic()
    result = await limited.run("while True:\n    print('x' * 1000)")
    assert time.monotonic() - began < 8
    assert result.kind is ResultKind.OUTPUT_LIMIT and result.truncated
    assert result.stdout_bytes > 256 * 1024
    assert len(result.stdout) < 1200
    assert "output limit exceeded" in (result.error or "")


async def test_attack_orphan_via_double_fork(sandbox: Sandbox) -> None:
    code = dedent(
        """
        import os, time
        read_end, write_end = os.pipe()
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.close(1)
                os.close(2)
                os.write(write_end, str(os.getpid()).encode())
                time.sleep(60)
                os._exit(0)
            os._exit(0)
        os.close(write_end)
        print(os.read(read_end, 100).decode())
        """
    )
    began = time.monotonic()
    result = await sandbox.run(code)
    assert result.ok and time.monotonic() - began < 8
    daemon = int(result.stdout)
    assert await wait_until(lambda: not pid_alive(daemon))


async def test_attack_orphan_holding_the_output_pipe(sandbox: Sandbox) -> None:
    code = dedent(
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                print(os.getpid(), flush=True)
                time.sleep(60)
            os._exit(0)
        time.sleep(0.2)
        """
    )
    began = time.monotonic()
    result = await sandbox.run(code)
    assert time.monotonic() - began < 8
    assert result.ok
    assert await wait_until(lambda: not pid_alive(int(result.stdout)))


@needs_root
async def test_attack_write_outside_the_workdir(sandbox: Sandbox, tmp_path: Path) -> None:
    targets = [
        beside_tests("sandbox_escape.txt"),
        "/etc/sandbox_escape.txt",
        "/root/sandbox_escape.txt",
        "/var/tmp/sandbox_escape.txt",
        str(tmp_path / "sandbox_escape.txt"),
    ]
    code = dedent(
        f"""
        for path in {targets!r}:
            try:
                with open(path, "w") as handle:
                    handle.write("escaped")
                print(path, "WRITTEN")
            except OSError as exc:
                print(path, type(exc).__name__)
        try:
            open("/etc/passwd", "a").write("x")
            print("passwd WRITTEN")
        except OSError as exc:
            print("passwd", type(exc).__name__)
        """
    )
    result = await sandbox.run(code)
    assert result.ok, result.stderr
    assert "WRITTEN" not in result.stdout
    assert not exists_any(targets)


@needs_root
async def test_attack_tmp_is_private_per_call(sandbox: Sandbox) -> None:
    if not sandbox.capabilities["mount_namespace"]:
        pytest.skip("no mount namespace here")
    marker = f"sandbox-marker-{os.getpid()}"
    first = await sandbox.run(
        f"open('/tmp/{marker}', 'w').write('x')\nopen('/dev/shm/{marker}', 'w').write('x')"
    )
    assert first.ok, first.stderr
    assert not exists_any([f"/tmp/{marker}", f"/dev/shm/{marker}"])
    second = await sandbox.run(f"import os\nprint(os.path.exists('/tmp/{marker}'))")
    assert second.stdout == "False\n"


@needs_root
async def test_dev_shm_is_a_private_writable_tmpfs_and_var_tmp_is_read_only(sandbox: Sandbox) -> None:
    """What ``SandboxConfig.private_tmp`` and docs/sandbox.md promise, checked inside the sandbox."""
    if not sandbox.capabilities["mount_namespace"]:
        pytest.skip("no mount namespace here")
    marker = f"shm-marker-{os.getpid()}"
    code = dedent(
        f"""
        import os
        mounts = {{line.split()[1]: line.split() for line in open('/proc/self/mounts')}}
        print(mounts['/dev/shm'][2], mounts['/tmp'][2], 'ro' in mounts['/var/tmp'][3].split(','))
        st = os.statvfs('/dev/shm')
        print(st.f_blocks * st.f_frsize // 2**20)
        print(os.listdir('/dev/shm'))
        open('/dev/shm/{marker}', 'w').write('x')
        try:
            open('/var/tmp/{marker}', 'w')
        except OSError as exc:
            print(type(exc).__name__)
        """
    )
    first = await sandbox.run(code)
    assert first.ok, first.stderr
    lines = first.stdout.splitlines()
    assert lines[0] == "tmpfs tmpfs True"
    assert int(lines[1]) == sandbox.config.workdir_size_mb  # the private tmpfs, not the host's /dev/shm
    assert lines[2] == "[]"  # nothing of the host's or of another call
    assert lines[3] in ("OSError", "PermissionError")  # EROFS
    assert not os.path.exists(f"/dev/shm/{marker}")
    second = await sandbox.run(f"import os\nprint(os.path.exists('/dev/shm/{marker}'))")
    assert second.stdout == "False\n"


async def test_attack_network_connection(sandbox: Sandbox) -> None:
    if sandbox.capabilities["network"] == "host":
        pytest.skip("no network namespace here")
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.5)
    port = server.getsockname()[1]
    code = dedent(
        f"""
        import socket
        for address in [("127.0.0.1", {port}), ("1.1.1.1", 80)]:
            try:
                socket.create_connection(address, timeout=2).close()
                print(address, "CONNECTED")
            except OSError as exc:
                print(address, type(exc).__name__, exc.errno)
        """
    )
    result = await sandbox.run(code)
    with pytest.raises(TimeoutError):
        server.accept()
    server.close()
    assert result.ok
    assert "CONNECTED" not in result.stdout
    assert result.stdout.count("OSError 101") == 2  # ENETUNREACH: no interface is up


@needs_root
async def test_attack_kill_the_parent(sandbox: Sandbox) -> None:
    zygote = sandbox.zygote_pid
    code = dedent(
        f"""
        import os, signal
        for pid, signum in ((os.getppid(), signal.SIGKILL), ({zygote}, signal.SIGKILL), ({os.getpid()}, 0), (1, 0)):
            try:
                os.kill(pid, signum)  # signal 0 only checks permission: never hit pytest or init
                print(pid, "KILLED")
            except OSError as exc:
                print(pid, type(exc).__name__)
        """
    )
    result = await sandbox.run(code)
    assert result.ok
    assert "KILLED" not in result.stdout
    assert sandbox.zygote_pid == zygote
    assert (await sandbox.run("print('survived')")).stdout == "survived\n"


async def test_attack_kill_the_parent_without_privilege_drop() -> None:
    async with Sandbox(SandboxConfig(drop_privileges=False, **LIGHT)) as box:
        zygote = box.zygote_pid
        result = await box.run("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")
        # The code itself may finish before the zygote's death is noticed; either way it is clear.
        assert result.kind in (ResultKind.OK, ResultKind.INFRA, ResultKind.KILLED), result
        assert await wait_until(lambda: box.zygote_pid != zygote)
        again = await box.run("print('restarted')")
        assert again.stdout == "restarted\n"
        assert box.zygote_pid != zygote


async def test_orphans_are_killed_without_privilege_drop() -> None:
    """Without per-execution uids the zygote finds orphans as its own (subreaper) children."""
    async with Sandbox(SandboxConfig(drop_privileges=False, private_tmp=False, **LIGHT)) as box:
        code = SET_NAME.format(name="orphan") + dedent(
            """
            import os, time
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    os.close(1)
                    os.close(2)
                    time.sleep(60)
                os._exit(0)
            time.sleep(0.2)
            """
        )
        result = await box.run(code)
        assert result.ok
        assert await wait_until(lambda: not processes_named("orphan"))
        assert (await box.run("import os\nprint(os.getcwd())")).stdout.startswith(tempfile.gettempdir())


async def test_attack_crash_the_interpreter(sandbox: Sandbox) -> None:
    result = await sandbox.run("import ctypes\nprint('about to crash', flush=True)\nctypes.string_at(0)")
    assert result.kind is ResultKind.KILLED
    assert result.signal_name == "SIGSEGV"
    assert result.stdout == "about to crash\n"


async def test_attack_non_utf8_output(sandbox: Sandbox) -> None:
    code = "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe raw\\n')\nsys.stdout.flush()\nprint('\\udcff')"
    result = await sandbox.run(code)
    assert result.ok
    assert result.stdout == "\ufffd\ufffd raw\n\\udcff\n"


async def test_attack_huge_file(limited: Sandbox) -> None:
    result = await limited.run("open('big.bin', 'wb').write(b'x' * (2 * 1024 * 1024))")
    assert result.kind is ResultKind.ERROR
    assert "File too large" in result.stderr


@needs_root
async def test_runs_under_an_unprivileged_uid(sandbox: Sandbox) -> None:
    low, high = sandbox.capabilities["uid_range"]
    result = await sandbox.run("import os\nprint(os.getuid(), os.geteuid(), os.getgid(), os.getgroups())")
    uid, euid, gid, groups = result.stdout.split(" ", 3)
    assert low <= int(uid) <= high and uid == euid == gid
    assert groups.strip() == "[]"
