"""data_prep.download: the same loading, validation and writing code as the hub path, on local fixtures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # the top-level data_prep (in the wheel: strands_slime.data_prep)
    sys.path.insert(0, str(REPO_ROOT))

from data_prep.download import DATASETS, DataPrepError, main, prepare, validate_row  # noqa: E402

FIXTURES = REPO_ROOT / "tests" / "data"
DAPO, AIME = DATASETS["dapo"], DATASETS["aime"]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "hf-cache"


def test_prepare_writes_slime_layout(tmp_path: Path, cache_dir: Path) -> None:
    logs: list[str] = []
    result = prepare(
        DAPO, tmp_path / "out", source=FIXTURES / "dapo_fixture.jsonl", cache_dir=cache_dir, log=logs.append
    )
    assert result.path == tmp_path / "out" / "dapo-math-17k.jsonl"
    assert (result.rows_read, result.rows_written, result.rows_invalid, result.reused_existing) == (
        6,
        6,
        0,
        False,
    )
    rows = read_jsonl(result.path)
    assert rows == read_jsonl(FIXTURES / "dapo_fixture.jsonl")  # already in slime's layout: unchanged
    assert all(set(row) == {"prompt", "label"} for row in rows)
    assert rows[0]["prompt"][0]["role"] == "user" and "Answer:" in rows[0]["prompt"][0]["content"]
    assert any("read 6 rows, wrote 6" in line for line in logs)
    assert list(result.path.parent.iterdir()) == [result.path]  # no temporary file left behind


def test_rows_are_what_slime_reads(tmp_path: Path, cache_dir: Path) -> None:
    """slime: prompt = row[--input-key prompt] (a message list), label = row[--label-key label]."""
    result = prepare(
        AIME, tmp_path, source=FIXTURES / "aime_fixture.jsonl", cache_dir=cache_dir, log=lambda _: None
    )
    for row in read_jsonl(result.path):
        prompt, label = row["prompt"], row["label"]
        assert isinstance(prompt, list) and prompt[-1]["role"] == "user"
        assert str(int(float(label))) == label  # slime's DAPO scorer's label conversion succeeds
        assert row["id"].startswith("fixture-")  # extra columns survive


def test_rerun_keeps_a_valid_file_and_force_rebuilds(tmp_path: Path, cache_dir: Path) -> None:
    source = FIXTURES / "aime_fixture.jsonl"
    first = prepare(AIME, tmp_path, source=source, cache_dir=cache_dir, log=lambda _: None)
    before = first.path.stat().st_mtime_ns
    logs: list[str] = []
    again = prepare(AIME, tmp_path, source=Path("/nonexistent"), cache_dir=cache_dir, log=logs.append)
    assert again.reused_existing and again.rows_written == 3 and first.path.stat().st_mtime_ns == before
    assert "kept" in logs[0]
    forced = prepare(AIME, tmp_path, source=source, force=True, cache_dir=cache_dir, log=lambda _: None)
    assert not forced.reused_existing and forced.rows_written == 3


def test_a_corrupt_existing_file_is_reported(tmp_path: Path, cache_dir: Path) -> None:
    (tmp_path / AIME.filename).write_text(
        '{"prompt": [{"role": "user", "content": "x"}], "label": "1"}\n{oops\n'
    )
    with pytest.raises(DataPrepError, match=r"aime-2024.jsonl:2 is not valid JSON.*--force"):
        prepare(
            AIME, tmp_path, source=FIXTURES / "aime_fixture.jsonl", cache_dir=cache_dir, log=lambda _: None
        )
    (tmp_path / AIME.filename).write_text('{"prompt": "x", "label": "one"}\n')
    with pytest.raises(DataPrepError, match="1 invalid rows; rebuild it with --force"):
        prepare(AIME, tmp_path, cache_dir=cache_dir, log=lambda _: None)


def test_invalid_rows_stop_the_build_and_write_nothing(tmp_path: Path, cache_dir: Path) -> None:
    source = FIXTURES / "dapo_fixture_invalid.jsonl"
    with pytest.raises(DataPrepError) as caught:
        prepare(DAPO, tmp_path, source=source, cache_dir=cache_dir, log=lambda _: None)
    message = str(caught.value)
    assert "5 of 7 rows are invalid; nothing was written" in message
    assert "row 1: prompt must be a non-empty list" in message
    assert "row 2: label '\\\\frac{1}{2}' is not an integer" in message
    assert "row 3: the last prompt message must be from the user" in message
    assert "row 4: label must be a string or an integer, got None" in message
    assert "and 0 more" not in message
    assert not (tmp_path / DAPO.filename).exists()


def test_skip_invalid_drops_and_counts(tmp_path: Path, cache_dir: Path) -> None:
    result = prepare(
        DAPO, tmp_path, source=FIXTURES / "dapo_fixture_invalid.jsonl", skip_invalid=True, cache_dir=cache_dir,
        log=lambda _: None,
    )  # fmt: skip
    assert (result.rows_read, result.rows_written, result.rows_invalid) == (7, 2, 5)
    assert [row["label"] for row in read_jsonl(result.path)] == ["4", "6"]


def test_parquet_and_directory_sources(tmp_path: Path, cache_dir: Path) -> None:
    import datasets

    parquet = tmp_path / "aime.parquet"
    datasets.load_dataset(
        "json", data_files=str(FIXTURES / "aime_fixture.jsonl"), split="train", cache_dir=str(cache_dir)
    ).to_parquet(str(parquet))
    from_parquet = prepare(AIME, tmp_path / "a", source=parquet, cache_dir=cache_dir, log=lambda _: None)
    # A directory as written by `hf download --local-dir DIR` holds the file under its upstream name.
    local_copy = tmp_path / "hf-local"
    local_copy.mkdir()
    (local_copy / AIME.filename).write_bytes((FIXTURES / "aime_fixture.jsonl").read_bytes())
    from_dir = prepare(AIME, tmp_path / "b", source=local_copy, cache_dir=cache_dir, log=lambda _: None)
    assert (
        read_jsonl(from_parquet.path)
        == read_jsonl(from_dir.path)
        == read_jsonl(FIXTURES / "aime_fixture.jsonl")
    )
    with pytest.raises(DataPrepError, match=r"without dapo-math-17k\.jsonl"):
        prepare(DAPO, tmp_path / "c", source=local_copy, cache_dir=cache_dir, log=lambda _: None)


def test_unreadable_source_is_a_clear_error(tmp_path: Path, cache_dir: Path) -> None:
    with pytest.raises(DataPrepError, match="does not exist"):
        prepare(AIME, tmp_path, source=tmp_path / "missing.jsonl", cache_dir=cache_dir, log=lambda _: None)
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{not json\n")
    with pytest.raises(DataPrepError, match=r"could not read .*broken\.jsonl as json"):
        prepare(AIME, tmp_path / "out", source=broken, cache_dir=cache_dir, log=lambda _: None)


def test_offline_hub_gives_instructions(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataPrepError) as caught:
        prepare(AIME, tmp_path, cache_dir=cache_dir, log=lambda _: None)
    assert caught.value.exit_code == 2
    message = str(caught.value)
    assert "cannot reach the Hugging Face hub for zhuzilin/aime-2024" in message
    assert "--source DIR" in message and "HF_ENDPOINT" in message
    assert not (tmp_path / AIME.filename).exists()


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ({"prompt": "bare string", "label": 7}, None),
        (
            {"prompt": [{"role": "user", "content": "q"}], "label": True},
            "label must be a string or an integer",
        ),
        ({"prompt": [{"role": "user", "content": "q"}], "label": "  "}, "label is empty"),
        ({"prompt": [{"role": "user", "content": "q"}], "label": "1,000"}, None),
        ({"prompt": [{"role": "robot", "content": "q"}], "label": "1"}, "role is 'robot'"),
        ({"prompt": ["q"], "label": "1"}, "prompt\\[0\\] is str"),
        ({"prompt": [{"role": "user", "content": "q"}], "label": "1", "x": float("nan")}, "NaN, Infinity"),
        ([1, 2], "row is list"),
    ],
)
def test_validate_row(row: object, problem: str | None) -> None:
    if problem is None:
        cleaned = validate_row(row, DAPO)  # type: ignore[arg-type]
        assert isinstance(cleaned["prompt"], list) and isinstance(cleaned["label"], str)
    else:
        with pytest.raises(ValueError, match=problem):
            validate_row(row, DAPO)  # type: ignore[arg-type]


@pytest.mark.slow  # 6.5 s at load 7
def test_cli_end_to_end_in_a_subprocess(tmp_path: Path) -> None:
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "cache"), "DATA_DIR": str(tmp_path / "data")}
    command = [sys.executable, "-m", "data_prep.download", "--dataset", "dapo", "--source"]
    done = subprocess.run(
        [*command, str(FIXTURES / "dapo_fixture.jsonl")],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "read 6 rows, wrote 6" in done.stdout
    assert (tmp_path / "data" / "dapo-math-17k.jsonl").is_file()
    offline = subprocess.run(
        [sys.executable, "-m", "data_prep.download", "--dataset", "aime", "--out", str(tmp_path / "o")],
        cwd=REPO_ROOT,
        env={**env, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
    )
    assert offline.returncode == 2 and "error: cannot reach the Hugging Face hub" in offline.stderr


def test_cli_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--dataset", "all", "--source", str(FIXTURES / "dapo_fixture.jsonl")])
    assert "--source FILE needs a single --dataset" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--dataset", "gsm8k"])
