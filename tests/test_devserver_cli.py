"""Running the dev server: command line, subprocess helper and background thread."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import urllib.request

import pytest

from benchmarks.devserver_runners import DevServerProcess, DevServerThread
from benchmarks.fault_injection import inject_fault
from strands_slime.devserver import URL_LINE_PREFIX, serve_main
from strands_slime.provider.client import SGLangClient

pytestmark = pytest.mark.integration


def post_json(url: str, payload: dict) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_help_and_usage_errors_return_codes(capsys):
    assert serve_main(["--help"]) == 0
    assert "--token-latency" in capsys.readouterr().out
    assert serve_main(["--backend", "nope"]) == 2
    assert serve_main(["--latency", "-1"]) == 2


def test_bad_speculative_option_is_reported(capsys):
    assert serve_main(["--speculative-num-draft-tokens", "4", "--port", "0"]) == 2
    assert "speculative_num_draft_tokens needs speculative_algorithm" in capsys.readouterr().err


@pytest.mark.slow  # a child Python process: ~1.5-4 s
async def test_speculative_options_reach_the_server():
    options = ["--speculative-algorithm", "EAGLE", "--speculative-num-draft-tokens", "5"]
    async with DevServerProcess(options) as server, SGLangClient(server.url, max_retries=0) as client:
        assert await client.reserved_context_tokens() == 5


def test_missing_script_file_is_reported(capsys, tmp_path):
    assert serve_main(["--script", str(tmp_path / "missing.yaml"), "--port", "0"]) == 2
    assert "cannot read script" in capsys.readouterr().err


@pytest.mark.slow  # a child Python process: ~1.5-4 s
def test_subprocess_prints_url_and_serves(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"replies": ["from a child process"]}]))
    # start_timeout only guards against a hang; start-up speed is not a unit-test property.
    with DevServerProcess(
        ["--backend", "scripted", "--script", str(script), "--weight-version", "w1"], start_timeout=120
    ) as server:
        assert server.url.startswith("http://127.0.0.1:")
        body = post_json(server.url + "/generate", {"input_ids": [1, 2, 3]})
        assert body["text"] == "from a child process" and body["meta_info"]["weight_version"] == "w1"
        process = server.process
    assert process is not None and process.poll() is not None  # killed on exit


@pytest.mark.slow  # a child Python process: ~1.5-4 s
def test_module_entry_point_prints_a_parseable_url_line():
    process = subprocess.Popen(
        [sys.executable, "-m", "strands_slime.devserver", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        readable, _, _ = select.select([process.stdout], [], [], 120)  # a hang guard, not a timing check
        assert readable, "no URL line within 120 s"
        line = process.stdout.readline()
        assert line.startswith(URL_LINE_PREFIX) and line.strip().split("=", 1)[1].startswith("http://")
    finally:
        process.terminate()
        assert process.wait(timeout=60) == 0  # SIGTERM is a clean shutdown
        process.stdout.close()


def test_subprocess_failure_carries_stderr(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    with (
        pytest.raises(RuntimeError, match="rules: List should have at least 1 item"),
        DevServerProcess(["--script", str(bad)]),
    ):
        pass


@pytest.mark.slow
def test_hf_subprocess_starts_and_answers_a_1k_prompt():
    """Imports torch and builds the model in a child process (several seconds): the slow lane. The
    deadline only guards against a hang; docs/devserver.md reports the measured start-up time."""
    with DevServerProcess(["--backend", "hf", "--context-length", "8192"], start_timeout=180) as server:
        body = post_json(
            server.url + "/generate",
            {
                "input_ids": [(7 * i) % 150000 + 10 for i in range(1024)],
                "sampling_params": {"max_new_tokens": 8},
            },
        )
    assert body["meta_info"]["prompt_tokens"] == 1024 and body["output_ids"]


def test_thread_runner_for_sync_callers():
    with DevServerThread("scripted", script=[{"replies": ["threaded"]}]) as server:
        assert post_json(server.url + "/generate", {"input_ids": [4, 5]})["text"] == "threaded"
        inject_fault(server, status=503)
        with pytest.raises(urllib.error.HTTPError) as caught:
            post_json(server.url + "/generate", {"input_ids": [4, 5]})
        assert caught.value.code == 503
        assert [entry["status"] for entry in server.request_log] == [200, 503]
        server.clear_request_log()
        assert server.request_log == []


@pytest.mark.slow  # a child Python process: ~1.5-4 s
async def test_async_use_of_the_subprocess_helper():
    async with DevServerProcess([]) as server, SGLangClient(server.url, max_retries=0) as client:
        assert await client.health()
        assert await client.reserved_context_tokens() == 0
        assert (await client.generate([1, 2], {})).text == "Hello from the strands_slime dev server."
