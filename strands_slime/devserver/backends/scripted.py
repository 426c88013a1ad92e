"""The ``scripted`` backend: deterministic replies chosen per conversation, same protocol as ``hf``.

A script is an ordered list of rules. The first rule whose ``match`` substring occurs in the prompt
(decoded with special tokens) answers; its reply number is the count of assistant turns already in
the prompt, i.e. occurrences of ``<|im_start|>assistant`` minus one (floored at 0). Past the last
reply the last one repeats. See docs/devserver.md for the file format.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from strands_slime.devserver.backends.base import Backend, Generation
from strands_slime.devserver.moved import module_getattr
from strands_slime.devserver.prefix_cache import PrefixCache
from strands_slime.devserver.protocol import ProtocolError
from strands_slime.devserver.request import GenerationRequest, PrefillResult, TokenStep

if TYPE_CHECKING:
    from strands_slime.devserver.tokens import TokenizerWorker

ASSISTANT_MARKER = "<|im_start|>assistant"
DEFAULT_CONTEXT_LENGTH = 40960
DEFAULT_PREFIX_CACHE_TOKENS = 2_000_000
_MASK64 = (1 << 64) - 1
MAX_CONTINUATIONS = 4096
"""Cut-short replies remembered for continuation (oldest forgotten first)."""
__getattr__ = module_getattr(__name__, "scripted_output_logprobs")


class ScriptError(ValueError):
    """A script that cannot be used, with the place of the problem in the message."""


class Reply(BaseModel):
    """One assistant reply: a text (EOS appended) or explicit token ids (used verbatim, e.g. a
    non-canonical tokenization a model may sample); a plain string is a text."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: StrictStr | None = None
    token_ids: list[Annotated[StrictInt, Field(ge=0)]] | None = Field(None, min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _text_shorthand(cls, data: Any) -> Any:
        return {"text": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _one_kind(self) -> Reply:
        if (self.text is None) == (self.token_ids is None):
            raise ValueError("a reply needs exactly one of 'text' or 'token_ids'")
        return self


class Rule(BaseModel):
    """One script rule: the first rule whose ``match`` occurs in the prompt answers (None: any)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    match: StrictStr | None = Field(None, min_length=1)
    replies: list[Reply] = Field(min_length=1)


class Script(BaseModel):
    """Ordered rules."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rules: list[Rule] = Field(min_length=1)
    name: str = "inline"

    @classmethod
    def from_obj(cls, obj: Any, *, name: str = "inline") -> Script:
        """Build from a list of rules or ``{"rules": [...]}``.

        Raises:
            ScriptError: naming the place of the first problem (``rules[1].replies[0].token_ids: ...``).
        """
        if isinstance(obj, Script):
            return obj
        try:
            script = cls.model_validate({"rules": obj} if isinstance(obj, list) else obj)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"])
            raise ScriptError(f"script{where}: {error['msg']}".replace("script.rules", "rules")) from None
        return script.model_copy(update={"name": name})

    @classmethod
    def load(cls, path: str | Path) -> Script:
        """Read a ``.json`` or ``.yaml``/``.yml`` script file."""
        path = Path(path)
        try:
            raw = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ScriptError(f"cannot read script {path}: {exc}") from exc
        try:
            if path.suffix.lower() in (".yaml", ".yml"):
                import yaml

                obj = yaml.safe_load(raw)
            else:
                obj = json.loads(raw)
        except Exception as exc:
            raise ScriptError(f"cannot parse script {path}: {exc}") from exc
        return cls.from_obj(obj, name=path.name)

    @classmethod
    def default(cls) -> Script:
        """What ``--backend scripted`` serves without ``--script``: one fixed answer to everything."""
        return cls.from_obj([{"match": None, "replies": ["Hello from the strands_slime dev server."]}])

    def select(self, prompt_text: str) -> tuple[int, int]:
        """(rule index, reply index) for a decoded prompt; raises ScriptError when no rule matches."""
        for rule_index, rule in enumerate(self.rules):
            if rule.match is None or rule.match in prompt_text:
                turns = max(0, prompt_text.count(ASSISTANT_MARKER) - 1)
                return rule_index, min(turns, len(rule.replies) - 1)
        patterns = ", ".join(repr(rule.match) for rule in self.rules)
        tail = prompt_text[-200:]
        raise ScriptError(
            f"scripted backend: no script rule matches the prompt (rules match {patterns}); "
            f"the prompt ends with {tail!r}"
        )


# --------------------------------------------------------------------------- tokenization


def prompt_key(prompt_ids: Sequence[int]) -> int:
    """A 64-bit key of a prompt, the same in every process (int and tuple hashes are not salted)."""
    return hash(tuple(prompt_ids)) & _MASK64


def scripted_logprob(key: int, position: int, token_id: int) -> float:
    """The scripted backend's logprob for ``token_id`` at ``position``: in (-8, -0.7], deterministic."""
    x = (key ^ (position * 0x9E3779B97F4A7C15) ^ (token_id * 0xC2B2AE3D27D4EB4F)) & _MASK64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    return -(0.7 + 7.3 * ((x >> 11) / float(1 << 53)))


def scripted_input_logprobs(prompt_ids: Sequence[int], start: int) -> list[float | None]:
    """The prompt logprobs for ``prompt_ids[start:]`` (first entry None, like SGLang)."""
    values: list[float | None] = []
    for position in range(start, len(prompt_ids)):
        values.append(None if position == start else scripted_logprob(0, position, prompt_ids[position]))
    return values


# --------------------------------------------------------------------------- backend


class ScriptedBackend(Backend):
    """Replies from a :class:`Script`; prefix reuse is tracked so ``cached_tokens`` is realistic."""

    name = "scripted"
    default_max_running_requests = 1024

    def __init__(
        self,
        script: Script | list[Any] | dict[str, Any],
        tokens: TokenizerWorker,
        *,
        context_length: int | None = None,
        prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS,
    ) -> None:
        self.script = Script.from_obj(script)
        self.tokens = tokens
        self.vocab_size = tokens.vocab_size
        self.eos_token_ids = frozenset(tokens.default_eos_ids())
        eos = tokens.tokenizer.eos_token_id
        if eos is None:
            raise ScriptError("scripted backend: the tokenizer has no eos_token_id to end text replies")
        self.eos_token_id = int(eos)
        self.default_context_length = context_length or DEFAULT_CONTEXT_LENGTH
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self.reply_ids = self._tokenize_replies()
        first = self.script.rules[0]
        # One catch-all rule with one reply: the prompt text cannot change the answer.
        self._needs_prompt_text = not (first.match is None and len(first.replies) == 1)
        self._concatenable = tokens.decodes_by_concatenation()
        self._continuations: collections.OrderedDict[int, _ScriptedState] = collections.OrderedDict()

    def _tokenize_replies(self) -> list[list[tuple[int, ...]]]:
        table: list[list[tuple[int, ...]]] = []
        for rule_index, rule in enumerate(self.script.rules):
            row = []
            for reply_index, reply in enumerate(rule.replies):
                if reply.token_ids is None:
                    assert reply.text is not None
                    row.append((*self.tokens.encode_sync(reply.text), self.eos_token_id))
                    continue
                bad = [tok for tok in reply.token_ids if tok >= self.vocab_size]
                if bad:
                    raise ScriptError(
                        f"rules[{rule_index}].replies[{reply_index}].token_ids: ids {bad[:5]} are outside "
                        f"the vocabulary (size {self.vocab_size})"
                    )
                row.append(tuple(reply.token_ids))
            table.append(row)
        return table

    def remember_continuation(self, sequence: list[int], state: _ScriptedState) -> None:
        """A reply cut short after ``sequence``: a request whose prompt is exactly ``sequence`` goes on
        with the rest of that reply (as a model continues its own partial output), with the same
        logprobs an uncut reply would have had."""
        self._continuations[prompt_key(sequence)] = state
        self._continuations.move_to_end(prompt_key(sequence))
        while len(self._continuations) > MAX_CONTINUATIONS:
            self._continuations.popitem(last=False)

    async def prepare(self, request: GenerationRequest) -> None:
        """Pick the rule and reply for the prompt and check it against the request's grammar.

        Raises:
            ProtocolError: no rule matches, or the reply violates the request's constraint.
        """
        if request.top_logprobs_num or request.token_ids_logprob:
            raise ProtocolError.value(
                "The scripted backend has no distribution for top_logprobs_num or token_ids_logprob; "
                "use the hf backend."
            )
        await super().prepare(request)  # the grammar
        continuation = self._continuations.pop(prompt_key(request.input_ids), None)
        if continuation is not None:
            request.backend_state = continuation
        elif not self._needs_prompt_text:
            request.backend_state = _ScriptedState(self.reply_ids[0][0], None)
        else:
            text = await self._prompt_text(request.input_ids)
            try:
                rule_index, reply_index = self.script.select(text)
            except ScriptError as exc:
                raise ProtocolError.value(str(exc)) from None
            request.backend_state = _ScriptedState(self.reply_ids[rule_index][reply_index], text)
        if request.grammar is not None:
            await self._check_constraint(request, request.backend_state.reply)

    async def _check_constraint(self, request: GenerationRequest, reply: tuple[int, ...]) -> None:
        """A scripted reply the request's grammar does not admit is a script error, never served."""
        from strands_slime.devserver.grammar import find_violation, requested_grammar

        engine, compiled = request.grammar
        index = find_violation(engine.matcher(compiled), list(reply), self.eos_token_ids)
        if index is None:
            return
        key_type = (requested_grammar(request.params) or ("grammar", ""))[0]
        before = await self.tokens.decode(list(reply[:index]))
        piece = await self.tokens.decode([reply[index]])
        raise ProtocolError.value(
            f"scripted backend: the reply violates the request's {key_type} constraint at token {index} "
            f"({piece!r} after {before[-80:]!r})"
        )

    async def _prompt_text(self, ids: list[int]) -> str:
        """The prompt decoded with special tokens, reusing the text of a cached earlier turn.

        Byte-level decoding concatenates exactly at a character boundary, so only the new tokens
        are decoded when a cached sequence's prompt is a prefix of this one (no U+FFFD at the seam).
        """
        if self._concatenable:
            matched, payload = self.prefix_cache.lookup(ids, len(ids), record=False)
            if payload is not None and payload[0] <= matched and not payload[1].endswith("\ufffd"):
                known, prefix_text = payload
                suffix = await self.tokens.decode(ids[known:]) if known < len(ids) else ""
                if not suffix.startswith("\ufffd"):
                    return prefix_text + suffix
        return await self.tokens.decode(ids)

    def open(self, request: GenerationRequest) -> Generation:
        """Start replaying the chosen reply for an admitted request."""
        return _ScriptedGeneration(self, request)

    def model_info(self) -> dict[str, Any]:
        """Pretend model info for ``/model_info`` (the tokenizer's path and a scripted model type)."""
        return {
            "model_path": f"scripted:{self.script.name}",
            "tokenizer_path": self.tokens.name_or_path,
            "model_type": None,
            "architectures": None,
        }


@dataclass(frozen=True, slots=True)
class _ScriptedState:
    reply: tuple[int, ...]
    prompt_text: str | None
    start: int = 0
    """Where in ``reply`` this request starts (a continuation of a cut-short reply)."""
    key: int | None = None
    """The logprob key of the request that started the reply (None: this request's own)."""


class _ScriptedGeneration(Generation):
    def __init__(self, backend: ScriptedBackend, request: GenerationRequest) -> None:
        self.backend = backend
        self.request = request
        state: _ScriptedState = request.backend_state
        self.reply = state.reply
        self.prompt_text = state.prompt_text
        self.start = self.position = state.start
        self.key = prompt_key(request.input_ids) if state.key is None else state.key

    async def prefill(self) -> PrefillResult:
        request = self.request
        max_reuse = request.prompt_tokens - 1
        if request.wants_input_logprobs:
            max_reuse = min(max_reuse, request.logprob_start_len)
        cached, _ = self.backend.prefix_cache.lookup(request.input_ids, max_reuse)
        result = PrefillResult(cached_tokens=cached)
        if request.wants_input_logprobs:
            start = request.logprob_start_len
            result.input_logprobs = scripted_input_logprobs(request.input_ids, start)
        return result

    async def next_tokens(self, limit: int) -> list[TokenStep]:
        chunk = self.reply[self.position : self.position + max(1, limit)]
        start = self.position
        self.position += len(chunk)
        request, key = self.request, self.key
        steps = []
        for offset, tok in enumerate(chunk):
            position = start + offset
            step = TokenStep(token_id=tok, logprob=scripted_logprob(key, position, tok))
            if request.return_top_p_token_ids:  # synthetic nucleus: the token and 0-2 of its neighbours
                step.top_p_ids = [(tok + i) % self.backend.vocab_size for i in range(1 + position % 3)]
            steps.append(step)
        return steps

    async def close(self, output_ids: list[int]) -> None:
        # Like SGLang's radix cache: everything that has KV, i.e. all but the last sampled token.
        sequence = self.request.input_ids + output_ids[:-1]
        payload = None if self.prompt_text is None else (len(self.request.input_ids), self.prompt_text)
        self.backend.prefix_cache.insert(sequence, payload)
        reached = self.start + len(output_ids)
        if output_ids and reached < len(self.reply):  # cut short (abort, length): a later prompt may go on
            self.backend.remember_continuation(
                self.request.input_ids + output_ids, _ScriptedState(self.reply, None, reached, self.key)
            )
