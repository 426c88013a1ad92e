"""The ``hf`` backend: a real causal LM through transformers on CPU.

By default a tiny random-weight Qwen3 (fixed seed, real Qwen3 vocabulary); any local model directory
works too. All torch work runs on one model thread, so the event loop never waits on it. Logprobs, the
KV and prefix cache, and constraints follow SGLang's defaults (``benchmarks/devserver_reference.py``
checks the logprobs): docs/devserver.md.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from strands_slime.devserver.backends.base import Backend, Generation
from strands_slime.devserver.moved import module_getattr
from strands_slime.devserver.prefix_cache import PrefixCache
from strands_slime.devserver.request import GenerationRequest, PrefillResult, TokenStep

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from strands_slime.devserver.tokens import TokenizerWorker

logger = logging.getLogger(__name__)
__getattr__ = module_getattr(__name__, "full_forward_logprobs")

T = TypeVar("T")

TINY_QWEN3_NAME = "tiny-qwen3-random"
DEFAULT_CONTEXT_LENGTH = 40960
DEFAULT_KV_CACHE_BYTES = 1 << 30
QWEN3_EOS_IDS = (151645, 151643)


def build_tiny_qwen3(seed: int = 0) -> PreTrainedModel:
    """The default model: a 9.8M-parameter random Qwen3 with the real Qwen3 vocabulary, fp32.

    Same seed, same weights. The global torch RNG is left as it was.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        tie_word_embeddings=True,
        max_position_embeddings=DEFAULT_CONTEXT_LENGTH,  # as Qwen3-8B; does not change the weights
        eos_token_id=list(QWEN3_EOS_IDS),
        pad_token_id=151643,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    return model.to(torch.float32).eval()


