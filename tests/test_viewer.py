"""strands-slime view: the self-contained HTML report, checked as data and in a real headless Chromium."""

from __future__ import annotations

import base64
import gzip
import json
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest
from chromium import chromium, find_chromium

from benchmarks.devserver_runners import DevServerThread
from benchmarks.fault_injection import inject_fault
from strands_slime.cli import RolloutOptions, main, run_rollout
from strands_slime.episode_metadata import EpisodeMetadata
from strands_slime.rollout.run_summary import sample_overview
from strands_slime.viewer import (
    KIND_MODEL,
    KIND_PLACEHOLDER,
    KIND_PROMPT,
    KIND_TOOL,
    ReportError,
    build_report,
    write_report,
)

pytestmark = pytest.mark.integration

DEMO = Path(__file__).resolve().parents[1] / "strands_slime" / "data" / "demo_problems.jsonl"
SCRIPT = DEMO.with_name("demo_script.json")
CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (`apt-get install chromium`; `make chromium` does it as root)",
)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real rollout of the bundled problems (scripted dev server, real sandbox and reward)."""
    import asyncio

    out = tmp_path_factory.mktemp("demo-run")
    asyncio.run(run_rollout(RolloutOptions(data=DEMO, out=out, n_samples=2, quiet=True)))
    return out


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real rollout whose server fails its first 4 requests (no retries): 4 of the 10 episodes fail
    at their first model call, the other 6 run as in ``demo_run``."""
    import asyncio

    out = tmp_path_factory.mktemp("failing-run") / "run"
    config = out.parent / "no-retries.yaml"
    config.write_text("strands_slime:\n  client:\n    max_retries: 0\n")
    with DevServerThread("scripted", script=SCRIPT) as server:
        inject_fault(server, status=500, count=4, message="engine on fire")
        options = RolloutOptions(
            data=DEMO,
            out=out,
            base_url=server.url,
            config=config,
            n_samples=2,
            quiet=True,
            max_failure_rate=1,
        )
        asyncio.run(run_rollout(options))
    return out


def _records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]


def _embedded(html: str) -> dict[str, Any]:
    match = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)
    assert match, "the report embeds its data"
    return json.loads(match.group(1))


def _inflate(packed: str) -> Any:
    return json.loads(gzip.decompress(base64.b64decode(packed)))


def test_report_embeds_every_token_with_its_class_and_logprob(demo_run: Path, qwen3_tokenizer: Any) -> None:
    path = write_report(demo_run, tokenizer=qwen3_tokenizer)
    assert path == demo_run / "report.html"
    html = path.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), "no external resources"
    data = _embedded(html)
    records = [json.loads(line) for line in (demo_run / "samples.jsonl").read_text().splitlines()]
    heavy = [sample for packed in data["chunks"] for sample in _inflate(packed)]
    vocab = _inflate(data["vocab"])
    assert len(data["rows"]) == len(heavy) == len(records) == 10
    assert data["summary"]["evaluation"]["accuracy"] == pytest.approx(0.8)
    for row, sample, record in zip(data["rows"], heavy, records, strict=True):
        assert sample["tok"] == record["tokens"]
        kinds = [
            kind
            for k in range(0, len(sample["seg"]), 2)
            for kind in [sample["seg"][k]] * sample["seg"][k + 1]
        ]
        prompt_length = len(record["tokens"]) - record["response_length"]
        assert kinds[:prompt_length] == [KIND_PROMPT] * prompt_length
        expected = [KIND_MODEL if m else KIND_TOOL for m in record["loss_mask"]]
        assert kinds[prompt_length:] == expected
        model_logprobs = [
            lp for lp, m in zip(record["rollout_log_probs"], record["loss_mask"], strict=True) if m
        ]
        assert sample["lp"] == [round(lp * 100) for lp in model_logprobs]
        assert row["r"] == record["reward"] and row["s"] == record["status"]
        episode = EpisodeMetadata.from_metadata(record["metadata"])
        assert row["tc"] == episode.tool_calls and row["t"] == episode.turns == len(row["lat"])
        assert row["f"] == episode.finish_reason == "stop" and row["lat"] == pytest.approx(
            episode.turn_seconds, abs=1e-4
        )
        assert episode.reward_details is not None and row["pr"] == episode.reward_details["pred"]
        assert sample["meta"] == record["metadata"]
        text = "".join(vocab[str(t)] for t in record["tokens"][prompt_length:])
        assert text == qwen3_tokenizer.decode(record["tokens"][prompt_length:], skip_special_tokens=False)


