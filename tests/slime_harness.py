"""Drive slime's real rollout code (``tests/slime_upstream.py``) against the dev server.

Only what cannot run on a CPU box is stubbed, thinly: ``ray`` where it is not installed (then
``@ray.remote`` leaves the class as it is; where it is, slime gets the real one, as the Ray backend's
tests need), ``sglang``/``sglang_router`` (their argument builders add the few flags slime's parser
reads; ``tests/data/sglang_flags.txt`` lists the real ones) and the router process (a small HTTP
front that lists the dev server under ``/workers`` and forwards ``/generate``, as sglang-router does).
Everything else is slime's own code: its argument parser and validation, data source, rollout loops,
``GenerateState``, rewards plumbing, sample hooks, tracing and training-data conversion.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import types
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, web
from slime_upstream import require_slime

from strands_slime.devserver import DevServer
from strands_slime.provider.tokenizer import bundled_qwen3_tokenizer_dir


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = sys.modules.get(name)
    if module is None:
        module = types.ModuleType(name)
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(_module(parent), child, module)
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


def _ray_remote(*args: Any, **kwargs: Any) -> Any:
    if args and callable(args[0]) and not kwargs:
        return args[0]
    return lambda target: target


class _ServerArgs:
    """sglang's ``ServerArgs.add_cli_args``: the flags slime's validation and rollout read."""

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        for flag in ("--dp-size", "--pp-size", "--ep-size", "--moe-dp-size"):
            parser.add_argument(flag, type=int, default=1)
        parser.add_argument("--enable-dp-attention", action="store_true", default=False)
        parser.add_argument("--enable-deterministic-inference", action="store_true", default=False)
        parser.add_argument("--speculative-algorithm", type=str, default=None)
        parser.add_argument("--speculative-num-draft-tokens", type=int, default=None)


class _RouterArgs:
    """sglang_router's ``RouterArgs.add_cli_args`` (with slime's ``--router-`` prefix)."""

    @staticmethod
    def add_cli_args(
        parser: argparse.ArgumentParser, use_router_prefix: bool, exclude_host_port: bool
    ) -> None:
        parser.add_argument("--router-policy", type=str, default="cache_aware")
        parser.add_argument("--router-log-level", type=str, default="info")
        parser.add_argument("--router-balance-abs-threshold", type=int, default=32)
        parser.add_argument("--router-balance-rel-threshold", type=float, default=1.5)


def _no_process_to_kill(pid: int, *args: Any, **kwargs: Any) -> None:
    raise AssertionError("no engine process is launched in these tests")


def load_slime() -> Path:
    """slime's source on ``sys.path`` (or skip) with sglang/sglang_router stubbed, and ray too where it
    is not installed (one decision per process: the real module is never patched)."""
    source = require_slime()
    if "ray" in sys.modules:
        pass  # the real one, or the stub of an earlier call
    elif importlib.util.find_spec("ray") is not None:
        import ray  # noqa: F401  (the real one: slime's @ray.remote classes become actor classes)
    else:
        services = types.SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1")
        _module("ray", remote=_ray_remote, _private=types.SimpleNamespace(services=services))
        _module("ray.util.scheduling_strategies", PlacementGroupSchedulingStrategy=object)
    _module(
        "sglang.srt.constants",
        GPU_MEMORY_TYPE_CUDA_GRAPH="cuda_graph",
        GPU_MEMORY_TYPE_KV_CACHE="kv_cache",
        GPU_MEMORY_TYPE_WEIGHTS="weights",
    )
    _module("sglang.srt.server_args", ServerArgs=_ServerArgs)
    _module("sglang.srt.utils", kill_process_tree=_no_process_to_kill)
    _module("sglang_router.launch_router", RouterArgs=_RouterArgs)
    return source


def slime_args(router_url: str, prompt_data: Path, *flags: str, custom: dict[str, Any] | None = None) -> Any:
    """``args`` as slime's ``parse_args`` builds them (its parser and ``slime_validate_args``), for a
    rollout-only job whose router is ``router_url``. ``custom`` plays ``--custom-config-path``."""
    from slime.backends.sglang_utils.arguments import add_sglang_arguments
    from slime.backends.sglang_utils.arguments import validate_args as validate_sglang_args
    from slime.utils.arguments import get_slime_extra_args_provider, slime_validate_args

    parser = argparse.ArgumentParser(allow_abbrev=False)
    get_slime_extra_args_provider()(parser)
    add_sglang_arguments(parser)
    # What slime's megatron phase and its pre-parse phase would add.
    parser.add_argument("--num-layers", type=int, default=None)
    parser.add_argument("--moe-router-topk", type=int, default=None)
    host, port = router_url.removeprefix("http://").rsplit(":", 1)
    argv = [
        "--hf-checkpoint",
        str(bundled_qwen3_tokenizer_dir()),
        "--prompt-data",
        str(prompt_data),
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--num-rollout",
        "1",
        "--rollout-batch-size",
        "1",
        "--rollout-num-gpus",
        "1",
        "--sglang-router-ip",
        host,
        "--sglang-router-port",
        port,
        "--custom-generate-function-path",
        "strands_slime.generate",
        "--custom-rm-path",
        "strands_slime.reward_func",
        *flags,
    ]
    args = parser.parse_args(argv)
    for name, value in {
        "train_backend": "megatron",
        "debug_rollout_only": True,
        "debug_train_only": False,
        "load_debug_rollout_data": None,
        "offload": False,
    }.items():
        setattr(args, name, value)
    validate_sglang_args(args)
    slime_validate_args(args)
    for key, value in (custom or {}).items():  # slime copies --custom-config-path keys onto args
        setattr(args, key, value)
    return args


def reset_slime_state() -> None:
    """Fresh singletons and HTTP client, as in a new rollout process."""
    from slime.rollout import sglang_rollout
    from slime.utils import http_utils
    from slime.utils.misc import SingletonMeta

    SingletonMeta._instances.pop(sglang_rollout.GenerateState, None)
    sglang_rollout.GenerateState.__dict__.get("_instances", {}).clear()
    http_utils._http_client = None


@pytest.fixture(autouse=True)
def fresh_slime() -> Iterator[None]:
    """slime's code loaded and its rollout singletons fresh around each test, as in a new rollout
    process. Autouse in every module that imports it by name."""
    load_slime()
    reset_slime_state()
    yield
    reset_slime_state()


def write_prompts(path: Path, rows: list[tuple[str, str]]) -> Path:
    """A DAPO-style ``.jsonl`` (``prompt`` as a message list, ``label``)."""
    with path.open("w") as handle:
        for question, label in rows:
            handle.write(
                json.dumps({"prompt": [{"role": "user", "content": question}], "label": label}) + "\n"
            )
    return path


@asynccontextmanager
async def router_in_front_of(server: DevServer) -> AsyncIterator[str]:
    """What sglang-router answers slime: ``GET /workers`` and a forwarded ``POST /generate``."""
    session = ClientSession()

    async def workers(request: web.Request) -> web.Response:
        return web.json_response({"workers": [{"url": server.url}]})

    async def forward(request: web.Request) -> web.Response:
        headers = {
            k: v for k, v in request.headers.items() if k.lower() in ("content-type", "x-smg-routing-key")
        }
        async with session.post(
            server.url + request.path, data=await request.read(), headers=headers
        ) as reply:
            body = await reply.read()
            return web.Response(body=body, status=reply.status, content_type=reply.content_type)

    app = web.Application(client_max_size=512 * 1024 * 1024)
    app.add_routes([web.get("/workers", workers), web.post("/generate", forward)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
        await session.close()


def train_data(args: Any, samples: list[Any]) -> dict[str, Any]:
    """slime's ``RolloutManager._convert_samples_to_train_data`` on ``samples`` (no Ray actor around it),
    with ``--custom-reward-post-process-path`` loaded as the manager does."""
    from slime.ray.rollout import RolloutManager
    from slime.utils.misc import load_function

    metadata = getattr(RolloutManager, "__ray_metadata__", None)  # real ray: the class under the actor class
    if metadata is not None:
        RolloutManager = metadata.modified_class
    post_process = args.custom_reward_post_process_path
    manager = types.SimpleNamespace(
        args=args,
        custom_reward_post_process_func=load_function(post_process) if post_process else None,
        custom_convert_samples_to_train_data_func=None,
    )
    manager._post_process_rewards = lambda batch: RolloutManager._post_process_rewards(manager, batch)
    return RolloutManager._convert_samples_to_train_data(manager, samples)


def rollout_metrics(args: Any, samples: list[Any]) -> dict[str, Any]:
    """The metrics slime's ``log_rollout_data`` computes from the samples (reward categories, perf)."""
    from slime.observability import rollout_metrics as metrics

    return {
        **metrics._compute_reward_cat_metrics(args, samples),
        **metrics.compute_perf_metrics_from_samples(args, samples, 1.0),
    }
