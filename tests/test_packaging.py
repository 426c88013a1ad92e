"""A plain `pip install strands-slime` runs the demo and the scripted dev server; the hf backend
names its extra when torch is missing."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
PACKAGED = ("pyproject.toml", "README.md", "strands_slime", "configs", "data_prep")


def _run(*args: str, cwd: Path, timeout: float = 600, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, f"{args} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.mark.slow  # 21 s
@pytest.mark.parametrize(
    ("command", "exit_code"),
    [(["serve", "--backend", "hf", "--port", "0"], 2), (["drift", "--n-samples", "1", "--out", "{tmp}"], 2)],
)
def test_hf_backend_without_torch_names_the_extra(command: list[str], exit_code: int, tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"  # what a plain install looks like to the import
        "from strands_slime.cli import main\n"
        f"sys.exit(main({[part.format(tmp=tmp_path) for part in command]!r}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == exit_code
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and line.endswith(
        "the hf backend needs torch: pip install 'strands-slime[devserver]'"
    )


def test_packaged_configs_and_data_prep_are_the_top_level_folders() -> None:
    """One copy: the package's configs/ and data_prep/ are links to the folders users edit."""
    import strands_slime
    from strands_slime.data_prep import download

    package = Path(strands_slime.__file__).parent
    assert (package / "configs").resolve() == ROOT / "configs"
    assert Path(download.__file__).resolve() == ROOT / "data_prep" / "download.py"


def test_configs_command(capsys: pytest.CaptureFixture[str]) -> None:
    from strands_slime.cli import main

    assert main(["configs"]) == 0
    listed = capsys.readouterr().out.split()
    assert [Path(p).name for p in listed] == [
        "eval_aime.yaml",
        "qwen3_8b_model.sh",
        "strands_math.yaml",
        "strands_math_verifier.yaml",
    ]
    assert main(["configs", "strands_math.yaml"]) == 0
    assert capsys.readouterr().out == (ROOT / "configs" / "strands_math.yaml").read_text()
    assert main(["configs", "eval_aime.yaml", "--path"]) == 0
    assert (
        Path(capsys.readouterr().out.strip()).read_text() == (ROOT / "configs" / "eval_aime.yaml").read_text()
    )
    assert main(["configs", "nope.yaml"]) == 2
    assert capsys.readouterr().err.startswith(
        "error: no packaged config 'nope.yaml'; there are: eval_aime.yaml"
    )


def test_data_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from strands_slime.cli import main

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    source = ROOT / "tests" / "data" / "dapo_fixture.jsonl"
    assert main(["data", "--dataset", "dapo", "--source", str(source), "--out", str(tmp_path)]) == 0
    assert "read 6 rows, wrote 6" in capsys.readouterr().out
    assert len((tmp_path / "dapo-math-17k.jsonl").read_text().splitlines()) == 6
    with pytest.raises(SystemExit):
        main(["data", "--help"])
    assert capsys.readouterr().out.startswith("usage: strands-slime data")


