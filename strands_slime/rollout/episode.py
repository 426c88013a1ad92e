"""slime's custom generate function: one Strands agent episode per sample, token-in/token-out.

``--custom-generate-function-path strands_slime.generate`` (or ``strands_slime.rollout.episode.generate``).
:func:`generate` builds one :class:`Episode` per sample; the episode owns everything that lives as
long as it does and its whole life, here or in an executor worker, which runs the very same
:meth:`Episode.run`. Every returned sample satisfies slime's invariants and no exception escapes but a
configuration error: an infrastructure failure yields a sample removed from training
(``remove_sample=True``, reward preset) with the reason in ``metadata["infra_error"]``. What the
episode owns and how it fills the sample: docs/rollout.md, "generate".
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
import random
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from strands import Agent
from strands.agent.conversation_manager import (
    ConversationManager,
    NullConversationManager,
    SlidingWindowConversationManager,
    SummarizingConversationManager,
)
from strands.types.exceptions import MaxTokensReachedException

from strands_slime.aborts import AbortedError
from strands_slime.config import ConfigError, RolloutConfig, get_rollout_config, import_function
from strands_slime.episode_metadata import EpisodeMetadata, write_keys
from strands_slime.errors import EpisodeEnded, GenerationAborted, find_episode_end
from strands_slime.provider.chat_families import UnsupportedChatTemplate
from strands_slime.provider.client_errors import SGLangClientError
from strands_slime.provider.limits import ToolLimiter
from strands_slime.provider.model import SGLangModel
from strands_slime.provider.recorder import MAIN, Lane, Origin, Recorder
from strands_slime.provider.trajectory import TokenTrajectory
from strands_slime.rollout import pacing, resume, slime_compat
from strands_slime.rollout.executor import WorkerDied, get_executor, running_executor
from strands_slime.rollout.fanout import GROUP_NORMALIZED_ESTIMATORS
from strands_slime.rollout.gc_policy import GC_THRESHOLDS, gc_policy, tune_gc_once
from strands_slime.rollout.process_settings import pace, rollout_settings
from strands_slime.rollout.sample_fill import (
    RESUME_FIELDS,
    SAMPLE_RESULT_FIELDS,
    append_inert_token,
    check_replay_meta,
    decode_response,
    fill_dead,
    fill_missing_routed_experts,
    prepare_resume,
    remove,
    replay_trajectory,
    reset_attempt,
    start_response,
    wants_top_p,
)
from strands_slime.rollout.startup import chat_template, get_client, get_tokenizer, warm_up
from strands_slime.rollout.subagents import subagent_tools
from strands_slime.runtime import get_runtime

__all__ = [
    "GC_THRESHOLDS",
    "RESUME_FIELDS",
    "SAMPLE_RESULT_FIELDS",
    "STICKY_ROUTER_POLICIES",
    "Episode",
    "EpisodeOutcome",
    "Status",
    "generate",
    "get_client",
    "get_tokenizer",
    "prepare_resume",
    "reset_attempt",
    "tune_gc_once",
    "warm_up",
]

logger = logging.getLogger(__name__)

STICKY_ROUTER_POLICIES = ("consistent_hashing", "manual")
"""Router policies that pin requests carrying the same ``X-SMG-Routing-Key`` to one engine."""


class Status(str, Enum):
    """How an episode ends, by slime's ``Sample.Status`` names."""

    COMPLETED = "COMPLETED"
    TRUNCATED = "TRUNCATED"
    ABORTED = "ABORTED"
    FAILED = "FAILED"


@dataclass
class EpisodeOutcome:
    """How the episode ended, before it is written into the sample (written by :meth:`Episode._end`)."""

    status: Status = Status.COMPLETED
    finish_reason: str = "stop"
    infra_error: str | None = None
    aborted_by_slime: bool = False


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
    await pacing.turn()
    try:
        config = get_rollout_config(args)
        episode = Episode(args, sample, sampling_params, evaluation, config)
        if config.executor.workers is not None:
            return await episode.run_in_workers()
        return await episode.run()
    except ConfigError as exc:
        if get_runtime().first_time(f"strands_slime rollout configuration error, stopping: {exc}"):
            logger.error("strands_slime rollout configuration error, stopping: %s", exc)
        raise


