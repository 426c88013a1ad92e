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


def build_backend(
    choice: str,
    *,
    script: Script | list[Any] | dict[str, Any] | str | Path | None = None,
    model: Any = None,
    tokenizer: Any = None,
    context_length: int | None = None,
) -> Backend:
    """The ``scripted`` or ``hf`` backend, as ``DevServer`` documents its options.

    Raises:
        ModuleNotFoundError: ``hf`` without torch (the message says which extra to install).
        ScriptError: a bad script (scripted).
        FileNotFoundError: a model directory that does not exist (hf never downloads).
    """
    from strands_slime.devserver.tokens import TokenizerWorker, load_devserver_tokenizer

    local_model = isinstance(model, (str, Path))
    if choice == "hf" and tokenizer is None and local_model:
        if any((Path(model) / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
            tokenizer = str(model)  # the model directory's own tokenizer
    if tokenizer is None or isinstance(tokenizer, (str, Path)):
        tokenizer = load_devserver_tokenizer(None if tokenizer is None else str(tokenizer))
    tokens = TokenizerWorker(tokenizer)
    if choice == "hf":
        try:
            from strands_slime.devserver.backends.hf import HFBackend
        except ModuleNotFoundError as exc:
            if exc.name != "torch":
                raise
            raise ModuleNotFoundError(HF_BACKEND_NEEDS_TORCH, name="torch") from exc

        return HFBackend(
            tokens,
            model=None if model is None or local_model else model,
            model_path=str(model) if local_model else None,
            context_length=context_length,
        )
    from strands_slime.devserver.backends.scripted import Script, ScriptedBackend

    if script is None:
        loaded = Script.default()
    elif isinstance(script, (str, Path)):
        loaded = Script.load(script)
    else:
        loaded = Script.from_obj(script)
    return ScriptedBackend(loaded, tokens, context_length=context_length)
