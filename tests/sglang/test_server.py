"""The real SGLang server the lane runs: what it is, what it costs, and that no sgl_kernel code ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sglang_server import CONTEXT_LENGTH, SGLangServer, sglang_python

pytestmark = pytest.mark.sglang


def test_it_is_sglang_0_5_23_on_the_cpu_with_fp32_weights(sglang: SGLangServer) -> None:
    status, info = sglang.get("/server_info")
    assert status == 200
    assert info["version"] == "0.5.23"
    assert (info["device"], info["dtype"], info["attention_backend"]) == ("cpu", "float32", "torch_native")
    assert info["grammar_backend"] == "xgrammar"
    status, models = sglang.get("/v1/models")
    assert status == 200 and models["data"][0]["max_model_len"] == CONTEXT_LENGTH
    status, model_info = sglang.get("/model_info")
    assert status == 200 and model_info["architectures"] == ["Qwen3ForCausalLM"]


def test_sgl_kernel_is_the_shim_and_none_of_it_ran(sglang: SGLangServer) -> None:
    # every server is checked again when it stops, after all the lane's requests
    status, _ = sglang.post("/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}})
    assert status == 200
    sglang.check_shim()
    assert any(line.startswith("imported") for line in sglang.shim_events())


def test_footprint_is_recorded(sglang: SGLangServer, lane_dir: Path) -> None:
    """Start-up time and resident memory of the session's server (docs/sglang-lane.md quotes them)."""
    rss = sglang.rss_bytes()
    assert sglang.startup_s > 0 and rss > 0
    venv = sglang_python().parents[1]
    footprint = {"startup_s": round(sglang.startup_s, 1), "rss_mb": round(rss / 2**20)}
    (lane_dir / "footprint.json").write_text(json.dumps({**footprint, "venv": str(venv)}, indent=2))