class Episode:
    """One agent episode for one slime sample, and everything that lives as long as it does."""

    def __init__(
        self,
        args: Any,
        sample: Any,
        sampling_params: Mapping[str, Any],
        evaluation: bool,
        config: RolloutConfig,
    ) -> None:
        self.args = args
        self.sample = sample
        self.sampling_params = sampling_params
        self.evaluation = evaluation
        self.config = config
        self.flag = slime_compat.abort_flag(args)
        """slime's abort flag for this rollout, and where it comes from."""
        self.abort_check = self.flag.check
        """Whether slime aborted this rollout: one callable shared by the rollout's episodes (the abort
        watcher and the executor read each distinct flag once)."""
        self.fans_out = config.fanout.enabled and not evaluation
        """Fan-out applies to training only: slime's eval metrics count every returned sample."""
        self.several_agents = bool(config.agents.subagents or config.agents.tool_factories) and not evaluation
        """Sub-agents train (training only: an evaluation episode runs them but returns its main sample)."""
        self.want_top_p = wants_top_p(args, sampling_params, evaluation)
        self.started = time.perf_counter()
        self.outcome = EpisodeOutcome()
        self.tokenizer: Any = None
        self.model: SGLangModel | None = None
        self.limiter: ToolLimiter | None = None
        self.tool_stats: Any = None
        self.record = Recorder()
        """Every model call of the episode: the trajectories the sample is filled from."""
        self.tool_results: resume.ToolResultRecorder | None = None
        self.first_prompt_ids: list[int] | None = None
        """The prompt of an episode that ended before its first request was rendered (rendered then)."""
        self.agent: Agent | None = None
        self.saved: dict[str, Any] | None = None
        """The state this attempt resumes from (``--partial-rollout``), None for a fresh start."""
        self.kept_metadata: dict[str, Any] | None = None
        """A resumed sample's metadata as it came, given back if the attempt never starts."""
        self.resumed_segments = 0
        """Trajectory segments the sample already held when the attempt started (0: a fresh start)."""
        self.masked_before = 0
        """Null logprobs masked in the part the sample already held."""
        self.finished_before_abort: tuple[str, str] | None = None
        """``(status, finish_reason)`` when the episode had ended by itself before slime's abort was seen."""

    # ------------------------------------------------------------------ life, in this process

    async def run(self) -> Any:
        """The whole episode in this process (slime's, or an executor worker's): returns the sample, or
        with fan-out the list of its segments' samples (``sample`` first)."""
        with gc_policy().episode():
            self._begin()
            await self._play_guarded()
            # episodes end together (replies that arrived together, an abort cancelling dozens):
            # filling their samples and saving their state go a few per loop iteration
            await pacing.turn()
            self._see_late_abort()
            if (
                self.kept_metadata is not None
                and self.model is None
                and self.outcome.status is Status.ABORTED
            ):
                return self._give_back_resumed()  # aborted again before the resumed episode started
            samples = self._fill_all()
            await self._score_agents(samples)
            self._save_for_resume()
            return self._fan_out(samples)

    def _begin(self) -> None:
        """Resume the sample's saved episode, or clear whatever an earlier attempt left on it."""
        self.saved = resume.saved_state(self.args, self.sample, self.evaluation)
        if self.saved is None:
            reset_attempt(self.sample)
        else:
            self.kept_metadata = dict(self.sample.metadata)
            prepare_resume(self.args, self.sample)
        if self.fans_out:
            _check_fanout_args(self.args, evaluation=self.evaluation)
        if self.several_agents:
            _check_fanout_args(self.args, "agents.subagents / agents.tool_factories", self.evaluation)

    async def _play_guarded(self) -> None:
        """:meth:`_play` after the loop's one-time start-up; any failure becomes the outcome."""
        try:
            rollout_settings(gc_tuning=self.config.gc_tuning)  # the tracer guard and the GC policy
            self.tokenizer = await warm_up(self.args, self.config, self.abort_check)
            await pacing.turn()  # hundreds of episodes start at once: a few per loop iteration
            if self.slime_aborted():
                self._end(Status.ABORTED, "abort")
            else:
                with self.record.activate():  # models built in the episode's tools join its record
                    await self._play()
        except (asyncio.CancelledError, ConfigError):
            raise
        except UnsupportedChatTemplate as exc:
            raise ConfigError(str(exc)) from exc
        except AbortedError:  # slime aborted during the start-up
            self._end(Status.ABORTED, "abort")
        except Exception as exc:
            logger.exception("strands_slime generate failed before the episode started")
            self._end(Status.FAILED, "error", _describe(exc))

    async def _play(self) -> None:
        """Build the agent (from the saved state when resuming) and run it to its end."""
        system, history, user_text = _prompt_parts(self.sample.prompt)
        self.model = model = self._build_model()
        _refuse_templated_prompt(self.sample.prompt, model.templater)
        config = self.config
        self.limiter = ToolLimiter(
            config.max_tool_iters, config.max_tool_calls, max_model_calls=config.max_model_calls
        )
        tool_abort_check = self.abort_check
        if resume.enabled(self.args, self.evaluation):
            self.tool_results = resume.ToolResultRecorder(
                self.abort_check, (self.saved or {}).get("tool_results")
            )
            tool_abort_check = self.tool_results.tool_abort_check
        tools, self.tool_stats = await _build_tools(config, tool_abort_check)
        self.record.model_defaults = self._sub_model_defaults()
        for path in config.agents.tool_factories:  # the user's sub-agents, Swarms, Graphs: models join
            made = import_function(path, "agents.tool_factories")(self)
            tools = [*tools, *(await made if inspect.isawaitable(made) else made)]
        if config.agents.subagents:
            python = tools[0] if "execute_python_code" in config.tools else None
            if python is None and any(agent.tools for agent in config.agents.subagents):
                needed = config.model_copy(update={"tools": ["execute_python_code"]})
                (python,), self.tool_stats = await _build_tools(needed, tool_abort_check)
            tools = [*tools, *subagent_tools(self, python)]
        messages = self._restore(history) if self.saved is not None else history
        self.agent = Agent(
            model=model,
            tools=tools,
            system_prompt=system if system is not None else config.system_prompt,
            messages=messages,
            callback_handler=None,
            conversation_manager=_conversation_manager(config, self.fans_out, pinned=len(history) + 1),
            retry_strategy=None,
            hooks=[self.limiter] if self.tool_results is None else [self.limiter, self.tool_results],
            plugins=[model.plugin()],
        )
        finished = self.saved.get("finished") if self.saved is not None else None
        if finished:  # the episode had ended before the abort was seen: nothing to run
            self._end(Status(finished[0]), str(finished[1]))
            return
        try:
            # resumed: the saved history already ends with the next step (a model call or a tool round)
            await self.agent.invoke_async(user_text if self.saved is None else None, invocation_state={})
        except MaxTokensReachedException:
            self._end(Status.TRUNCATED, "length")
        except Exception as exc:  # every failure becomes a well-formed sample
            await self._ended_by(exc, user_text)
        else:
            self._end(Status.COMPLETED, model.stats.last_finish_reason or "stop")
        for lane in self.record.lanes:
            lane.settle()  # a cut call the episode never got to goes back into the trajectory
            if (
                lane is not model.lane
                and lane.cut_call is not None
                and self.outcome.status is not Status.ABORTED
            ):
                self._end(Status.ABORTED, "abort")  # the server aborted a sub-agent's call: the episode's

    def _build_model(self) -> SGLangModel:
        args, config = self.args, self.config
        response_budget, context_limit = _budgets(args, config, self.sampling_params, self.evaluation)
        return SGLangModel(
            self.tokenizer,
            config.tool_parser,
            get_client(args, config),
            recorder=self.record,
            name=MAIN,
            abort_check=self.sub_agent_abort_check if self.several_agents else self.abort_check,
            routing_key=_routing_key(args, self.sample, config),
            return_routed_experts=bool(getattr(args, "use_rollout_routing_replay", False)),
            request_trace=slime_compat.request_trace(self.sample),
            new_segment_on_context_change=self.fans_out,
            persist_tokens=False,  # resumption keeps the state in the sample (rollout.resume)
            pace=pace,  # rollout.process_settings: the same callback a hand-driven agent gets
            sampling_params=dict(self.sampling_params),
            chat_family=config.chat_family,
            enable_thinking=config.enable_thinking,
            chat_template=chat_template(config),
            max_response_tokens=response_budget,
            context_window_limit=context_limit,
            min_reply_tokens=config.min_reply_tokens,
        )

    def _sub_model_defaults(self) -> dict[str, Any]:
        """What every other model of the episode gets unless it sets it: the episode's abort check,
        budget, sampling parameters and chat settings; a new context segment whenever its agent's
        history restarts (an agent-as-tool starts each call from an empty history)."""
        args, config = self.args, self.config
        response_budget, context_limit = _budgets(args, config, self.sampling_params, self.evaluation)
        return {
            "abort_check": self.abort_check,
            "return_routed_experts": bool(getattr(args, "use_rollout_routing_replay", False)),
            "new_segment_on_context_change": True,
            "persist_tokens": False,
            "pace": pace,
            "sampling_params": dict(self.sampling_params),
            "chat_family": config.chat_family,
            "enable_thinking": config.enable_thinking,
            "chat_template": chat_template(config),
            "max_response_tokens": response_budget,
            "context_window_limit": context_limit,
            "min_reply_tokens": config.min_reply_tokens,
        }

    def new_model(self, name: str, base_url: str | None = None, **settings: Any) -> SGLangModel:
        """A model for another agent of this episode (for ``agents.tool_factories``): the episode's
        tokenizer, tool parser and client (or a client of ``base_url``: a frozen model), in its record
        under ``name`` with its model defaults; ``settings`` override them."""
        return SGLangModel(
            self.tokenizer,
            self.config.tool_parser,
            get_client(self.args, self.config, base_url),
            recorder=self.record,
            name=name,
            **settings,
        )

    def sub_agent_abort_check(self) -> bool:
        """slime's flag, or a sub-agent's call the server aborted: either stops every agent of the episode
        (the main agent would otherwise go on after its tool reported the abort as an error)."""
        return bool(self.abort_check()) or any(lane.cut_call is not None for lane in self.record.lanes)

    async def _ended_by(self, exc: Exception, user_text: str) -> None:
        """The outcome of an episode the agent loop left with ``exc``."""
        model = self.model
        assert model is not None
        ended = find_episode_end(exc)
        if isinstance(ended, GenerationAborted):
            # slime's own generate returns ABORTED for any server-side abort (its abort, a weight
            # update, an operator's /abort_request): fully-async rollouts requeue such samples.
            self._end(Status.ABORTED, "abort")
            if self.tool_results is not None and self._can_keep_cut_call():
                model.lane.keep_cut_call()  # resumed from there, as slime's generate does
        elif isinstance(ended, EpisodeEnded):
            self._end(Status.TRUNCATED, ended.reason)
        else:
            self._end(Status.FAILED, "error", _describe(exc))
            if isinstance(_root(exc), SGLangClientError):  # the server's fault: the cause says it all
                logger.warning("episode failed: %s", self.outcome.infra_error)
            else:  # our bug or the agent's: keep the traceback
                logger.warning("episode failed: %s", self.outcome.infra_error, exc_info=exc)
        if model.lane.first_prompt_ids is None:  # ended before the first request was rendered
            await self._render_first_prompt(user_text)

    def slime_aborted(self) -> bool:
        """Whether slime aborted this rollout: the one place that decides it (its flag is up)."""
        return bool(self.abort_check())

    def _end(self, status: Status, finish_reason: str, infra_error: str | None = None) -> None:
        """Write the outcome: the one place it is written. An abort is slime's when its flag is up (else
        the server's: a weight update, an operator); an episode that used the sandbox when it failed
        carries that as its infrastructure error."""
        by_slime = status is Status.ABORTED and self.slime_aborted()
        failures = getattr(self.tool_stats, "infra_failures", 0)
        if infra_error is None and failures and not by_slime:
            infra_error = f"sandbox failed {failures} time(s)"
        self.outcome = EpisodeOutcome(status, finish_reason, infra_error, by_slime)

    def _see_late_abort(self) -> None:
        """An episode that ends while slime's flag is set is ABORTED by slime, whatever ended it; one
        that had finished by itself is only reported as finished when it resumes."""
        if self.slime_aborted() and not self.outcome.aborted_by_slime:
            if self.outcome.status.value in resume.FINISHED_STATUSES:
                self.finished_before_abort = (self.outcome.status.value, self.outcome.finish_reason)
            self._end(Status.ABORTED, "abort")

    def _give_back_resumed(self) -> Any:
        """A resumed episode aborted again before it went on (in this process or before a worker took
        it): the sample still holds its saved part and goes back to slime as it came, ABORTED again."""
        if self.kept_metadata is not None:
            self.sample.metadata = self.kept_metadata
        write_keys(self.sample.metadata, abort_source="slime")
        self.sample.status = slime_compat.status(self.sample, "ABORTED")
        return self.sample

    # ------------------------------------------------------------------ life, in a worker process

    async def run_in_workers(self) -> Any:
        """The episode in a worker process of the episode executor, its result written onto ``sample``.

        Raises :class:`ConfigError` as :meth:`run` does; a worker that dies mid-episode gives a FAILED,
        removed sample whose ``metadata.infra_error`` names the worker and how it died."""
        args, config, sample = self.args, self.config, self.sample
        with gc_policy().episode():
            if config.gc_tuning:
                tune_gc_once()  # slime's process still holds every sample in flight
            resuming = resume.saved_state(args, sample, self.evaluation) is not None
            if not resuming:
                reset_attempt(sample)  # a resumed one is readied in the worker, as in-process
            try:
                executor = running_executor(args, config) or await get_executor(
                    args, config, self.abort_check
                )
                segments = await executor.run(self, RESUME_FIELDS if resuming else ())
                result = segments if self.returns_list(len(segments)) else sample
            except AbortedError:  # slime aborted while the workers started or were replaced
                if resuming:  # the episode never went on: the sample keeps its saved part, as in-process
                    return self._give_back_resumed()
                self._end(Status.ABORTED, "abort")
                self._fill(sample, None)
                result = [sample] if self.returns_list(1) else sample
            except WorkerDied as exc:
                logger.warning("episode failed: %s", exc)
                fill_dead(args, sample, config, f"WorkerDied: {exc}", self.evaluation, self.want_top_p)
                result = [sample] if self.returns_list(1) else sample
            seconds = round(time.perf_counter() - self.started, 6)  # slime's view: shipping included
            for item in result if isinstance(result, list) else [result]:
                # the worker watched its own copy of the flag; what detects aborts is slime's side's flag
                write_keys(item.metadata, generate_seconds=seconds, abort_detection=self.flag.source)
            return result

    # ------------------------------------------------------------------ the sample

    def trained_segments(self) -> list[tuple[Lane | None, int, TokenTrajectory | None, Origin | None]]:
        """``(lane, segment number, trajectory, origin)`` of every sample the episode returns, in the
        documented order: the main agent's segments oldest first, then every other trained agent's, in
        the order their models joined the episode (each agent's oldest first). An agent trains when it
        samples from the policy's server (the main model's base URL), ``agents.train`` matches its name
        and ``agents.frozen`` does not; an agent that sampled nothing has no sample. Evaluation returns
        the main agent's alone."""
        model = self.model
        if model is None:
            return [(None, 0, None, None)]
        main = model.lane
        found: list[tuple[Lane | None, int, TokenTrajectory | None, Origin | None]] = [
            (main, i, trajectory, origin)
            for i, (trajectory, origin) in enumerate(
                zip(main.segments(), main.segment_origins(), strict=True)
            )
        ]
        if self.evaluation:
            return found
        agents = self.config.agents
        for lane in self.record.lanes:
            if lane is main or lane.server != main.server or not agents.trains(lane.name):
                continue
            pairs = zip(lane.segments(), lane.segment_origins(), strict=True)
            found += [(lane, i, t, origin) for i, (t, origin) in enumerate(pairs) if t.num_outputs]
        if len(found) > 1:
            self._check_budget(found)
        return found

    def _check_budget(
        self, segments: list[tuple[Lane | None, int, TokenTrajectory | None, Origin | None]]
    ) -> None:
        """Every model the episode's defaults reach samples at most the episode's response budget per
        context segment; a model built with a larger ``max_response_tokens`` of its own would hand slime
        a longer sample than ``--rollout-max-response-len``: that is a configuration error."""
        budget = _budgets(self.args, self.config, self.sampling_params, self.evaluation)[0]
        for lane, number, trajectory, _ in segments:
            if lane is None or lane.name == MAIN:
                continue  # the main model is built with the budget
            if budget and trajectory is not None and trajectory.response_length > budget:
                name = lane.name
                raise ConfigError(
                    f"agent {name!r} segment {number} has a {trajectory.response_length}-token response, over "
                    f"the episode's budget ({budget}, --rollout-max-response-len): build its SGLangModel "
                    "without max_response_tokens (it then gets the episode's) or with at most the budget"
                )

    def _fill_all(self) -> list[Any]:
        """Fill the sample, and a copy of it per further segment (fan-out, other agents)."""
        segments = self.trained_segments()
        if len(segments) > 1 and not self.fans_out and not self.several_agents:
            _check_fanout_args(self.args, "an episode whose tools build trained sub-agents", self.evaluation)
        template = copy.deepcopy(self.sample) if len(segments) > 1 else None
        samples = [self.sample] + [copy.deepcopy(template) for _ in segments[1:]]
        agent_keys = self.several_agents or len({id(lane) for lane, *_ in segments}) > 1
        for current, (lane, number, trajectory, origin) in zip(samples, segments, strict=True):
            try:
                self._fill(current, trajectory)
                if agent_keys:
                    write_keys(
                        current.metadata,
                        agent=lane.name if lane is not None else MAIN,
                        agent_role=lane.role if lane is not None else "main",
                        parent_agent=origin[0] if origin else None,
                        parent_tool_call=origin[1] if origin else None,
                        agent_segment=number,
                        agent_samples=len(segments),
                    )
            except ConfigError:
                raise
            except Exception as exc:  # last line of defence: still a valid, removed sample
                logger.exception("strands_slime could not fill the sample")
                # an episode that already failed keeps its own error: the fill failed because of it
                failed = self.outcome.status == "FAILED" and self.outcome.infra_error
                reason = failed or f"{type(exc).__name__}: {exc}"
                fill_dead(self.args, current, self.config, reason, self.evaluation, self.want_top_p)
                write_keys(current.metadata, abort_detection=self.flag.source)
            write_keys(current.metadata, generate_seconds=round(time.perf_counter() - self.started, 6))
        return samples

    def _fill(self, sample: Any, trajectory: TokenTrajectory | None) -> None:
        """Write ``trajectory`` (one segment of the episode, or None) and the outcome into ``sample``."""
        args = self.args
        masked = 0
        if trajectory is not None and trajectory.num_outputs:
            masked = replay_trajectory(args, sample, trajectory, self.want_top_p, self.resumed_segments)
            if self.resumed_segments:
                masked += self.masked_before
        else:
            start_response(sample, self._placeholder_prompt(), self.want_top_p)
        if not sample.response_length:
            append_inert_token(args, sample, self.tokenizer)
        fill_missing_routed_experts(args, sample)
        decode_response(sample, self.tokenizer)
        sample.status = slime_compat.status(sample, self.outcome.status.value)
        metadata = dict(getattr(sample, "metadata", None) or {})
        metadata.update(self._record(masked).to_metadata())
        sample.metadata = metadata
        sample.non_generation_time = float(getattr(self.tool_stats, "seconds", 0.0))
        if self.outcome.infra_error and self.outcome.status is not Status.ABORTED:
            remove(args, sample, self.config, self.evaluation)

    def _record(self, masked: int) -> EpisodeMetadata:
        """What this attempt records about the episode (see :class:`EpisodeMetadata` for every key)."""
        outcome, model, limiter, tool_stats = self.outcome, self.model, self.limiter, self.tool_stats
        stats = model.stats if model is not None else None
        record = EpisodeMetadata(
            evaluation=self.evaluation,
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
            abort_detection=self.flag.source,
        )
        if outcome.status is Status.ABORTED:
            record.abort_source = "slime" if outcome.aborted_by_slime else "server"
        if outcome.status is Status.TRUNCATED:
            record.truncation = outcome.finish_reason
        if self.config.keep_transcript and model is not None:
            record.transcript = model.transcript()
        return record

    def _placeholder_prompt(self) -> list[int]:
        """Prompt ids for a sample that produced no output: the episode's exact first prompt when it got
        that far, else the user message alone."""
        model = self.model
        first = model.lane.first_prompt_ids if model is not None else None
        if first or self.first_prompt_ids:
            return list(first or self.first_prompt_ids or ())
        if model is None or self.tokenizer is None:
            return [0]
        try:
            _, _, user = _prompt_parts(self.sample.prompt)
        except ConfigError:
            return [0]
        text = model.templater.initial_prompt_text([{"role": "user", "content": user}], None, None)
        return model.templater.encode(text) or [0]

    async def _render_first_prompt(self, user_text: str) -> None:
        """Give :attr:`first_prompt_ids` the prompt the episode would have sent (never raises)."""
        model, agent = self.model, self.agent
        assert model is not None and agent is not None
        messages = [*agent.messages]
        if not messages or messages[-1].get("role") != "user":
            messages.append({"role": "user", "content": [{"text": user_text}]})
        try:
            self.first_prompt_ids = await model.initial_prompt_ids(
                messages, agent.tool_registry.get_all_tool_specs(), agent.system_prompt
            )
        except Exception as exc:
            logger.debug("could not render the prompt of a failed episode: %s", exc)

    def returns_list(self, count: int) -> bool:
        """Whether generate returns ``list[Sample]``: always with fan-out or configured sub-agents (slime
        flattens one shape), and for any episode that ends with more than one sample."""
        return self.fans_out or self.several_agents or count > 1

    def _fan_out(self, samples: list[Any]) -> Any:
        """The sample, or every segment's sample (fan-out, several agents) under one ``rollout_id``."""
        if not self.returns_list(len(samples)):
            return self.sample
        sample = self.sample
        rollout_id = sample.index if isinstance(sample.index, int) else random.getrandbits(62)
        for position, current in enumerate(samples):
            current.rollout_id = rollout_id
            if self.fans_out:
                write_keys(current.metadata, fanout_segment=position, fanout_segments=len(samples))
        return samples

    async def _score_agents(self, samples: list[Any]) -> None:
        """Score the samples of agents with their own reward function (``agents.rewards``); slime's
        reward (``--custom-rm-path``) scores the rest, every agent's with the episode's final answer."""
        rewards = self.config.agents.rewards
        if not rewards or self.outcome.status is Status.ABORTED:
            return
        for current in samples:
            name = current.metadata.get("agent")
            path = self.config.agents.reward_path(name) if name and name != MAIN else None
            if path is None or current.remove_sample:
                continue
            current.reward = await import_function(path, "agents.rewards")(self.args, current)
            write_keys(current.metadata, reward_track=name)

    # ------------------------------------------------------------------ resumption (--partial-rollout)

    def _restore(self, history: list[dict[str, Any]]) -> list[Any]:
        """Put the saved episode back into the fresh model, limiter and sandbox statistics; returns the
        messages to start the agent with. A state that does not restore starts the episode over."""
        saved = self.saved
        assert saved is not None and self.model is not None and self.limiter is not None
        try:
            trajectory = TokenTrajectory.from_layout(
                list(self.sample.tokens), list(self.sample.rollout_log_probs), saved["trajectory"]
            )
            if trajectory.response_length != int(saved["response_length"]):
                raise ValueError("the saved layout's prompt does not match the sample's response length")
            self.model.from_state(saved["model"], trajectory)  # a cut call's output is gone on from
            self.limiter.restore_counters(saved["limiter"])
            resume.restore_tool_stats(self.tool_stats, saved.get("tool_stats"))
            messages = resume.saved_messages(saved)
        except (KeyError, TypeError, ValueError) as exc:
            logger.warning(
                "partial rollout: starting the episode over: the saved state does not restore (%s)", exc
            )
            self._start_over()
            return history
        if self.tool_results is not None:
            self.resumed_segments = len(saved["trajectory"]["segments"])
            self.masked_before = int(saved.get("masked_null_logprobs", 0))
        return messages

    def _start_over(self) -> None:
        """Drop a half-restored episode and whatever the sample kept: the attempt runs from scratch."""
        assert self.model is not None and self.limiter is not None
        self.saved = None
        reset_attempt(self.sample)
        self.model.reset()
        self.limiter.reset()
        resume.reset_tool_stats(self.tool_stats)
        if self.tool_results is not None:
            self.tool_results.finished.clear()

    def _can_keep_cut_call(self) -> bool:
        """Whether the output of the call the server aborted can stay in the sample: it has some, and
        what slime replays from it (top-p spans, routed experts) came with it."""
        assert self.model is not None
        meta = self.model.lane.cut_call_meta()
        if meta is None:
            return False
        try:
            check_replay_meta(
                meta, self.want_top_p, bool(getattr(self.args, "use_rollout_routing_replay", False))
            )
        except ConfigError:
            return False
        return True

    def _save_for_resume(self) -> None:
        """Keep an aborted episode's state in the sample, so slime's recycled sample resumes it."""
        if (
            self.tool_results is None
            or self.model is None
            or self.outcome.status is not Status.ABORTED
            or slime_compat.status_name(self.sample) != "aborted"  # the fill failed: nothing to keep
        ):
            return
        state = self._state()
        if state is not None:
            write_keys(self.sample.metadata, **{resume.STATE_KEY: state})

    def _state(self) -> dict[str, Any] | None:
        """The state that lets the aborted episode go on (plain JSON, :mod:`~strands_slime.rollout.resume`),
        or None when there is nothing to keep (no model output yet) or the sample does not hold the
        trajectory."""
        model, recorder, limiter, agent, sample = (
            self.model,
            self.tool_results,
            self.limiter,
            self.agent,
            self.sample,
        )
        assert model is not None and recorder is not None and limiter is not None and agent is not None
        trajectory = model.trajectory
        if not trajectory.num_outputs or model.closed_trajectories:
            return None
        if list(sample.tokens) != trajectory.token_ids.tolist():
            logger.warning("partial rollout: the sample does not hold the episode's trajectory; not saved")
            return None
        kept_messages = resume.resumable_messages(agent.messages, recorder, read=len(model.history.digests))
        if not self.finished_before_abort and not resume.has_next_step(kept_messages):
            return None  # the episode ended some other way (an error) before the abort: start it over
        counters = limiter.counters()
        # calls that returned output; the one the abort cut short is made again on resume
        counters["model_call_count"] = min(
            counters["model_call_count"], trajectory.turn_count + model.stats.rolled_back_turns
        )
        return resume.detached(
            {
                "version": resume.STATE_VERSION,
                "prompt_key": resume.prompt_key(sample.prompt),
                "token_count": len(trajectory),
                "response_length": trajectory.response_length,
                "trajectory": trajectory.layout(),
                "messages": kept_messages,
                "model": model.state(with_transcript=self.config.keep_transcript),
                "limiter": counters,
                "tool_stats": resume.tool_stats_dict(self.tool_stats),
                "tool_results": resume.pending_round_results(kept_messages, recorder),
                "finished": list(self.finished_before_abort) if self.finished_before_abort else None,
                "masked_null_logprobs": int(sample.metadata.get("masked_null_logprobs", 0)),
            }
        )