def test_report_without_tokenizer_keeps_ids(tmp_path: Path, demo_run: Path) -> None:
    path = write_report(demo_run / "samples.jsonl", tmp_path / "ids.html", tokenizer=None)
    assert _embedded(path.read_text())["vocab"] is None


def test_report_text_cannot_break_out_of_the_script_element() -> None:
    record = {"tokens": [1, 2], "loss_mask": [1], "response_length": 1, "label": "</script><b>x</b><!--"}
    html = build_report([record])
    assert "</script><b>" not in html and _embedded(html)["rows"][0]["l"] == record["label"]


def test_logprobs_missing_or_not_finite_are_shown_without_heat() -> None:
    records = [
        {"tokens": [1, 2, 3, 4], "loss_mask": [1, 0, 1], "response_length": 3, "rollout_log_probs": None},
        {
            "tokens": [1, 2, 3, 4],
            "loss_mask": [1, 1, 1],
            "response_length": 3,
            "rollout_log_probs": [float("nan"), float("-inf"), -0.123],
        },
    ]
    heavy = _inflate(_embedded(build_report(records))["chunks"][0])
    assert heavy[0]["lp"] == [None, None] and heavy[0]["seg"] == [0, 1, 1, 1, 2, 1, 1, 1]
    assert heavy[1]["lp"] == [None, -99_999, -12]


