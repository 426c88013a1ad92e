"""Rollout configuration: sources, precedence, validation messages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from strands_slime.config import (
    CONFIG_ENV,
    ConfigError,
    RolloutConfig,
    get_rollout_config,
    load_config,
    parse_config,
)
from strands_slime.config import main as config_main
from strands_slime.provider.limits import DEFAULT_MAX_MODEL_CALLS, ToolLimiter

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]


def test_shipped_config_is_valid_and_matches_the_slime_example() -> None:
    config = load_config(REPO / "configs" / "strands_math.yaml")
    assert config.max_tool_iters == 5 and config.tool_parser is None and config.chat_family is None
    assert config.sandbox.timeout_s == 60 and config.reward.shaping == "none"


def test_defaults_without_any_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    assert get_rollout_config(SimpleNamespace()) == RolloutConfig()
    assert get_rollout_config(None).max_tool_iters == 5
    # The chat format and its tool parser follow the tokenizer unless set.
    assert RolloutConfig().tool_parser is None and RolloutConfig().chat_family is None
    assert RolloutConfig(chat_family="Kimi_K25").chat_family == "kimi_k2"


def test_one_default_for_max_model_calls() -> None:
    """The limiter, the rollout config and the shipped YAML agree on the model-call cap."""
    shipped = load_config(REPO / "configs" / "strands_math.yaml")
    assert RolloutConfig().max_model_calls == ToolLimiter().max_model_calls == DEFAULT_MAX_MODEL_CALLS
    assert shipped.max_model_calls == DEFAULT_MAX_MODEL_CALLS
    with pytest.raises(ConfigError, match="max_model_calls"):  # past Strands' recursion limit
        parse_config({"max_model_calls": 257})


def test_precedence_inline_then_path_then_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_file = tmp_path / "env.yaml"
    env_file.write_text("max_tool_iters: 1\n")
    arg_file = tmp_path / "arg.yaml"
    arg_file.write_text("strands_slime:\n  max_tool_iters: 2\n")
    monkeypatch.setenv(CONFIG_ENV, str(env_file))
    assert get_rollout_config(SimpleNamespace()).max_tool_iters == 1
    assert get_rollout_config(SimpleNamespace(strands_slime_config=str(arg_file))).max_tool_iters == 2
    inline = SimpleNamespace(strands_slime={"max_tool_iters": 3}, strands_slime_config=str(arg_file))
    assert get_rollout_config(inline).max_tool_iters == 3


def test_file_changes_are_picked_up(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("max_tool_iters: 4\n")
    args = SimpleNamespace(strands_slime_config=str(path))
    assert get_rollout_config(args).max_tool_iters == 4
    import os

    path.write_text("max_tool_iters: 7\n")
    os.utime(path, ns=(1, 10**18))
    assert get_rollout_config(args).max_tool_iters == 7


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("max_tool_iters: many\n", "max_tool_iters"),
        ("tool_parser: nope\n", "unknown tool parser"),
        ("chat_family: nope\n", "unknown chat family"),
        ("sandbox:\n  timeout_s: -1\n", "sandbox.timeout_s"),
        ("reward:\n  shaping: wild\n", "reward.shaping"),
        ("typo_key: 1\n", "typo_key"),
        ("- a list\n", "must be a mapping"),
        ("a: [unclosed\n", "not valid YAML"),
        ("strands_slime: 3\n", "must be a mapping"),
    ],
)
def test_invalid_configs_say_where_and_what(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path)
    assert str(path) in str(info.value) or "YAML" in str(info.value) or "mapping" in str(info.value)


def test_missing_file_is_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def _validate(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "strands_slime.config", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=False,
    )


@pytest.mark.slow  # 10 s at load 7
def test_validator_command_for_the_launch_scripts_dry_run(tmp_path: Path) -> None:
    good = _validate(str(REPO / "configs" / "strands_math.yaml"))
    assert good.returncode == 0 and good.stdout.startswith("strands_slime config OK")
    misspelled = tmp_path / "bad.yaml"
    misspelled.write_text("strands_slime:\n  max_tool_iter: 3\n")
    bad = _validate(str(misspelled))
    assert bad.returncode == 1
    assert bad.stderr.count("\n") == 1 and "max_tool_iter: Extra inputs are not permitted" in bad.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("strands_slime: [unclosed\n")
    result = _validate(str(broken))
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and "not valid YAML" in result.stderr
    missing = _validate(str(tmp_path / "absent.yaml"))
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    assert _validate().returncode == 1


@pytest.mark.parametrize(
    ("content", "closest"),
    [
        (
            "max_tool_iter: 3\n",
            "max_tool_iter: Extra inputs are not permitted (did you mean 'max_tool_iters'?)",
        ),
        (
            "strands_slime:\n  client:\n    max_retry: 2\n",
            "client.max_retry: Extra inputs are not permitted (did you mean 'max_retries'?)",
        ),
        (
            "sandbox:\n  timout_s: 3\n",
            "sandbox.timout_s: Extra inputs are not permitted (did you mean 'timeout_s'?)",
        ),
        ("reward:\n  shapping: none\n", "(did you mean 'shaping'?)"),
    ],
)
def test_a_misspelled_key_names_the_closest_one(tmp_path: Path, content: str, closest: str) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert closest in str(info.value)


def test_an_unknown_key_like_no_other_gets_no_guess() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"completely_unrelated": 1})
    assert "completely_unrelated: Extra inputs are not permitted" in str(info.value)
    assert "did you mean" not in str(info.value)


def test_the_packaged_eval_config_passes_the_validator(capsys: pytest.CaptureFixture[str]) -> None:
    path = REPO / "configs" / "eval_aime.yaml"
    assert config_main([str(path)]) == 0
    assert (
        capsys.readouterr().out
        == f"strands_slime config OK: {path} (slime --eval-config with 1 dataset(s): aime)\n"
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("eval:\n  datasets: []\n", "`eval.datasets` must list at least one dataset"),
        ("eval:\n  datasets:\n    - name: a\n", "every eval dataset needs a name and a path"),
        (
            "eval:\n  defaults: {n_samples_per_eval_prompt: 0}\n  datasets:\n    - {name: a, path: x}\n",
            "dataset a: n_samples_per_eval_prompt must be a positive integer, got 0",
        ),
        (
            "eval:\n  datasets:\n    - {name: a, path: x, custom_rm_path: strands_slime.no_such_function}\n",
            "dataset a: custom_rm_path: 'strands_slime.no_such_function' is not a function",
        ),
        (
            "eval:\n  datasets:\n    - {name: a, path: x, custom_generate_function_path: no_such_module.generate}\n",
            "dataset a: custom_generate_function_path: cannot import 'no_such_module'",
        ),
        (
            "eval:\n  datasets:\n    a: {path: x, metadata_overrides: [1]}\n",
            "dataset a: metadata_overrides must be a mapping",
        ),
        (
            "eval:\n  datasets:\n    - {name: a, path: x}\nstrands_slime:\n  max_tool_iter: 3\n",
            "did you mean 'max_tool_iters'?",
        ),
    ],
)
def test_an_eval_config_is_checked_where_it_concerns_us(
    tmp_path: Path, content: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "eval.yaml"
    path.write_text(content)
    assert config_main([str(path)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("strands_slime config error: ") and message in line


def test_an_eval_section_in_a_rollout_config_says_where_it_belongs() -> None:
    with pytest.raises(ConfigError, match=r"an `eval:` section belongs to slime's --eval-config file"):
        parse_config({"eval": {"defaults": {}}, "max_tool_iters": 2})


def test_the_recipe_against_a_short_episode_budget_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    recipe = str(Path(__file__).resolve().parents[1] / "configs" / "strands_math.yaml")
    assert config_main([recipe, "--max-response-len", "32768"]) == 0
    capsys.readouterr()
    assert config_main([recipe, "--max-response-len", "1024"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        "strands_slime config error: reward.overlong_buffer_tokens (4096) must be at most half"
    )
    assert "--rollout-max-response-len (1024)" in line and "every response" in line