# ---------------------------------------------------------------------- building an episode


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


def _conversation_manager(config: RolloutConfig, fanout: bool, pinned: int) -> ConversationManager:
    """Append-only history (token-in/token-out needs it), unless fan-out lets the agent compact it;
    the prompt (history and question) stays pinned."""
    if not fanout:
        return NullConversationManager()
    if config.fanout.compaction == "summarize":
        return SummarizingConversationManager(
            summary_ratio=config.fanout.summary_ratio,
            preserve_recent_messages=config.fanout.preserve_recent_messages,
            pin_first=pinned,
        )
    window = config.fanout.window_messages
    return SlidingWindowConversationManager(
        window_size=max(window or 40, pinned + 2), per_turn=window is not None, pin_first=pinned
    )


async def _build_tools(config: RolloutConfig, abort_check: Any) -> tuple[list[Any], Any]:
    if "execute_python_code" not in config.tools:
        return [], None
    from strands_slime.sandbox import ToolStats, create_python_tool, get_shared_sandbox

    sandbox = get_shared_sandbox(config.sandbox)
    await sandbox.start()  # no-op once running; keeps the zygote's start-up out of the episode's tool time
    stats = ToolStats()
    return [create_python_tool(sandbox, stats=stats, abort_check=abort_check)], stats