def _kv_bytes_per_token(config: Any) -> int:
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    kv_heads = int(getattr(config, "num_key_value_heads", 0) or heads)
    head_dim = int(getattr(config, "head_dim", 0) or (getattr(config, "hidden_size", 0) // max(heads, 1)))
    size = layers * 2 * kv_heads * head_dim * 4
    return size if size > 0 else 64 * 1024


class HFBackend(Backend):
    """A transformers causal LM served token by token on one model thread."""

    name = "hf"
    default_max_running_requests = 8

    def __init__(
        self,
        tokens: TokenizerWorker,
        *,
        model: PreTrainedModel | None = None,
        model_path: str | None = None,
        context_length: int | None = None,
        prefill_chunk: int = 2048,
        logprob_chunk: int = 256,
    ) -> None:
        self.tokens = tokens
        if model is None:
            if model_path in (None, "", TINY_QWEN3_NAME):
                model = build_tiny_qwen3()
                model_path = TINY_QWEN3_NAME
            else:
                model = self._load(str(model_path))
        self.model = model.eval()
        self.model_path = model_path or str(getattr(model.config, "name_or_path", "") or "in-memory")
        self.config = model.config
        text_config = self.config.get_text_config()
        self.vocab_size = int(text_config.vocab_size)
        if tokens.vocab_size > self.vocab_size:
            raise ValueError(
                f"the tokenizer has {tokens.vocab_size} tokens but the model only {self.vocab_size} embeddings"
            )
        self.eos_token_ids = frozenset(self._eos_ids())
        self.default_context_length = (
            context_length
            or int(getattr(text_config, "max_position_embeddings", 0) or 0)
            or DEFAULT_CONTEXT_LENGTH
        )
        self.prefill_chunk = prefill_chunk
        self.logprob_chunk = logprob_chunk
        kv_tokens = DEFAULT_KV_CACHE_BYTES // _kv_bytes_per_token(text_config)
        self.prefix_cache = PrefixCache(max(self.default_context_length, kv_tokens))
        self.reuse_prefix = self._full_attention_only()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="devserver-model")

    @staticmethod
    def _load(path: str) -> PreTrainedModel:
        from transformers import AutoModelForCausalLM

        if not Path(path).exists():
            raise FileNotFoundError(
                f"model directory {path!r} does not exist (the dev server never downloads)"
            )
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        generation_config = getattr(self.model, "generation_config", None)
        for source in (self.config.get_text_config(), generation_config):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(item) for item in value)
        if self.tokens.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokens.tokenizer.eos_token_id))
        return ids

    def _full_attention_only(self) -> bool:
        """Prefix reuse slices KV along the sequence, which is only exact for plain full attention."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        layers = DynamicCache(config=self.config).layers
        return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` on the model thread (all torch work happens there)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    def new_cache(self, payload: list[tuple[torch.Tensor, torch.Tensor]] | None, length: int) -> Any:
        """A fresh DynamicCache, pre-filled with the first ``length`` cached positions.

        The stored tensors are sliced, never written: DynamicCache appends by concatenation.
        """
        from transformers import DynamicCache

        if payload is None or length == 0:
            return DynamicCache(config=self.config)
        data = [(keys[:, :, :length], values[:, :, :length]) for keys, values in payload]
        return DynamicCache(ddp_cache_data=data, config=self.config)

    def open(self, request: GenerationRequest) -> Generation:
        """Start generating for an admitted request."""
        return _HFGeneration(self, request)

    def model_info(self) -> dict[str, Any]:
        """Model path, tokenizer path, model type and architectures for ``/model_info``."""
        text_config = self.config.get_text_config()
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.tokens.name_or_path,
            "model_type": getattr(text_config, "model_type", None),
            "architectures": list(getattr(self.config, "architectures", None) or [type(self.model).__name__]),
        }

    def flush_cache(self) -> None:
        """Drop every cached prefix (on the model thread, which owns the cache)."""
        self._executor.submit(self.prefix_cache.clear)  # the cache belongs to the model thread

    async def close(self) -> None:
        """Stop the model thread."""
        self._executor.shutdown(wait=True, cancel_futures=True)


class _HFGeneration(Generation):
    """One request's KV cache, pending token and sampler state; used only on the model thread."""

    def __init__(self, backend: HFBackend, request: GenerationRequest) -> None:
        self.backend = backend
        self.request = request
        self.generator = torch.Generator().manual_seed(request.seed)
        self.cache: Any = None
        self.logits: torch.Tensor | None = None
        self.pending: int | None = None
        params = request.params
        self.suppressed_ids = sorted(
            tok for tok in backend.eos_token_ids | set(params.stop_token_ids) if 0 <= tok < backend.vocab_size
        )
        self.grammar = None
        if request.grammar is not None:
            engine, compiled = request.grammar
            self.grammar = engine.matcher(compiled)

    # ------------------------------------------------------------------ logprob views

    def _reported_logprobs(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution SGLang reports logprobs from: log-softmax of the logits (after penalties and
        ``logit_bias``, before top-k/top-p/min-p) divided by the temperature; greedy: raw log-softmax."""
        params = self.request.params
        if params.greedy or params.temperature == 1.0:
            return torch.log_softmax(logits, dim=-1)
        return torch.log_softmax(logits / params.temperature, dim=-1)

    def _extras(
        self, logprobs: torch.Tensor
    ) -> tuple[list[tuple[float, int]] | None, list[tuple[float, int]] | None]:
        request = self.request
        top = ids = None
        if request.top_logprobs_num:
            values, indices = torch.topk(logprobs, min(request.top_logprobs_num, logprobs.shape[-1]))
            top = list(zip(values.tolist(), indices.tolist(), strict=True))
        if request.token_ids_logprob:
            wanted = request.token_ids_logprob
            ids = list(zip(logprobs[wanted].tolist(), wanted, strict=True))
        return top, ids

    # ------------------------------------------------------------------ prefill

    async def prefill(self) -> PrefillResult:
        return await self.backend.run(self._prefill)

    def _forward(self, ids: list[int], *, all_logits: bool) -> torch.Tensor:
        out = self.backend.model(
            input_ids=torch.tensor([ids], dtype=torch.long),
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=0 if all_logits else 1,
        )
        self.cache = out.past_key_values
        return out.logits[0].float()

    def _prefill(self) -> PrefillResult:
        request, backend = self.request, self.backend
        ids = request.input_ids
        total = len(ids)
        max_reuse = total - 1
        if request.wants_input_logprobs:
            max_reuse = min(max_reuse, request.logprob_start_len)
        cached, payload = backend.prefix_cache.lookup(ids, max_reuse) if backend.reuse_prefix else (0, None)
        self.cache = backend.new_cache(payload, cached)
        result = PrefillResult(cached_tokens=cached)
        start = request.logprob_start_len
        if request.wants_input_logprobs and start < total:
            result.input_logprobs = [None]
            if request.top_logprobs_num:
                result.input_top_logprobs = [None]
            if request.token_ids_logprob:
                result.input_token_ids_logprobs = [None]
        with torch.inference_mode():
            position = cached
            last: torch.Tensor | None = None
            # Prompt positions before logprob_start_len only need their KV: big chunks, last logits.
            plain_end = min(total, start) if request.wants_input_logprobs else total
            while position < plain_end:
                end = min(plain_end, position + backend.prefill_chunk)
                last = self._forward(ids[position:end], all_logits=False)[-1]
                position = end
            while position < total:
                end = min(total, position + backend.logprob_chunk)
                logits = self._forward(ids[position:end], all_logits=True)
                last = logits[-1]
                low, high = max(position, start), min(end, total - 1)  # logits at p score token p + 1
                if low < high:
                    logprobs = self._reported_logprobs(logits[low - position : high - position])
                    targets = torch.tensor(ids[low + 1 : high + 1], dtype=torch.long)
                    result.input_logprobs.extend(logprobs.gather(1, targets[:, None])[:, 0].tolist())
                    for row in logprobs if request.top_logprobs_num or request.token_ids_logprob else ():
                        top, wanted = self._extras(row)
                        if result.input_top_logprobs is not None:
                            result.input_top_logprobs.append(top)
                        if result.input_token_ids_logprobs is not None:
                            result.input_token_ids_logprobs.append(wanted)
                position = end
        assert last is not None
        self.logits = last
        return result

    # ------------------------------------------------------------------ decode

    async def next_tokens(self, limit: int) -> list[TokenStep]:
        return [await self.backend.run(self._step)]

    def _step(self) -> TokenStep:
        with torch.inference_mode():
            if self.pending is not None:
                self.logits = self._forward([self.pending], all_logits=False)[-1]
            assert self.logits is not None
            step = self._sample(self.logits)
        if self.grammar is not None and not self.grammar.terminated:
            self.grammar.accept(step.token_id)
        self.pending = step.token_id
        return step

    def _adjusted_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Penalties, min_new_tokens and logit_bias, applied before temperature like SGLang."""
        request = self.request
        params = request.params
        outputs = request.output_ids
        needs_penalty = outputs and (
            params.repetition_penalty != 1.0 or params.frequency_penalty or params.presence_penalty
        )
        needs_mask = params.min_new_tokens and len(outputs) < params.min_new_tokens and self.suppressed_ids
        constrained = self.grammar is not None and not self.grammar.terminated
        if not (needs_penalty or needs_mask or params.logit_bias or constrained):
            return logits
        logits = logits.clone()
        if needs_penalty:
            seen, counts = torch.unique(torch.tensor(outputs, dtype=torch.long), return_counts=True)
            if params.repetition_penalty != 1.0:
                values = logits[seen]
                logits[seen] = torch.where(
                    values > 0, values / params.repetition_penalty, values * params.repetition_penalty
                )
            if params.frequency_penalty or params.presence_penalty:
                logits[seen] -= params.frequency_penalty * counts.float() + params.presence_penalty
        if needs_mask:
            logits[self.suppressed_ids] = float("-inf")
        for key, bias in params.logit_bias.items():
            logits[int(key)] += float(bias)
        if constrained:
            # Like SGLang's vocab mask: forbidden tokens get -inf before sampling and before logprobs.
            self.grammar.mask_logits(logits)
        return logits

    def _sample(self, raw_logits: torch.Tensor) -> TokenStep:
        params = self.request.params
        logits = self._adjusted_logits(raw_logits)
        if params.greedy:
            logprobs = torch.log_softmax(logits, dim=-1)
            token = int(torch.argmax(logits))
        else:
            scaled = torch.log_softmax(logits / params.temperature, dim=-1)
            probs = scaled.exp()
            top_k = params.effective_top_k
            if top_k < probs.shape[-1]:
                values, indices = torch.topk(probs, top_k)
                probs = torch.zeros_like(probs).scatter_(0, indices, values)
            if params.top_p < 1.0:
                ordered, order = torch.sort(probs, descending=True)
                cumulative = torch.cumsum(ordered, dim=0)
                ordered[(cumulative - ordered) > params.top_p * cumulative[-1]] = 0.0
                probs = torch.zeros_like(probs).scatter_(0, order, ordered)
            if params.min_p > 0:
                probs[probs < params.min_p * probs.max()] = 0.0
            # Inverse-CDF draw: one uniform number instead of torch.multinomial, which costs ~20 ms
            # over a 152k vocabulary on a small CPU. Zero-probability tokens can never be drawn.
            cumulative = torch.cumsum(probs, dim=0)
            threshold = torch.rand((), generator=self.generator) * cumulative[-1]
            token = min(int(torch.searchsorted(cumulative, threshold, right=True)), probs.shape[-1] - 1)
            logprobs = scaled
        top, wanted = self._extras(logprobs)
        step = TokenStep(
            token_id=token, logprob=float(logprobs[token]), top_logprobs=top, token_ids_logprobs=wanted
        )
        if self.request.return_top_p_token_ids and not params.greedy:
            step.top_p_ids = torch.nonzero(probs > 0).flatten().tolist()  # the nucleus the draw used
        return step

    # ------------------------------------------------------------------ release

    async def close(self, output_ids: list[int]) -> None:
        await self.backend.run(self._release, output_ids)

    def _release(self, output_ids: list[int]) -> None:
        cache, self.cache = self.cache, None
        if cache is None or not self.backend.reuse_prefix:
            return
        length = cache.get_seq_length()
        if length <= 0:
            return
        sequence = (self.request.input_ids + output_ids)[:length]
        payload = [(layer.keys, layer.values) for layer in cache.layers]
        self.backend.prefix_cache.insert(sequence, payload)
