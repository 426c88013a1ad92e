"""Build a backend from the server's options: tokenizer first, then the script or the model.

Loading is blocking (tokenizer files, torch, model weights): the server calls this in a worker thread.
Only the ``hf`` backend imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from strands_slime.devserver.backends.base import Backend
    from strands_slime.devserver.backends.scripted import Script

HF_BACKEND_NEEDS_TORCH = "the hf backend needs torch: pip install 'strands-slime[devserver]'"


def _load_tokenizer(path: Any) -> Any:
    from strands_slime.devserver.tokens import load_devserver_tokenizer

    if path is None or isinstance(path, (str, Path)):
        return load_devserver_tokenizer(None if path is None else str(path))
    return path  # an already loaded tokenizer object


def build_backend(
    choice: str,
    *,
    script: Script | list[Any] | dict[str, Any] | str | Path | None = None,
    model: Any = None,
    tokenizer: Any = None,
    model_seed: int = 0,
    context_length: int | None = None,
    prefix_cache_tokens: int | None = None,
    return_original_logprob: bool = False,
) -> Backend:
    """The ``scripted`` or ``hf`` backend, as ``DevServer`` documents its options.

    Raises:
        ModuleNotFoundError: ``hf`` without torch (the message says which extra to install).
        ScriptError: a bad script (scripted).
        FileNotFoundError: a model directory that does not exist (hf never downloads).
    """
    from strands_slime.devserver.tokens import TokenizerWorker

    if choice == "hf":
        try:
            from strands_slime.devserver.backends.hf import HFBackend
        except ModuleNotFoundError as exc:
            if exc.name != "torch":
                raise
            raise ModuleNotFoundError(HF_BACKEND_NEEDS_TORCH, name="torch") from exc

        if tokenizer is None and isinstance(model, (str, Path)):
            model_dir = Path(model)
            if (model_dir / "tokenizer.json").exists() or (model_dir / "tokenizer_config.json").exists():
                tokenizer = str(model_dir)
        return HFBackend(
            TokenizerWorker(_load_tokenizer(tokenizer)),
            model=None if model is None or isinstance(model, (str, Path)) else model,
            model_path=str(model) if isinstance(model, (str, Path)) else None,
            seed=model_seed,
            context_length=context_length,
            prefix_cache_tokens=prefix_cache_tokens,
            return_original_logprob=return_original_logprob,
        )
    from strands_slime.devserver.backends.scripted import DEFAULT_PREFIX_CACHE_TOKENS, Script, ScriptedBackend

    if script is None:
        loaded = Script.default()
    elif isinstance(script, (str, Path)):
        loaded = Script.load(script)
    else:
        loaded = Script.from_obj(script)
    return ScriptedBackend(
        loaded,
        TokenizerWorker(_load_tokenizer(tokenizer)),
        context_length=context_length,
        prefix_cache_tokens=prefix_cache_tokens or DEFAULT_PREFIX_CACHE_TOKENS,
    )
