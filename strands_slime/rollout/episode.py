"""slime's custom generate function: one Strands agent episode per sample, token-in/token-out.

``--custom-generate-function-path strands_slime.generate``. Every returned sample satisfies slime's
invariants (``len(loss_mask) == len(rollout_log_probs) == response_length >= 1``) and no exception
escapes: a failure of the infrastructure (server unreachable, sandbox broken) yields a sample removed
from training (``remove_sample=True``, reward preset) with the reason in ``metadata["infra_error"]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import logging
import math
import random
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from strands import Agent
from strands.agent.conversation_manager import (
    ConversationManager,
    NullConversationManager,
    SlidingWindowConversationManager,
)
from strands.types.exceptions import MaxTokensReachedException

from strands_slime.config import ConfigError, RolloutConfig, get_rollout_config
from strands_slime.errors import EpisodeEnded, GenerationAborted, find_episode_end
from strands_slime.provider.chat import get_templater
from strands_slime.provider.chat_families import UnsupportedChatTemplate
from strands_slime.provider.client import SGLangClient
from strands_slime.provider.client_errors import SGLangAbortedError, SGLangClientError
from strands_slime.provider.limits import ToolLimiter
from strands_slime.provider.model import SGLangModel
from strands_slime.provider.tokenizer import load_tokenizer
from strands_slime.provider.trajectory import TokenTrajectory, token_array
from strands_slime.reward.dapo import preset_reward
from strands_slime.rollout import resume, slime_compat, startup
from strands_slime.rollout.episode_metadata import (
    EPISODE_METADATA_KEYS,
    RESTARTS_KEY,
    RESUMES_KEY,
    EpisodeMetadata,
    write_keys,
)
from strands_slime.rollout.executor import SAMPLE_INPUT_FIELDS, WorkerDied, get_executor, running_executor
from strands_slime.runtime import get_runtime

logger = logging.getLogger(__name__)

STICKY_ROUTER_POLICIES = ("consistent_hashing", "manual")
"""Router policies that pin requests carrying the same ``X-SMG-Routing-Key`` to one engine."""


@dataclass
class EpisodeOutcome:
    """How the episode ended, before it is written into the sample."""

    status: str = "COMPLETED"
    finish_reason: str = "stop"
    infra_error: str | None = None
    aborted_by_slime: bool = False


@dataclass
class ResumeParts:
    """What an episode needs to save itself when it is aborted (``--partial-rollout``)."""

    agent: Agent
    recorder: resume.ToolResultRecorder
    resumed_segments: int = 0
    """Segments of the trajectory the sample already held when the attempt started (0: a fresh start)."""
    masked_null_logprobs: int = 0
    """Null logprobs masked in the part the sample already held."""


#: Small young generations and no automatic full collection (the runtime runs those at quiet points,
#: ``Runtime.tune_gc``): a collection's pause grows with what it walks, and what it walks at a thousand
#: episodes in flight is mostly the token lists of samples that just finished. A gen-1 collection after
#: every second gen-0 one walks each survivor once more, as a larger gen-1 threshold would, but in
#: smaller pieces. Measured in the soak (benchmarks/soak.py, docs/soak.md) with 1,024 episodes in flight:
#: gen-1 pauses 111-140 ms and full ones up to 186 ms at (10,000, 20, 100), 70 ms at (6,000, 1), 13-27 ms
#: here with the runtime's scheduled young collections; CPU per turn +3 % (benchmarks/bench_provider.py).
GC_THRESHOLDS = (2_000, 1, 1_000_000)


def tune_gc_once() -> None:
    """Freeze the long-lived heap (slime's and ours), keep young collections small and run full ones
    at quiet points (``Runtime.tune_gc``).

    Hundreds of episodes allocate many short-lived objects; with the default thresholds the collector
    rescans everything alive again and again. Measured in benchmarks/ (docs/benchmarks.md, docs/soak.md).
    The runtime owns the tuning: its ``reset``/``close`` undo it."""
    get_runtime().tune_gc(GC_THRESHOLDS)


def _log_once(message: str, *, level: int = logging.ERROR, key: str | None = None) -> None:
    """Log ``message`` the first time its ``key`` (default: the message) occurs in this process."""
    if get_runtime().first_time(message if key is None else key):
        logger.log(level, message)


def get_client(args: Any, config: RolloutConfig) -> SGLangClient:
    """One client per router URL and client settings; it works on any event loop."""
    settings = config.client
    key = (
        getattr(args, "sglang_router_ip", None),
        getattr(args, "sglang_router_port", None),
        settings.model_dump_json(),
    )
    clients = get_runtime().clients
    client = clients.get(key)
    if client is None or client.closed:
        overrides: dict[str, Any] = {
            "timeout": settings.timeout_s,
            "max_retries": settings.max_retries,
            "retry_delay": settings.retry_delay_s,
            "connect_timeout": settings.connect_timeout_s,
            "first_byte_timeout": settings.first_byte_timeout_s,
            "stall_timeout": settings.stall_timeout_s,
            "max_retry_delay": settings.max_retry_delay_s,
        }
        if settings.max_connections:
            overrides["max_connections"] = settings.max_connections
        client = SGLangClient.from_slime_args(args, **overrides)
        clients[key] = client
    return client


async def get_tokenizer(args: Any, config: RolloutConfig) -> Any:
    """slime's own tokenizer when running inside slime, else ``tokenizer_path``/``hf_checkpoint``
    (loaded once, in a worker thread), with its chat template compiled once off the loop too."""
    tokenizer = None if config.tokenizer_path else slime_compat.slime_tokenizer(args)
    if tokenizer is None:
        path = config.tokenizer_path or getattr(args, "hf_checkpoint", None)
        try:
            tokenizer = await startup.load_once(("tokenizer", path), load_tokenizer, path)
        except Exception as exc:
            raise ConfigError(f"cannot load the tokenizer: {type(exc).__name__}: {exc}") from exc
    chat_template = _chat_template(config)
    await startup.load_once(
        ("templater", id(tokenizer), chat_template, config.enable_thinking, config.chat_family),
        functools.partial(
            get_templater,
            tokenizer,
            chat_template=chat_template,
            enable_thinking=config.enable_thinking,
            chat_family=config.chat_family,
        ),
    )
    return tokenizer


def _chat_template(config: RolloutConfig) -> str | None:
    if not config.chat_template_path:
        return None
    return get_runtime().read_text(config.chat_template_path)


def _refuse_templated_prompt(prompt: Any, templater: Any) -> None:
    """A string prompt that ends with the chat template's own generation prompt was templated already
    (slime's ``--apply-chat-template``); templating it again would train on a doubled template, in
    every sample, so the job stops. A plain prompt that ends with the word "assistant" is fine."""
    if isinstance(prompt, str) and templater.ends_with_generation_prompt(prompt):
        raise ConfigError(
            "sample.prompt is already chat-templated (it ends with the template's generation prompt "
            f"{templater.assistant_header!r}; slime's --apply-chat-template?); agent rollouts template the "
            "prompt themselves: drop that flag"
        )


def _prompt_parts(prompt: Any) -> tuple[str | None, list[dict[str, Any]], str]:
    """``(system override, history, last user text)`` from a string or a chat-message list."""
    if isinstance(prompt, str):
        return None, [], prompt
    if not isinstance(prompt, list) or not prompt:
        raise ConfigError(
            f"sample.prompt must be a string or a non-empty message list, got {type(prompt).__name__}"
        )
    system: str | None = None
    history: list[dict[str, Any]] = []
    for message in prompt:
        if not isinstance(message, Mapping) or "role" not in message:
            raise ConfigError(f"prompt messages need a 'role': {message!r:.200}")
        content = message.get("content", "")
        text = (
            content
            if isinstance(content, str)
            else "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
        )
        if message["role"] == "system":
            system = text
        else:
            history.append({"role": message["role"], "content": [{"text": text}]})
    if history[-1]["role"] != "user" if history else True:
        raise ConfigError("the prompt's last message must be a user message")
    last = history.pop()
    return system, history, last["content"][0]["text"]


_ATTEMPT_FIELDS: dict[str, Any] = {
    "response": "",
    "response_length": 0,
    "loss_mask": None,
    "rollout_log_probs": None,
    "rollout_top_p_token_ids": None,
    "rollout_top_p_token_offsets": None,
    "rollout_routed_experts": None,
    "teacher_log_probs": None,
    "reward": None,
    "remove_sample": False,
    "non_generation_time": 0.0,
}
"""Sample fields an attempt writes, with their fresh values (lists and info objects are added below)."""

SAMPLE_RESULT_FIELDS: tuple[str, ...] = (
    "tokens",
    *_ATTEMPT_FIELDS,
    "weight_versions",
    "spec_info",
    "prefix_cache_info",
    "status",
    "metadata",
    "session_id",
    "rollout_id",
)
"""Every Sample attribute ``generate`` writes: what a worker process of the episode executor
(:mod:`strands_slime.rollout.executor`) ships back onto slime's own sample."""

RESUME_FIELDS: tuple[str, ...] = tuple(
    name for name in SAMPLE_RESULT_FIELDS if name not in SAMPLE_INPUT_FIELDS
)
"""What the episode executor also ships of an ABORTED sample that resumes (``--partial-rollout``): the
kept part of its response, as the in-process path finds it on the sample (``metadata``, an input,
carries the saved state)."""


def reset_attempt(sample: Any) -> None:
    """Undo whatever an earlier attempt (ours or another generate's) left on the sample."""
    previous = bool(getattr(sample, "tokens", None)) or slime_compat.status_name(sample) != "pending"
    _clear_attempt_fields(sample)
    metadata = dict(getattr(sample, "metadata", None) or {})
    for key in EPISODE_METADATA_KEYS:  # the saved episode state (resume.STATE_KEY) included
        metadata.pop(key, None)
    if previous:
        metadata[RESTARTS_KEY] = int(EpisodeMetadata.from_metadata(metadata).restarts or 0) + 1
    sample.metadata = metadata
    sample.status = slime_compat.status(sample, "PENDING")


def prepare_resume(args: Any, sample: Any) -> None:
    """Ready an ABORTED sample whose episode resumes: the finished part of its response stays (tokens,
    logprobs, top-p arrays, routed experts, weight versions, cache and speculative counters, sandbox
    time), the rest of the attempt's outcome goes. Under ``--mask-offpolicy-in-partial-rollout`` the
    kept response gets loss mask 0, as slime's ``generate_and_rm`` does before calling ``generate``."""
    metadata = dict(getattr(sample, "metadata", None) or {})
    for key in EPISODE_METADATA_KEYS:  # the saved episode state (resume.STATE_KEY) included
        metadata.pop(key, None)
    metadata[RESUMES_KEY] = int(EpisodeMetadata.from_metadata(metadata).resumes or 0) + 1
    sample.metadata = metadata
    sample.reward = None
    sample.remove_sample = False
    if getattr(sample, "teacher_log_probs", None) is not None:
        sample.teacher_log_probs = None
    if getattr(args, "mask_offpolicy_in_partial_rollout", False) and sample.response_length > 0:
        sample.loss_mask = [0] * sample.response_length
    sample.status = slime_compat.status(sample, "PENDING")


def _start_over(
    sample: Any, model: SGLangModel, limiter: ToolLimiter, tool_stats: Any, recorder: Any
) -> None:
    """Drop a half-restored episode and whatever the sample kept: the attempt runs from scratch."""
    reset_attempt(sample)
    model.reset()
    limiter.reset()
    for name in ("calls", "errors", "timeouts", "infra_failures", "seconds"):
        if tool_stats is not None and hasattr(tool_stats, name):
            setattr(tool_stats, name, type(getattr(tool_stats, name))())
    if recorder is not None:
        recorder.finished.clear()


def _clear_attempt_fields(sample: Any) -> None:
    sample.tokens = []
    for name, value in _ATTEMPT_FIELDS.items():
        if hasattr(sample, name) or name not in ("teacher_log_probs", "rollout_routed_experts"):
            setattr(sample, name, value)
    sample.weight_versions = []
    for name in ("spec_info", "prefix_cache_info"):
        info = getattr(sample, name, None)
        if info is not None:
            setattr(sample, name, type(info)())


def _budgets(
    args: Any, config: RolloutConfig, sampling_params: Mapping[str, Any], evaluation: bool
) -> tuple[int | None, int | None]:
    """Episode response budget and context limit.

    The response budget is what slime resolved for this sample: ``sampling_params["max_new_tokens"]``
    (``--rollout-max-response-len``, ``--eval-max-response-len`` or an eval dataset's
    ``max_response_len``), falling back to the args when a caller leaves it out."""
    response = sampling_params.get("max_new_tokens")
    if response is None and evaluation:
        response = getattr(args, "eval_max_response_len", None)
    if response is None:
        response = getattr(args, "rollout_max_response_len", None)
    if evaluation:
        context = getattr(args, "eval_max_context_len", None) or getattr(
            args, "rollout_max_context_len", None
        )
    else:
        context = getattr(args, "rollout_max_context_len", None)
    return (int(response) if response else None), (
        config.max_context_len or (int(context) if context else None)
    )


def _routing_key(args: Any, sample: Any, config: RolloutConfig) -> str | None:
    wanted = config.routing == "always" or (
        config.routing == "auto" and getattr(args, "router_policy", None) in STICKY_ROUTER_POLICIES
    )
    if not wanted:
        return None
    if not getattr(sample, "session_id", None):
        sample.session_id = str(uuid.uuid4())
    return sample.session_id


def _fans_out(config: RolloutConfig, evaluation: bool) -> bool:
    """Fan-out applies to training only: slime's eval metrics count every returned sample."""
    return config.fanout.enabled and not evaluation


def _conversation_manager(config: RolloutConfig, fanout: bool, pinned: int) -> ConversationManager:
    """Append-only history (token-in/token-out needs it), unless fan-out lets the agent compact it;
    the prompt (history and question) stays pinned."""
    if not fanout:
        return NullConversationManager()
    window = config.fanout.window_messages
    return SlidingWindowConversationManager(
        window_size=max(window or 40, pinned + 2), per_turn=window is not None, pin_first=pinned
    )


async def _warm_up(args: Any, config: RolloutConfig) -> Any:
    """Everything an episode needs once per process or loop: the tokenizer and chat template (worker
    threads), the sandbox zygote and the server's context length. Done before episodes are admitted,
    so none of them waits on it mid-set-up and then resumes together with hundreds of others."""
    tokenizer = await get_tokenizer(args, config)
    if "execute_python_code" in config.tools:
        from strands_slime.sandbox import get_shared_sandbox

        await get_shared_sandbox(config.sandbox).start()
    with contextlib.suppress(SGLangClientError):  # the model asks again and logs it
        await get_client(args, config).max_model_len()
    return tokenizer


async def warm_up(args: Any, config: RolloutConfig, abort_check: Any) -> Any:
    """The loop's one-time start-up (:func:`_warm_up`), shared by every episode of this loop that asks;
    returns the tokenizer. The episode executor's workers run it before they report ready."""
    key = (
        id(config),
        getattr(args, "sglang_router_ip", None),
        getattr(args, "sglang_router_port", None),
        getattr(args, "hf_checkpoint", None),
    )
    return await startup.once_per_loop(key, lambda: _warm_up(args, config), abort_check)


async def _build_tools(config: RolloutConfig, abort_check: Any) -> tuple[list[Any], Any]:
    if "execute_python_code" not in config.tools:
        return [], None
    from strands_slime.sandbox import ToolStats, create_python_tool, get_shared_sandbox

    sandbox = get_shared_sandbox(config.sandbox)
    await sandbox.start()  # no-op once running; keeps the zygote's start-up out of the episode's tool time
    stats = ToolStats()
    return [create_python_tool(sandbox, stats=stats, abort_check=abort_check)], stats


async def _run_episode(
    args: Any,
    sample: Any,
    sampling_params: Mapping[str, Any],
    evaluation: bool,
    config: RolloutConfig,
    tokenizer: Any,
    abort_check: Any,
    saved: Mapping[str, Any] | None = None,
) -> tuple[EpisodeOutcome, SGLangModel | None, ToolLimiter | None, Any, ResumeParts | None]:
    """One agent episode, or the rest of one when ``saved`` holds an aborted attempt's state."""
    system, history, user_text = _prompt_parts(sample.prompt)
    response_budget, context_limit = _budgets(args, config, sampling_params, evaluation)
    model = SGLangModel(
        tokenizer,
        client=get_client(args, config),
        sampling_params=dict(sampling_params),
        tool_parser=config.tool_parser,
        chat_family=config.chat_family,
        enable_thinking=config.enable_thinking,
        chat_template=_chat_template(config),
        max_response_tokens=response_budget,
        context_window_limit=context_limit,
        routing_key=_routing_key(args, sample, config),
        abort_check=abort_check,
        return_routed_experts=bool(getattr(args, "use_rollout_routing_replay", False)),
        request_trace=slime_compat.request_trace(sample),
        new_segment_on_context_change=_fans_out(config, evaluation),
    )
    _refuse_templated_prompt(sample.prompt, model.templater)
    limiter = ToolLimiter(
        config.max_tool_iters, config.max_tool_calls, max_model_calls=config.max_model_calls
    )
    recorder = None
    if resume.enabled(args, evaluation):
        recorder = resume.ToolResultRecorder(abort_check, (saved or {}).get("tool_results"))
    tools, tool_stats = await _build_tools(
        config, recorder.tool_abort_check if recorder is not None else abort_check
    )
    messages: list[Any] = history
    if saved is not None:
        try:
            messages = resume.restore(saved, sample, model, limiter, tool_stats)
        except (KeyError, TypeError, ValueError) as exc:
            logger.warning(
                "partial rollout: starting the episode over: the saved state does not restore (%s)", exc
            )
            saved, messages = None, history
            _start_over(sample, model, limiter, tool_stats, recorder)
    agent = Agent(
        model=model,
        tools=tools,
        system_prompt=system if system is not None else config.system_prompt,
        messages=messages,
        callback_handler=None,
        conversation_manager=_conversation_manager(
            config, _fans_out(config, evaluation), pinned=len(history) + 1
        ),
        retry_strategy=None,
        hooks=[limiter] if recorder is None else [limiter, recorder],
    )
    parts = None
    if recorder is not None:
        parts = ResumeParts(agent, recorder)
        if saved is not None:
            parts.resumed_segments = len(saved["trajectory"]["segments"])
            parts.masked_null_logprobs = int(saved.get("masked_null_logprobs", 0))
    outcome = EpisodeOutcome()
    finished = saved.get("finished") if saved is not None else None
    if finished:  # the episode had ended before the abort was seen: nothing to run
        outcome.status, outcome.finish_reason = str(finished[0]), str(finished[1])
        return outcome, model, limiter, tool_stats, parts
    try:
        # resumed: the saved history already ends with the next step (a model call or a tool round)
        await agent.invoke_async(user_text if saved is None else None, invocation_state={})
    except MaxTokensReachedException:
        outcome.status, outcome.finish_reason = "TRUNCATED", "length"
    except Exception as exc:  # every failure becomes a well-formed sample
        ended = find_episode_end(exc)
        if isinstance(ended, GenerationAborted):
            # slime's own generate returns ABORTED for any server-side abort (its abort, a weight
            # update, an operator's /abort_request): fully-async rollouts requeue such samples.
            outcome.status, outcome.finish_reason = "ABORTED", "abort"
            outcome.aborted_by_slime = abort_check()
            if recorder is not None and _can_keep_cut_call(args, sampling_params, evaluation, ended):
                model.adopt_cut_call(ended.trajectory)  # resumed from there, as slime's generate does
        elif isinstance(ended, EpisodeEnded):
            outcome.status, outcome.finish_reason = "TRUNCATED", ended.reason
        else:
            outcome.status, outcome.finish_reason = "FAILED", "error"
            outcome.infra_error = _describe(exc)
            if isinstance(_root(exc), SGLangClientError):  # the server's fault: the cause says it all
                logger.warning("episode failed: %s", outcome.infra_error)
            else:  # our bug or the agent's: keep the traceback
                logger.warning("episode failed: %s", outcome.infra_error, exc_info=exc)
        if model.first_prompt_ids is None:  # ended before the first request was rendered
            await _render_first_prompt(model, agent, user_text)
    else:
        outcome.finish_reason = model.stats.last_finish_reason or "stop"
    model.settle_cut_call()
    if tool_stats is not None and getattr(tool_stats, "infra_failures", 0) and outcome.infra_error is None:
        outcome.infra_error = f"sandbox failed {tool_stats.infra_failures} time(s)"
    return outcome, model, limiter, tool_stats, parts


def _can_keep_cut_call(
    args: Any, sampling_params: Mapping[str, Any], evaluation: bool, ended: GenerationAborted
) -> bool:
    """Whether the output of the call the server aborted can stay in the sample: it has some, and
    what slime replays from it (top-p spans, routed experts) came with it."""
    partial = ended.trajectory
    if partial is None or not partial.ends_with_output:
        return False
    meta = partial.segment_info[-1].meta_info or {}
    try:
        _check_replay_meta(
            meta,
            _wants_top_p(args, sampling_params, evaluation),
            bool(getattr(args, "use_rollout_routing_replay", False)),
        )
    except ConfigError:
        return False
    return True


async def _render_first_prompt(model: SGLangModel, agent: Agent, user_text: str) -> None:
    """Give ``model.first_prompt_ids`` the prompt the episode would have sent (never raises)."""
    messages = [*agent.messages]
    if not messages or messages[-1].get("role") != "user":
        messages.append({"role": "user", "content": [{"text": user_text}]})
    try:
        model.first_prompt_ids = token_array(
            await model.initial_prompt_ids(
                messages, agent.tool_registry.get_all_tool_specs(), agent.system_prompt
            )
        )
    except Exception as exc:
        logger.debug("could not render the prompt of a failed episode: %s", exc)


def _root(exc: BaseException) -> BaseException:
    """The original error under Strands' wrappers and ``raise ... from`` chains."""
    seen: set[int] = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        original = getattr(exc, "original_exception", None)
        if isinstance(original, BaseException):
            exc = original
        elif exc.__cause__ is not None:
            exc = exc.__cause__
        elif exc.__context__ is not None and not exc.__suppress_context__:
            exc = exc.__context__
        else:
            break
    return exc


def _describe(exc: BaseException) -> str:
    root = _root(exc)
    return f"{type(root).__name__}: {root}"[:2000]


def _wants_top_p(args: Any, sampling_params: Mapping[str, Any], evaluation: bool) -> bool:
    """slime replays the top-p nucleus (``--rollout-top-p < 1``): every trained sample needs the arrays."""
    custom = sampling_params.get("custom_params")
    if isinstance(custom, Mapping) and custom.get("return_top_p_token_ids"):
        return True
    return not evaluation and float(getattr(args, "rollout_top_p", 1.0) or 1.0) != 1.0


def _start_response(sample: Any, prompt_ids: list[int], want_top_p: bool) -> None:
    """Prompt only, no response yet; top-p arrays start empty so every later span lines up."""
    sample.tokens = list(prompt_ids)
    sample.response = ""
    sample.response_length = 0
    sample.loss_mask = None
    sample.rollout_log_probs = None
    if want_top_p:
        sample.rollout_top_p_token_ids = []
        sample.rollout_top_p_token_offsets = [0]


def _append(sample: Any) -> Any:
    """``sample.append_response_tokens``: slime's own rules (our stand-in has the same method)."""
    method = getattr(sample, "append_response_tokens", None)
    if method is None:
        raise ConfigError(
            f"{type(sample).__module__}.{type(sample).__name__} has no append_response_tokens: this slime "
            "is older than the one strands_slime targets (THUDM/slime 624b824 or later)"
        )
    return method


def _replay_trajectory(
    args: Any, sample: Any, trajectory: Any, want_top_p: bool, resumed_segments: int = 0
) -> int:
    """Rebuild the sample call by call from the trajectory; returns how many null logprobs were masked.

    A resumed episode (``resumed_segments`` > 0) keeps what the sample holds, the trajectory's first
    ``resumed_segments`` segments, and appends only the rest, as slime's own generate does."""
    if resumed_segments:
        kept = len(sample.tokens)
        if (
            len(trajectory.segment_info) < resumed_segments
            or len(trajectory) < kept
            or trajectory.token_ids[:kept].tolist() != list(sample.tokens)
        ):
            raise RuntimeError("the resumed episode no longer extends the response the sample holds")
        segments = trajectory.segment_info[resumed_segments:]
        first_new = sample.response_length
    else:
        prompt_len = trajectory.initial_prompt_length
        _start_response(sample, trajectory.token_ids[:prompt_len].tolist(), want_top_p)
        segments = trajectory.segment_info[1:]
        first_new = 0
    append = _append(sample)
    replay_experts = bool(getattr(args, "use_rollout_routing_replay", False))
    for segment in segments:
        ids = trajectory.token_ids[segment.start : segment.start + segment.length].tolist()
        if segment.is_output:
            meta = segment.meta_info or {}
            _check_replay_meta(meta, want_top_p, replay_experts)
            logprobs = trajectory.logprobs[segment.start : segment.start + segment.length].tolist()
            append(args, tokens=ids, log_probs=logprobs, trainable=True, meta_info=meta)
        else:
            append(args, tokens=ids, trainable=False)
    mask, logprobs = sample.loss_mask, sample.rollout_log_probs
    masked = 0
    for i in range(first_new, len(logprobs)):
        value = logprobs[i]
        if math.isinf(value) or math.isnan(value):  # the server sent no logprob: train nothing there
            mask[i], logprobs[i] = 0, 0.0
            masked += 1
    if masked:
        _warn_masked_logprobs_once(trajectory, masked)
    return masked


def _warn_masked_logprobs_once(trajectory: TokenTrajectory, masked: int) -> None:
    """One WARNING per process and cause: model tokens without a logprob are silently untrained."""
    whole_replies = sum(
        1
        for segment in trajectory.segment_info
        if segment.is_output
        and all(math.isinf(v) for v in trajectory.logprobs[segment.start : segment.start + segment.length])
    )
    if whole_replies:
        cause = "a /generate reply had no logprob for any of its output tokens (return_logprob ignored?)"
    else:
        cause = "the server returned null logprobs for some output tokens"
    _log_once(
        f"masked {masked} model token(s) out of training because {cause}; counted per sample in "
        "metadata.masked_null_logprobs (rollout/strands/masked_null_logprobs/*); logged once per process",
        level=logging.WARNING,
        key=f"masked_null_logprobs: {cause}",
    )


def _check_replay_meta(meta: Mapping[str, Any], want_top_p: bool, replay_experts: bool) -> None:
    """A server that ignores what slime asked for would make every sample fail or, for routed
    experts, train on made-up routing: that is a deployment error, not a sample's."""
    if want_top_p and not any(key in meta for key in ("top_p_token_ids", "top_p_kept_token_ids")):
        raise ConfigError(
            "--rollout-top-p < 1 needs top-p replay from SGLang (slime's patched SGLang), but a reply "
            "had no top_p_token_ids"
        )
    if replay_experts and "routed_experts" not in meta:
        raise ConfigError(
            "--use-rollout-routing-replay needs routed experts from SGLang (--enable-return-routed-experts "
            "on an MoE model), but a reply had no routed_experts"
        )


def _append_inert_token(args: Any, sample: Any, tokenizer: Any) -> None:
    """slime needs ``response_length >= 1``: one untrained token when the episode produced nothing."""
    pad = getattr(tokenizer, "eos_token_id", None) or 0
    _append(sample)(args, tokens=[int(pad)], trainable=False)


def _fill_missing_routed_experts(args: Any, sample: Any) -> None:
    """Under ``--use-rollout-routing-replay`` every sample needs ``[len(tokens) - 1, layers, topk]``
    routed experts; one with no model output (removed from training) gets experts ``0..topk-1`` in
    every row (slime rejects an all-zero capture as a broken one)."""
    if not getattr(args, "use_rollout_routing_replay", False):
        return
    if getattr(sample, "rollout_routed_experts", None) is not None:
        return
    layers, topk = int(args.num_layers), int(args.moe_router_topk)
    sample.rollout_routed_experts = [
        [list(range(topk)) for _ in range(layers)] for _ in range(len(sample.tokens) - 1)
    ]


def _episode_metadata(
    outcome: EpisodeOutcome,
    model: SGLangModel | None,
    limiter: ToolLimiter | None,
    tool_stats: Any,
    config: RolloutConfig,
    evaluation: bool,
    masked: int,
    abort_detection: str,
) -> EpisodeMetadata:
    """What this attempt records about the episode (see :class:`EpisodeMetadata` for every key)."""
    stats = model.stats if model is not None else None
    record = EpisodeMetadata(
        evaluation=evaluation,
        tool_iterations=limiter.tool_iter_count if limiter else 0,
        tool_calls=limiter.tool_call_count if limiter else 0,
        parse_errors=stats.parse_errors if stats else 0,
        tool_errors=getattr(tool_stats, "errors", 0),
        tool_timeouts=getattr(tool_stats, "timeouts", 0),
        sandbox_seconds=round(float(getattr(tool_stats, "seconds", 0.0)), 6),
        finish_reason=outcome.finish_reason,
        turns=stats.model_calls if stats else 0,
        final_text=(model.last_output_text if model is not None else None) or "",
        infra_error=outcome.infra_error,
        prompt_tokens=stats.prompt_tokens if stats else 0,
        cached_tokens=stats.cached_tokens if stats else 0,
        completion_tokens=stats.completion_tokens if stats else 0,
        retried_turns=stats.rolled_back_turns if stats else 0,
        turn_seconds=[round(t, 6) for t in stats.turn_seconds] if stats else [],
        masked_null_logprobs=masked,
        abort_detection=abort_detection,
    )
    if outcome.status == "ABORTED":
        record.abort_source = "slime" if outcome.aborted_by_slime else "server"
    if outcome.status == "TRUNCATED":
        record.truncation = outcome.finish_reason
    if config.keep_transcript and model is not None:
        record.transcript = model.transcript()
    return record


def _fill_sample(
    args: Any,
    sample: Any,
    outcome: EpisodeOutcome,
    model: SGLangModel | None,
    limiter: ToolLimiter | None,
    tool_stats: Any,
    config: RolloutConfig,
    evaluation: bool,
    tokenizer: Any,
    want_top_p: bool,
    trajectory: TokenTrajectory | None = None,
    abort_detection: str = "off",
    parts: ResumeParts | None = None,
) -> Any:
    if trajectory is None and model is not None:
        trajectory = model.trajectory
    masked = 0
    if trajectory is not None and trajectory.num_outputs:
        resumed = parts.resumed_segments if parts is not None else 0
        masked = _replay_trajectory(args, sample, trajectory, want_top_p, resumed)
        if resumed:
            masked += parts.masked_null_logprobs  # type: ignore[union-attr]
    else:
        _start_response(sample, _placeholder_prompt(model, sample, tokenizer), want_top_p)
    if not sample.response_length:
        _append_inert_token(args, sample, tokenizer)
    _fill_missing_routed_experts(args, sample)
    prompt_len = len(sample.tokens) - sample.response_length
    sample.response = (
        tokenizer.decode(sample.tokens[prompt_len:], skip_special_tokens=False) if tokenizer else ""
    )
    sample.status = slime_compat.status(sample, outcome.status)
    metadata = dict(getattr(sample, "metadata", None) or {})
    record = _episode_metadata(
        outcome, model, limiter, tool_stats, config, evaluation, masked, abort_detection
    )
    metadata.update(record.to_metadata())
    sample.metadata = metadata
    sample.non_generation_time = float(getattr(tool_stats, "seconds", 0.0))
    if outcome.infra_error and outcome.status != "ABORTED":
        _remove(args, sample, config, evaluation)
    return sample


def _remove(args: Any, sample: Any, config: RolloutConfig, evaluation: bool) -> None:
    """An infrastructure failure: FAILED, out of training, and the preset reward (same keys as a real one)."""
    sample.status = slime_compat.status(sample, "FAILED")
    sample.remove_sample = True
    sample.reward = preset_reward(
        args, config.infra_failure_reward, evaluation=evaluation, config=config.reward
    )
    # slime logs raw_reward when any sample has it; keep it numeric on every sample
    write_keys(sample.metadata, raw_reward=config.infra_failure_reward)


def _placeholder_prompt(model: SGLangModel | None, sample: Any, tokenizer: Any) -> list[int]:
    """Prompt ids for a sample that produced no output: the episode's exact first prompt when it got
    that far, else the user message alone."""
    if model is not None and model.first_prompt_ids:
        return list(model.first_prompt_ids)
    if model is None or tokenizer is None:
        return [0]
    try:
        _, _, user = _prompt_parts(sample.prompt)
    except ConfigError:
        return [0]
    text = model.templater.initial_prompt_text([{"role": "user", "content": user}], None, None)
    return model.templater.encode(text) or [0]


async def generate(
    args: Any, sample: Any, sampling_params: Mapping[str, Any], evaluation: bool = False
) -> Any:
    """Run one agent episode for ``sample`` and fill its tokens, mask, logprobs, status and metadata.

    Raises :class:`~strands_slime.config.ConfigError` on a configuration error (invalid rollout YAML,
    a chat-templated prompt, an unloadable tokenizer): every sample would fail the same way, so the
    job must stop before spending GPU time. Anything else becomes a well-formed sample.

    With ``executor: {workers: N}`` in the rollout config the episode runs in one of N worker
    processes (:mod:`strands_slime.rollout.executor`) and its result is written back onto ``sample``."""
    # slime starts a rollout's samples at once: the per-sample work before the first real wait would
    # otherwise run for all of them in one loop iteration
    await startup.episode_turn()
    try:
        config = get_rollout_config(args)
        if config.executor.workers is not None:
            return await _generate_in_workers(args, sample, sampling_params, evaluation, config)
        return await _generate(args, sample, sampling_params, evaluation)
    except ConfigError as exc:
        _log_once(f"strands_slime rollout configuration error, stopping: {exc}")
        raise


async def _generate_in_workers(
    args: Any, sample: Any, sampling_params: Any, evaluation: bool, config: RolloutConfig
) -> Any:
    """:func:`_episode_in_workers`, counted as a live episode of this process (``Runtime.episode``)."""
    with get_runtime().episode():
        return await _episode_in_workers(args, sample, sampling_params, evaluation, config)


async def _episode_in_workers(
    args: Any, sample: Any, sampling_params: Any, evaluation: bool, config: RolloutConfig
) -> Any:
    """``generate`` through the episode executor (:mod:`strands_slime.rollout.executor`): the same result as
    in-process, written onto ``sample``.

    Raises :class:`ConfigError` as ``generate`` does; a worker that dies mid-episode gives a FAILED,
    removed sample whose ``metadata.infra_error`` names the worker and how it died."""
    started = time.perf_counter()
    if config.gc_tuning:
        tune_gc_once()  # slime's process still holds every sample in flight
    flag = slime_compat.abort_flag(args)
    resuming = resume.saved_state(args, sample, evaluation) is not None
    if not resuming:
        reset_attempt(sample)  # a resumed one is readied in the worker, as in-process
    want_top_p = _wants_top_p(args, sampling_params, evaluation)
    try:
        executor = running_executor(args, config) or await get_executor(args, config, flag.check)
        kept_fields = RESUME_FIELDS if resuming else ()
        segments = await executor.run(args, sample, sampling_params, evaluation, flag.check, kept_fields)
        result = segments if _fans_out(config, evaluation) else sample
    except SGLangAbortedError:  # slime aborted while the workers started or were replaced
        if resuming:  # the episode never went on: the sample keeps its saved part, as in-process
            write_keys(sample.metadata, abort_source="slime")
            sample.status = slime_compat.status(sample, "ABORTED")
            return sample
        outcome = EpisodeOutcome(status="ABORTED", finish_reason="abort", aborted_by_slime=True)
        _fill_sample(
            args,
            sample,
            outcome,
            None,
            None,
            None,
            config,
            evaluation,
            None,
            want_top_p,
            abort_detection=flag.source,
        )
        result = [sample] if _fans_out(config, evaluation) else sample
    except WorkerDied as exc:
        logger.warning("episode failed: %s", exc)
        _fill_dead(args, sample, config, f"WorkerDied: {exc}", evaluation, want_top_p, flag.source)
        result = [sample] if _fans_out(config, evaluation) else sample
    seconds = round(time.perf_counter() - started, 6)  # slime's view: shipping included
    for item in result if isinstance(result, list) else [result]:
        # the worker watched its own copy of the flag; what detects aborts is slime's side's flag
        write_keys(item.metadata, generate_seconds=seconds, abort_detection=flag.source)
    return result


async def _generate(args: Any, sample: Any, sampling_params: Mapping[str, Any], evaluation: bool) -> Any:
    """One episode in this process (slime's or an executor worker's), counted as live (``Runtime.episode``)."""
    with get_runtime().episode():
        return await _episode(args, sample, sampling_params, evaluation)


async def _episode(args: Any, sample: Any, sampling_params: Mapping[str, Any], evaluation: bool) -> Any:
    started = time.perf_counter()
    abort_flag = slime_compat.abort_flag(args)
    abort_check = abort_flag.check
    saved = resume.saved_state(args, sample, evaluation)
    kept_metadata = dict(sample.metadata) if saved is not None else None
    if saved is None:
        reset_attempt(sample)
    else:
        prepare_resume(args, sample)
    config = get_rollout_config(args)  # a ConfigError propagates: see the docstring
    if _fans_out(config, evaluation):
        _check_fanout_args(args)
    want_top_p = _wants_top_p(args, sampling_params, evaluation)
    model = limiter = tool_stats = tokenizer = parts = None
    try:
        if config.gc_tuning:
            tune_gc_once()
        tokenizer = await warm_up(args, config, abort_check)
        await startup.episode_turn()  # hundreds of episodes start at once: a few per loop iteration
        if abort_check():
            outcome = EpisodeOutcome(status="ABORTED", finish_reason="abort", aborted_by_slime=True)
        else:
            outcome, model, limiter, tool_stats, parts = await _run_episode(
                args, sample, sampling_params, evaluation, config, tokenizer, abort_check, saved
            )
    except (asyncio.CancelledError, ConfigError):
        raise
    except UnsupportedChatTemplate as exc:
        raise ConfigError(str(exc)) from exc
    except SGLangAbortedError:  # slime aborted during the start-up
        outcome = EpisodeOutcome(status="ABORTED", finish_reason="abort", aborted_by_slime=True)
    except Exception as exc:
        logger.exception("strands_slime generate failed before the episode started")
        outcome = EpisodeOutcome(status="FAILED", finish_reason="error", infra_error=_describe(exc))
    # episodes end together (replies that arrived together, an abort cancelling dozens): filling their
    # samples and saving their state for resumption go a few per loop iteration
    await startup.episode_turn()
    finished = None
    if abort_check() and not outcome.aborted_by_slime:
        if outcome.status in resume.FINISHED_STATUSES:  # resuming it only reports this outcome
            finished = (outcome.status, outcome.finish_reason)
        outcome = EpisodeOutcome(status="ABORTED", finish_reason="abort", aborted_by_slime=True)
    if kept_metadata is not None and model is None and outcome.status == "ABORTED":
        # aborted again before the resumed episode started: the sample still holds its saved part
        sample.metadata = kept_metadata
        write_keys(sample.metadata, abort_source="slime")
        sample.status = slime_compat.status(sample, "ABORTED")
        return sample
    segments = [*model.closed_trajectories, model.trajectory] if model is not None else [None]
    if len(segments) > 1 and not segments[-1].num_outputs:
        segments.pop()  # compacted, then ended before the next output: nothing to train on there
    template = copy.deepcopy(sample) if len(segments) > 1 else None
    samples = [sample] + [copy.deepcopy(template) for _ in segments[1:]]
    for current, trajectory in zip(samples, segments, strict=True):
        try:
            _fill_sample(
                args,
                current,
                outcome,
                model,
                limiter,
                tool_stats,
                config,
                evaluation,
                tokenizer,
                want_top_p,
                trajectory=trajectory,
                abort_detection=abort_flag.source,
                parts=parts,
            )
        except ConfigError:
            raise
        except Exception as exc:  # last line of defence: still a valid, removed sample
            logger.exception("strands_slime could not fill the sample")
            _fill_dead(
                args,
                current,
                config,
                f"{type(exc).__name__}: {exc}",
                evaluation,
                want_top_p,
                abort_flag.source,
            )
        write_keys(current.metadata, generate_seconds=round(time.perf_counter() - started, 6))
    if parts is not None and model is not None and limiter is not None and outcome.status == "ABORTED":
        _save_for_resume(sample, model, limiter, tool_stats, parts, finished, config.keep_transcript)
    if not _fans_out(config, evaluation):
        return sample
    rollout_id = sample.index if isinstance(sample.index, int) else random.getrandbits(62)
    for position, current in enumerate(samples):
        current.rollout_id = rollout_id
        write_keys(current.metadata, fanout_segment=position, fanout_segments=len(samples))
    return samples


def _save_for_resume(
    sample: Any,
    model: SGLangModel,
    limiter: ToolLimiter,
    tool_stats: Any,
    parts: ResumeParts,
    finished: tuple[str, str] | None,
    keep_transcript: bool,
) -> None:
    """Keep an aborted episode's state in the sample, so slime's recycled sample resumes it."""
    if slime_compat.status_name(sample) != "aborted":  # the fill failed: nothing consistent to keep
        return
    state = resume.snapshot(
        sample,
        model,
        parts.agent.messages,
        limiter,
        tool_stats,
        parts.recorder,
        finished,
        int(sample.metadata.get("masked_null_logprobs", 0)),
        keep_transcript=keep_transcript,
    )
    if state is not None:
        write_keys(sample.metadata, **{resume.STATE_KEY: state})


def _check_fanout_args(args: Any) -> None:
    """slime's partial-rollout and fully-async loops read ``status`` off each group member, which a
    fan-out list does not have: an aborted episode would be trained instead of requeued."""
    if getattr(args, "partial_rollout", False):
        raise ConfigError("fanout.enabled does not work with slime's --partial-rollout")
    if "fully_async" in str(getattr(args, "rollout_function_path", "") or ""):
        raise ConfigError("fanout.enabled does not work with slime's fully-async rollout")


def _fill_dead(
    args: Any,
    sample: Any,
    config: RolloutConfig,
    reason: str,
    evaluation: bool,
    want_top_p: bool,
    abort_detection: str,
) -> None:
    """The last line of defence: a valid, removed sample carrying the reason filling it failed."""
    _clear_attempt_fields(sample)
    _start_response(sample, [0], want_top_p)
    _append_inert_token(args, sample, None)
    _fill_missing_routed_experts(args, sample)
    metadata = dict(getattr(sample, "metadata", None) or {})
    write_keys(metadata, infra_error=reason, evaluation=evaluation, abort_detection=abort_detection)
    sample.metadata = metadata
    _remove(args, sample, config, evaluation)