def _check_fanout_args(args: Any, what: str = "fanout.enabled", evaluation: bool = False) -> None:
    """slime's partial-rollout and fully-async loops read ``status`` off each group member, which a
    list of samples does not have: an aborted episode would be trained instead of requeued. slime's
    default reward post-processing reshapes rewards by ``n_samples_per_prompt``, which several samples
    per episode break (rollout/fanout.py): a training run without a post-processing of its own stops
    at its first episode, before a step is trained on wrong advantages."""
    if getattr(args, "partial_rollout", False):
        raise ConfigError(f"{what} does not work with slime's --partial-rollout")
    if "fully_async" in str(getattr(args, "rollout_function_path", "") or ""):
        raise ConfigError(f"{what} does not work with slime's fully-async rollout")
    group_normalized = getattr(args, "advantage_estimator", "grpo") in GROUP_NORMALIZED_ESTIMATORS
    if (
        not evaluation
        and group_normalized
        and getattr(args, "rewards_normalization", True)
        and hasattr(args, "custom_reward_post_process_path")  # slime's (the offline runner trains nothing)
        and args.custom_reward_post_process_path is None
    ):
        raise ConfigError(
            f"{what} returns several samples per episode, which slime's default reward normalization "
            "miscounts: add --custom-reward-post-process-path "
            "strands_slime.rollout.fanout.normalize_by_group_index to slime's arguments"
        )


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