def _view_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """``strands-slime view`` must fail as every command does: status 2, one ``error:`` line."""
    assert main(["view", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def test_bad_input_is_reported_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "has no samples.jsonl" in _view_error(capsys, [str(tmp_path), "--no-tokenizer"])
    bad = tmp_path / "samples.jsonl"
    bad.write_text('{"tokens": [1], "loss_mask": [], "response_length": 0}\nnot json\n{"tokens": [1]}\n')
    assert "samples.jsonl:2: not JSON" in _view_error(capsys, [str(bad), "--no-tokenizer"])
    bad.write_text('{"tokens": [1, 2], "loss_mask": [1, 1, 1], "response_length": 3}\n')
    with pytest.raises(ReportError, match="loss_mask has 3 entries"):
        write_report(bad)
    assert not (tmp_path / "report.html").exists(), "nothing half-written"


def test_rows_read_the_episode_record_and_the_transcript_stays_out_of_the_page() -> None:
    transcript = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Answer: 5"}]
    episode = EpisodeMetadata(
        tool_calls=2,
        turns=2,
        finish_reason="length",
        turn_seconds=[0.25, 0.5],
        transcript=transcript,
        reward_details={"acc": True, "pred": "5"},
    )
    metadata = {"dataset_key": "kept", **episode.to_metadata()}
    record = {"tokens": [1, 2, 3], "loss_mask": [1, 1], "response_length": 2, "metadata": metadata}
    data = _embedded(build_report([record]))
    row = data["rows"][0]
    assert (row["tc"], row["t"], row["f"], row["lat"], row["pr"]) == (2, 2, "length", [0.25, 0.5], "5")
    shown = _inflate(data["chunks"][0])[0]["meta"]
    assert transcript not in shown.values() and "Answer: 5" not in json.dumps(shown)
    assert shown == {key: value for key, value in metadata.items() if value is not transcript}
    assert shown["dataset_key"] == "kept" and shown["reward_details"] == {"acc": True, "pred": "5"}


def test_a_torn_last_line_is_left_out_with_a_note(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A run killed mid-write leaves a last line without its newline: --resume drops it, so does view."""
    samples = tmp_path / "samples.jsonl"
    good = {"index": 0, "tokens": [1, 2], "loss_mask": [1], "response_length": 1}
    samples.write_text(json.dumps(good) + "\n" + json.dumps({**good, "index": 1})[:20])
    assert main(["view", str(samples), "--no-tokenizer"]) == 0
    assert [row["i"] for row in _embedded((tmp_path / "report.html").read_text())["rows"]] == [0]
    assert f"note: the last line of {samples} was cut short" in caplog.text
    assert samples.read_text().endswith(json.dumps({**good, "index": 1})[:20]), "view changes nothing"


def test_metadata_of_another_shape_names_the_sample(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    samples = tmp_path / "samples.jsonl"
    good = {"index": 0, "tokens": [1, 2], "loss_mask": [1], "response_length": 1, "metadata": {}}
    cases = [
        (["tool_calls"], r"sample 1: sample\.metadata must be a mapping, got list"),
        ({"tool_calls": "many"}, r"sample 1: metadata tool_calls is 'many', not a number"),
        ({"turn_seconds": 0.5}, r"sample 1: metadata turn_seconds is 0\.5, not a list"),
        ({"turn_seconds": [0.1, None]}, r"sample 1: metadata turn_seconds is None, not a number"),
    ]
    for metadata, message in cases:
        bad = {**good, "index": 1, "metadata": metadata}
        samples.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
        assert re.search(message, _view_error(capsys, [str(samples), "--no-tokenizer"]))
        assert not (tmp_path / "report.html").exists(), "nothing half-written"
    samples.write_text(json.dumps({**good, "metadata": None}) + "\n")  # no metadata at all: defaults
    assert _embedded(write_report(samples).read_text())["rows"][0]["tc"] == 0


def test_rollout_writes_the_report_and_prints_its_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["rollout", "--data", str(DEMO), "--limit", "1", "--out", str(tmp_path)]) == 0
    assert f"report: {tmp_path / 'report.html'}" in capsys.readouterr().out
    assert len(_embedded((tmp_path / "report.html").read_text())["rows"]) == 1


# ---------------------------------------------------------------------------------------------- browser


@needs_chromium
async def test_report_in_chromium_sample_view_and_filters(
    demo_run: Path, qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    path = write_report(demo_run, tmp_path / "report.html", tokenizer=qwen3_tokenizer)
    records = [json.loads(line) for line in (demo_run / "samples.jsonl").read_text().splitlines()]
    async with chromium(CHROMIUM, tmp_path / "profile") as browser:  # type: ignore[arg-type]
        page = await browser.open(path.as_uri())
        await page.wait_for("document.body.dataset.ready === '1'")
        assert await page.evaluate("document.querySelectorAll('#plots svg').length") == 5
        assert await page.evaluate("document.querySelectorAll('#rows tr').length") == 10
        await page.screenshot(tmp_path / "run.png")

        # open a sample with a tool call: folded call, folded result, model tokens heat-coloured
        solved = next(  # samples are written as they finish: find it by its problem, not its place
            r
            for r in records
            if r["label"] == "5050" and r["metadata"]["tool_calls"] == 1 and r["reward"] == 1.0
        )
        await page.evaluate(f"document.querySelector('#rows tr[data-p=\"{records.index(solved)}\"]').click()")
        await page.wait_for("!!document.querySelector('#detail .stream')")
        counts = await page.evaluate(
            "[0, 1, 2].map(k => document.querySelectorAll('#detail .seg.k' + k).length)"
        )
        assert counts == [1, solved["metadata"]["turns"], 1], "prompt, model turns, tool result"
        call_summary = await page.evaluate(
            "document.querySelector('#detail details.call summary').textContent"
        )
        assert call_summary.startswith("tool call: execute_python_code")
        model_spans = await page.evaluate("document.querySelectorAll('#detail .t.k1').length")
        assert model_spans == sum(solved["loss_mask"])
        coloured = await page.evaluate(
            "[...document.querySelectorAll('#detail .t.k1')].filter(s => s.style.background).length"
        )
        assert coloured == model_spans, "every model token has a logprob colour"
        # results and the prompt are folded: their tokens are rendered only when opened
        assert await page.evaluate("document.querySelectorAll('#detail .t.k2').length") == 0
        await page.evaluate("document.querySelectorAll('#detail details.seg.k2').forEach(d => d.open = true)")
        await page.wait_for("document.querySelectorAll('#detail .t.k2').length > 0")
        tool_text = await page.evaluate(
            "[...document.querySelectorAll('#detail .t.k2')].map(s => s.textContent).join('')"
        )
        assert "<tool_response>\n5050\n</tool_response>" in tool_text
        await page.screenshot(tmp_path / "sample.png", full_page=True)

        # filters: reward <= 0 keeps the wrong answers only; a status filter; an index range
        await page.evaluate(
            "(() => { const f = document.getElementById('f-rmax'); f.value = '0';"
            " f.dispatchEvent(new Event('input')); })()"
        )
        wrong = sorted(r["index"] for r in records if r["reward"] <= 0)
        shown = await page.evaluate(
            "[...document.querySelectorAll('#rows tr')].map(t => Number(t.cells[0].textContent))"
        )
        assert sorted(shown) == wrong and len(wrong) == 2
        assert await page.evaluate("document.getElementById('f-count').textContent") == "2 of 10 samples"
        await page.evaluate(
            "(() => { document.getElementById('f-rmax').value = ''; const f = document.getElementById('f-index');"
            " f.value = '3-5'; f.dispatchEvent(new Event('input')); })()"
        )
        shown = await page.evaluate(
            "[...document.querySelectorAll('#rows tr')].map(t => Number(t.cells[0].textContent))"
        )
        assert sorted(shown) == [3, 4, 5]  # samples.jsonl is in completion order
        options = await page.evaluate("[...document.getElementById('f-status').options].map(o => o.value)")
        assert options == ["", "completed"]
        await page.evaluate(
            "(() => { const f = document.getElementById('f-status'); f.value = 'completed';"
            " f.dispatchEvent(new Event('input')); })()"
        )
        assert await page.evaluate("document.querySelectorAll('#rows tr').length") == 3
        await page.screenshot(tmp_path / "filtered.png")
    for name in ("run.png", "sample.png", "filtered.png"):
        assert (tmp_path / name).stat().st_size > 10_000


def test_failed_samples_carry_their_reason_and_no_made_up_turn(failing_run: Path, tmp_path: Path) -> None:
    data = _embedded(write_report(failing_run, tmp_path / "report.html").read_text())
    heavy = [sample for packed in data["chunks"] for sample in _inflate(packed)]
    records = _records(failing_run)
    assert sum(r["status"] == "failed" for r in records) == 4
    for row, sample, record in zip(data["rows"], heavy, records, strict=True):
        assert row["pt"] == record["prompt"][-1]["content"] and row["l"] == record["label"]
        if record["status"] == "failed":
            assert row["x"].startswith("SGLangHTTPError: HTTP 500") and "engine on fire" in row["x"]
            assert row["c"] is False and row["pr"] is None
            # the untrained token slime needs as a response is not shown as a tool result or user turn
            prompt_length = len(record["tokens"]) - record["response_length"]
            assert sample["seg"] == [KIND_PROMPT, prompt_length, KIND_PLACEHOLDER, record["response_length"]]
        else:
            assert row["x"] is None and row["c"] == (record["reward"] == 1.0)
            assert KIND_PLACEHOLDER not in sample["seg"][::2]


@needs_chromium
async def test_report_in_chromium_shows_failures_and_searches_and_sorts(
    failing_run: Path, qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    path = write_report(failing_run, tmp_path / "report.html", tokenizer=qwen3_tokenizer)
    records = _records(failing_run)
    correct = sum(1 for r in records if r["status"] != "failed" and r["reward"] == 1.0)
    async with chromium(CHROMIUM, tmp_path / "profile") as browser:  # type: ignore[arg-type]
        page = await browser.open(path.as_uri())
        await page.wait_for("document.body.dataset.ready === '1'")
        # the run page: how many failed and why, and the accuracy over every sample
        heading = await page.evaluate("document.querySelector('#failures h2').textContent")
        assert heading == "4 of 10 samples failed (40.0%), 1 reason"
        reasons = await page.evaluate(
            "[...document.querySelectorAll('#failures tr')].map(tr => [...tr.cells].map(c => c.textContent))"
        )
        assert len(reasons) == 1 and reasons[0][0] == "4" and "engine on fire" in reasons[0][1]
        stats = await page.evaluate(
            "Object.fromEntries([...document.querySelectorAll('#stats span')]"
            ".map(s => [s.dataset.stat, s.querySelector('b').textContent]))"
        )
        assert stats["failed"] == "4 (40.0%)"
        assert float(stats["accuracy"]) == pytest.approx(correct / 10, abs=1e-3)
        assert float(stats["accuracy without failures"]) == pytest.approx(correct / 6, abs=1e-3)
        await page.screenshot(tmp_path / "failures.png", full_page=True)

        # the list: sample order (not finishing order), with prompt, label and prediction columns
        header = await page.evaluate(
            "[...document.querySelectorAll('#columns th')].map(th => th.textContent)"
        )
        assert header == [
            "#",
            "group",
            "status",
            "reward",
            "prompt",
            "label",
            "prediction",
            "tokens",
            "tools",
            "turns",
        ]
        column = "[...document.querySelectorAll('#rows tr')].map(t => t.cells[{}].textContent)"
        assert await page.evaluate(column.format(0)) == [str(i) for i in range(10)]
        by_index = sorted(records, key=lambda r: r["index"])
        assert await page.evaluate(column.format(5)) == [r["label"] for r in by_index]

        # a click on a failure reason lists those samples; one opens with its reason on top
        await page.evaluate("document.querySelector('#failures button.reason').click()")
        assert await page.evaluate("document.getElementById('f-count').textContent") == "4 of 10 samples"
        assert set(await page.evaluate(column.format(2))) == {"failed (removed)"}
        await page.evaluate("document.querySelector('#rows tr').click()")
        await page.wait_for("!!document.querySelector('#detail .failure')")
        banner = await page.evaluate("document.querySelector('#detail .failure').textContent")
        assert banner.startswith("failed: SGLangHTTPError: HTTP 500") and "engine on fire" in banner
        kinds = await page.evaluate(
            "[0, 1, 2, 3].map(k => document.querySelectorAll('#detail .seg.k' + k).length)"
        )
        assert kinds == [1, 0, 0, 1], "the prompt, then the placeholder: no model turn, no tool or user turn"
        await page.screenshot(tmp_path / "failed-sample.png", full_page=True)

        # search: any word of the prompt, label, prediction, failure reason or final answer
        def shown_for(words: str) -> list[int]:
            found = []
            for record in by_index:
                overview = sample_overview(record)
                fields = [overview["prompt"], overview["label"], overview["prediction"], overview["failure"]]
                fields.append(overview["final_text"][-300:])
                if words in "\n".join(str(f) for f in fields if f is not None).lower():
                    found.append(record["index"])
            return found

        for words in ("5050", "positive divisors", "engine on fire"):
            await page.evaluate(
                "(() => { const f = document.getElementById('f-search'); f.value = "
                + json.dumps(words)
                + "; f.dispatchEvent(new Event('input')); })()"
            )
            assert [int(i) for i in await page.evaluate(column.format(0))] == shown_for(words), words
        assert shown_for("5050") and len(shown_for("engine on fire")) == 4

        # sorting: a click on a column sorts by it, a second click reverses it
        await page.evaluate(
            "(() => { const f = document.getElementById('f-search'); f.value = '';"
            " f.dispatchEvent(new Event('input')); })()"
        )
        await page.evaluate("document.querySelector('#columns th[data-key=\"r\"]').click()")
        rewards = [float(x) for x in await page.evaluate(column.format(3))]
        assert rewards == sorted(rewards) and len(rewards) == 10
        await page.evaluate("document.querySelector('#columns th[data-key=\"r\"]').click()")
        assert [float(x) for x in await page.evaluate(column.format(3))] == sorted(rewards, reverse=True)
        assert (
            await page.evaluate(
                "document.querySelector('#columns th[data-key=\"r\"]').getAttribute('aria-sort')"
            )
            == "descending"
        )
    for name in ("failures.png", "failed-sample.png"):
        assert (tmp_path / name).stat().st_size > 10_000


def _many_samples(records: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """``count`` samples made from real ones, with varied rewards, statuses and latencies."""
    rng = random.Random(0)
    statuses = ["completed"] * 8 + ["truncated", "aborted"]
    out = []
    for index in range(count):
        record = json.loads(json.dumps(records[index % len(records)]))
        record["index"], record["group_index"] = index, index // 8
        record["reward"] = rng.choice([1.0, 0.0, -1.1])
        record["status"] = rng.choice(statuses)
        record["metadata"]["turn_seconds"] = [rng.random() for _ in range(record["metadata"]["turns"])]
        out.append(record)
    return out


@pytest.mark.slow
@needs_chromium
async def test_report_of_10000_samples_is_compact_and_opens_fast(
    demo_run: Path, qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    records = [json.loads(line) for line in (demo_run / "samples.jsonl").read_text().splitlines()]
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in _many_samples(records, 10_000)))
    started = time.perf_counter()
    path = write_report(samples, tokenizer=qwen3_tokenizer)
    build_seconds = time.perf_counter() - started
    size = path.stat().st_size
    assert size < 0.2 * samples.stat().st_size, f"{size} bytes for {samples.stat().st_size} bytes of samples"
    assert build_seconds < 60
    async with chromium(CHROMIUM, tmp_path / "profile") as browser:  # type: ignore[arg-type]
        page = await browser.open(path.as_uri())
        await page.wait_for("document.body.dataset.ready === '1'", timeout=30)
        ready_ms = await page.evaluate("window.readyMs")
        assert ready_ms < 5000, f"ready after {ready_ms:.0f} ms"
        assert await page.evaluate("document.querySelectorAll('#rows tr').length") == 100, "one page rendered"
        aborted = sum(
            1 for line in samples.read_text().splitlines() if json.loads(line)["status"] == "aborted"
        )
        await page.evaluate(
            "(() => { const f = document.getElementById('f-status'); f.value = 'aborted';"
            " f.dispatchEvent(new Event('input')); })()"
        )
        assert (
            await page.evaluate("document.getElementById('f-count').textContent")
            == f"{aborted} of 10000 samples"
        )
        await page.evaluate(
            "(() => { const f = document.getElementById('f-status'); f.value = '';"
            " f.dispatchEvent(new Event('input')); })()"
        )
        # the last sample lives in the last chunk: inflated on demand
        await page.evaluate(
            "(() => { const f = document.getElementById('f-index'); f.value = '9999';"
            " f.dispatchEvent(new Event('input')); })()"
        )
        await page.evaluate("document.querySelector('#rows tr').click()")
        await page.wait_for(
            "document.querySelector('#detail h2') && document.querySelector('#detail h2').textContent === 'sample 9999'"
        )
        assert await page.evaluate("document.querySelectorAll('#detail .t.k1').length") == sum(
            records[9999 % len(records)]["loss_mask"]
        )
        await page.screenshot(tmp_path / "large.png")


def test_the_prompt_column_shows_what_tells_the_rows_apart() -> None:
    """A dataset whose prompts share an instruction and a reminder (DAPO-math's): the list shows each
    problem, marked where the shared text was left out; a prompt without shared text stays whole."""
    instruction = "Solve the following math problem step by step. The last line is Answer: $Answer."
    reminder = 'Remember to put your answer on its own line after "Answer:".'
    problems = ["What is 2 + 2?", "Find the 10th prime.\n\nUse Python.", "What is 3 * 3?"]
    prompts = [f"{instruction}\n\n{problem}\n\n{reminder}" for problem in problems]
    prompts += [prompts[0], "A prompt of its own.", f"{instruction}\n\n"]
    records = [
        {"tokens": [1, 2], "loss_mask": [1], "response_length": 1, "prompt": prompt, "index": i}
        for i, prompt in enumerate(prompts)
    ]
    rows = _embedded(build_report(records))["rows"]
    assert [row["pt"] for row in rows] == prompts, "the tooltip and the search keep the whole prompt"
    shown = [row.get("ps", row["pt"]) for row in rows]
    assert shown == [
        "… What is 2 + 2? …",
        "… Find the 10th prime.\n\nUse Python. …",
        "… What is 3 * 3? …",
        "… What is 2 + 2? …",
        "A prompt of its own.",
        f"{instruction}\n\n",
    ]


def test_the_browser_tests_skip_message_names_what_installs_chromium() -> None:
    root = Path(__file__).resolve().parents[1]
    reason = needs_chromium.kwargs["reason"]
    assert "`make chromium`" in reason and "make test" not in reason
    assert "\nchromium:" in (root / "Makefile").read_text(), "the target the message names"
    assert "make chromium" in (root / ".ci" / "run").read_text(), "CI asks for it"