def _readme_offline_pair_works(venv: Path, cwd: Path, env: dict[str, str]) -> None:
    """The README's serve + rollout pair, as written (another port), from a plain install, offline."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("These two work as written", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    port = str(_free_port())
    serve, rollout = (line.replace("30000", port) for line in block.strip().splitlines())
    assert serve.startswith("strands-slime serve") and serve.endswith(" &")
    env = {**env, "PATH": f"{venv / 'bin'}:{env['PATH']}", "HF_HUB_OFFLINE": "1"}
    server = subprocess.Popen(
        ["bash", "-c", "exec " + serve.removesuffix("&")],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().startswith("DEVSERVER_URL=")
        done = subprocess.run(
            ["bash", "-c", rollout], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert done.returncode == 0, done.stderr
    assert "accuracy: 0.800" in done.stdout and (cwd / "runs" / "offline" / "report.html").is_file()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_no_target_installs_system_packages_unasked() -> None:
    """Only `make chromium` runs apt-get (CI's .ci/run asks for it); the test and demo targets do not."""
    for target in ("test", "test-fast", "test-slow", "demo", "lint"):
        dry = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert dry.returncode == 0 and "apt-get" not in dry.stdout, target
    assert "apt-get install" in (ROOT / "Makefile").read_text().split("\nchromium:", 1)[1].split("\n\n", 1)[0]


@pytest.mark.slow
def test_the_devserver_extra_brings_a_cpu_torch_and_no_cuda() -> None:
    """`pip install 'strands-slime[devserver]'` resolves (here) to torch's CPU build: no nvidia-* wheels,
    no triton (what used to make a 5.8 GB venv of a CPU dev server)."""
    report = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q", "--report", "-"]
        + [f"{ROOT}[devserver]"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert report.returncode == 0, report.stderr
    versions = {
        item["metadata"]["name"]: item["metadata"]["version"] for item in json.loads(report.stdout)["install"]
    }
    assert versions["torch"] == "2.13.0+cpu"
    assert not [name for name in versions if name.startswith(("nvidia-", "triton", "cuda-"))]


@pytest.mark.slow
def test_wheel_in_a_fresh_venv_runs_demo_and_scripted_server(tmp_path: Path) -> None:
    """Build the wheel, install it with its core dependencies only (from the package index) into a
    new venv, and use it from outside the checkout."""
    source = tmp_path / "source"  # build from a copy: nothing written into the checkout
    source.mkdir()
    for name in PACKAGED:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr
    assert "license" not in build.stderr.lower(), "the licence metadata is what setuptools asks for"
    (wheel,) = dist.glob("strands_slime-*.whl")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", str(venv), cwd=tmp_path, env=env)
    _run(str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel), cwd=tmp_path, env=env)
    freeze = _run(str(venv / "bin" / "python"), "-m", "pip", "freeze", cwd=tmp_path, env=env)
    assert "torch==" not in freeze and "pytest==" not in freeze, "core install only"
    cli = str(venv / "bin" / "strands-slime")

    out = _run(cli, "demo", "--out", str(tmp_path / "demo"), cwd=tmp_path, env=env)
    assert "accuracy: 0.800" in out and (tmp_path / "demo" / "report.html").is_file()
    _readme_offline_pair_works(venv, tmp_path, env)

    server = subprocess.Popen(
        [cli, "serve", "--backend", "scripted", "--port", "0"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("DEVSERVER_URL="), line
        request = urllib.request.Request(
            line.strip().split("=", 1)[1] + "/generate",
            data=json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 8}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            body = json.loads(response.read())
        assert body["output_ids"] and body["meta_info"]["finish_reason"]["type"] in ("stop", "length")
    finally:
        server.terminate()
        server.wait(timeout=30)

    configs = _run(cli, "configs", "strands_math.yaml", cwd=tmp_path, env=env)
    assert configs == (ROOT / "configs" / "strands_math.yaml").read_text()
    data = subprocess.run(
        [cli, "data", "--dataset", "aime", "--source", str(ROOT / "tests" / "data" / "aime_fixture.jsonl")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert data.returncode == 2 and "pip install 'strands-slime[data]'" in data.stderr, "data_prep ships"

    hf = subprocess.run(
        [cli, "serve", "--backend", "hf", "--port", "0"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert hf.returncode == 2 and "pip install 'strands-slime[devserver]'" in hf.stderr


def test_the_training_install_lines_bring_the_fast_tokenizer() -> None:
    """The rollout's CPU figures (docs/benchmarks.md) are with the fast-tokenizer extra: the install
    lines a user copies for training bring it, so the path users install is the path measured."""
    root = Path(__file__).resolve().parent.parent
    for doc in ("README.md", "docs/training.md"):
        lines = [
            line for line in (root / doc).read_text().splitlines() if line.startswith("pip install -e '.[")
        ]
        assert lines and all("fast-tokenizer" in line.split("'")[1] for line in lines), (doc, lines)
