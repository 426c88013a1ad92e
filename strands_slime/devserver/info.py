"""The bodies of SGLang's read-only endpoints: ``/model_info``, ``/v1/models`` and ``/v1/loads``.

(``/server_info`` is built by the server itself: it reports the server's own options.)
"""

from __future__ import annotations

import datetime
import time
from typing import TYPE_CHECKING, Any

from strands_slime.devserver.protocol import ProtocolError

if TYPE_CHECKING:
    from strands_slime.devserver.scheduler import Scheduler

SGLANG_VERSION = "0.5.23"
"""The SGLang release whose protocol the dev server emulates."""
LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})
"""``LoadSnapshot.VALID_SECTIONS``: what ``/v1/loads?include=`` accepts."""


def model_info_body(
    backend_info: dict[str, Any], *, served_model_name: str, weight_version: str
) -> dict[str, Any]:
    """``/model_info`` with SGLang's keys; ``backend_info`` is :meth:`Backend.model_info`."""
    return {
        "model_path": backend_info.get("model_path"),
        "served_model_name": served_model_name,
        "tokenizer_path": backend_info.get("tokenizer_path"),
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": weight_version,
        "load_format": "auto",
        "reasoning_parser": None,
        "tool_call_parser": None,
        "disaggregation_mode": "null",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": backend_info.get("model_type"),
        "architectures": backend_info.get("architectures"),
    }


def models_body(name: str, *, created: float, max_model_len: int) -> dict[str, Any]:
    """``/v1/models``: one model whose ``max_model_len`` is the context length."""
    model = {
        "id": name,
        "object": "model",
        "created": int(created),
        "owned_by": "sglang",
        "root": name,
        "parent": None,
        "max_model_len": max_model_len,
    }
    return {"object": "list", "data": [model]}


def loads_body(
    scheduler: Scheduler, *, include: str | None, capacity: int, cache_hit_rate: float
) -> dict[str, Any]:
    """SGLang 0.5.23's ``/v1/loads`` (``srt/entrypoints/v1_loads.py``): one DP rank, the core keys of
    ``LoadSnapshot``; the optional sections (memory, spec, lora, disagg, queues) are never present.

    Raises:
        ProtocolError: ``include`` names an unknown section.
    """
    if include:
        invalid = {part.strip() for part in include.split(",")} - LOAD_SECTIONS
        if invalid:
            raise ProtocolError.http(
                f"Invalid include sections: {invalid}. Valid options: {sorted(LOAD_SECTIONS)}", 400
            )
    used = scheduler.used_tokens()
    waiting = scheduler.waiting_tokens()
    load = {
        "timestamp": time.time(),
        "dp_rank": 0,
        "num_running_reqs": scheduler.num_running,
        "num_waiting_reqs": scheduler.num_waiting,
        "num_waiting_uncached_tokens": waiting,
        "num_used_tokens": used,
        "num_total_tokens": used + waiting,
        "num_active_tokens": used + waiting,
        "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": capacity,
        "max_running_requests": scheduler.max_running_requests,
        "token_usage": used / capacity if capacity else 0.0,
        "gen_throughput": scheduler.gen_throughput(),
        "cache_hit_rate": cache_hit_rate,
        "utilization": scheduler.num_running / scheduler.max_running_requests,
        "total_prefill_uncached_tokens": 0,
        "total_prefill_busy_us": 0,
        "decode_moments": None,
    }
    return {
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "version": SGLANG_VERSION,
        "accelerator": None,
        "num_accelerators": 1,
        "loads": [load],
    }
