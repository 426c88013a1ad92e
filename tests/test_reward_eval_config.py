"""configs/eval_aime.yaml, loaded the way slime's ``--eval-config`` loads it (OmegaConf, resolve=True)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import strands_slime
from strands_slime.reward.dapo import RewardConfig, reward_func

pytestmark = pytest.mark.unit

omegaconf = pytest.importorskip("omegaconf")

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG = REPO_ROOT / "configs" / "eval_aime.yaml"

# Field names of slime's EvalDatasetConfig (slime/utils/eval_config.py at THUDM/slime HEAD, Aug 2026);
# slime builds EvalDatasetConfig(**entry), so any other key is a TypeError at start-up.
SLIME_DATASET_FIELDS = {
    "name", "path", "rm_type", "custom_rm_path", "input_key", "label_key", "tool_key", "metadata_key",
    "multimodal_keys", "apply_chat_template", "apply_chat_template_kwargs", "n_samples_per_eval_prompt",
    "temperature", "top_p", "top_k", "max_response_len", "stop", "stop_token_ids", "min_new_tokens",
    "repetition_penalty", "skip_special_tokens", "no_stop_trim", "custom_generate_function_path",
    "app_service", "eval_task_timeout", "min_eval_samples", "eval_early_stop_remaining",
    "eval_early_stop_idle_timeout", "message_processor", "reward_model", "remote_environment",
    "metadata_overrides",
}  # fmt: skip


def load_like_slime() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    config = omegaconf.OmegaConf.to_container(omegaconf.OmegaConf.load(CONFIG), resolve=True)
    assert isinstance(config, dict)
    eval_section = config.get("eval", config)
    return dict(eval_section.get("defaults") or {}), list(eval_section["datasets"])


def test_keys_are_ones_slime_accepts() -> None:
    defaults, datasets = load_like_slime()
    assert set(defaults) <= SLIME_DATASET_FIELDS
    assert [entry["name"] for entry in datasets] == ["aime"]
    for entry in datasets:
        assert set(entry) <= SLIME_DATASET_FIELDS


def test_aime_entry_settings() -> None:
    defaults, (aime,) = load_like_slime()
    assert (aime["input_key"], aime["label_key"]) == ("prompt", "label")
    assert aime["n_samples_per_eval_prompt"] == 16
    # Qwen3's thinking-mode sampling with a 32k budget: the setting to report AIME numbers with.
    assert defaults == {"max_response_len": 32768, "temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert aime["metadata_overrides"] == {"evaluation": True}


def test_data_dir_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATA_DIR", raising=False)
    assert load_like_slime()[1][0]["path"] == "data/aime-2024.jsonl"
    monkeypatch.setenv("DATA_DIR", "/shared/data")
    assert load_like_slime()[1][0]["path"] == "/shared/data/aime-2024.jsonl"


def test_dotted_paths_resolve_like_slime_load_function() -> None:
    _, (aime,) = load_like_slime()
    module_name, _, attr = aime["custom_rm_path"].rpartition(".")
    assert getattr(importlib.import_module(module_name), attr) is reward_func
    module_name, _, attr = aime["custom_generate_function_path"].rpartition(".")
    assert module_name == "strands_slime" and attr in strands_slime.__all__


def first_eval_row(data_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    (data_dir / "aime-2024.jsonl").write_bytes((REPO_ROOT / "tests/data/aime_fixture.jsonl").read_bytes())
    _, (aime,) = load_like_slime()
    return aime, json.loads(Path(aime["path"]).read_text().splitlines()[0])


async def test_eval_samples_from_this_config_are_not_shaped(tmp_path: Path, monkeypatch) -> None:
    """slime copies metadata_overrides into each eval sample's metadata; the reward then never shapes."""
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    aime, row = first_eval_row(tmp_path)
    metadata = {"tool_iterations": 0, "final_text": "Answer: 8"}  # wrong, with no tool use
    metadata.update(aime["metadata_overrides"])
    sample = SimpleNamespace(prompt=row[aime["input_key"]], label=row[aime["label_key"]], metadata=metadata)
    shaped = RewardConfig(shaping="strands_example")
    assert await reward_func(None, sample, config=shaped) == -1.0  # training would give -1.1
    metadata["final_text"] = f"Answer: {row['label']}"
    assert await reward_func(None, sample, config=shaped) == 1.0
