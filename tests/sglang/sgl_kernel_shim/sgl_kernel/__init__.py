"""Import shim for ``sgl_kernel`` under SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``), test lane only.

PyPI has no CPU build of ``sgl_kernel`` (``sglang-kernel`` is CUDA-only). On a CPU without AMX, SGLang
0.5.23 imports exactly the names below at start-up (speculative decoding and KV-copy helpers) and never
calls them for the models and flags the lane uses. Each is a function that writes one line to the file
named by ``SGL_KERNEL_SHIM_LOG`` and raises, so a call fails loudly and the lane can prove that none
happened; importing the shim writes a line too, so the lane can prove it is this module SGLang loaded.
A name SGLang may import later is deliberately missing: the import then fails at start-up.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, NoReturn

SHIMMED = (
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "verify_tree_greedy_cpu",
)


def _record(line: str) -> None:
    path = os.environ.get("SGL_KERNEL_SHIM_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"{line} pid={os.getpid()}\n")


def _never_called(name: str) -> Callable[..., NoReturn]:
    def kernel(*args: Any, **kwargs: Any) -> NoReturn:
        _record(f"called {name}")
        raise NotImplementedError(f"sgl_kernel.{name} is an import shim: no CPU kernel behind it")

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


for _name in SHIMMED:
    globals()[_name] = _never_called(_name)

_record("imported")
