"""Rollout configuration: one validated YAML for the agent, tools, limits, sandbox and reward.

Where it comes from, first match wins:
1. ``args.strands_slime`` — a mapping, set by slime's ``--custom-config-path`` from a YAML whose
   top-level key is ``strands_slime`` (slime copies every top-level key onto ``args``);
2. ``args.strands_slime_config`` — a path to such a YAML;
3. the ``STRANDS_SLIME_CONFIG`` environment variable — a path;
4. the defaults below, which reproduce slime's strands example.
A file may hold the settings at its top level or under a ``strands_slime:`` key.
"""

from __future__ import annotations

import difflib
import importlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from strands_slime.provider.limits import DEFAULT_MAX_MODEL_CALLS, MAX_MODEL_CALLS_LIMIT
from strands_slime.ray_actors import RayPlacement
from strands_slime.runtime import get_runtime
from strands_slime.sandbox import SandboxConfig

CONFIG_ENV = "STRANDS_SLIME_CONFIG"
CONFIG_KEY = "strands_slime"

DEFAULT_ACTOR_TIMEOUT_S = 5.0
"""executor.actor_timeout_s: a live actor answers a heartbeat within milliseconds; 5 s of silence is a
hung or unreachable node (Ray itself declares a node dead only after about a minute)."""

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful mathematician who can run Python. To check a computation, call the "
    "execute_python_code tool with a complete program that prints what you need; you will see its "
    "output. Reason step by step, use the tool when exact arithmetic or a search helps, and finish with "
    "a final line of the form 'Answer: \\boxed{ANSWER}'."
)


class ClientConfig(BaseModel):
    """HTTP client settings for SGLang (defaults fit slime's router)."""

    model_config = ConfigDict(extra="forbid")

    timeout_s: float | None = Field(
        None,
        gt=0,
        description="Total time of one attempt on the wire (waiting for a pooled connection never counts); "
        "None: no limit.",
    )
    connect_timeout_s: float = Field(10.0, gt=0, description="TCP connect time (pool waits never count).")
    first_byte_timeout_s: float | None = Field(
        3600.0,
        gt=0,
        description="Silence allowed before the reply starts. A non-streaming /generate sends nothing until "
        "the generation is done, so this bounds one generation: 32k tokens at 10 tok/s under load + queueing. "
        "Not retried. None: wait forever.",
    )
    stall_timeout_s: float | None = Field(
        60.0,
        gt=0,
        description="Gap allowed between bytes once the reply has started (a dead connection); retried. "
        "None: no limit.",
    )
    max_retries: int = Field(60, ge=0, description="Retries for transient faults (5xx, 408/429/503, resets).")
    retry_delay_s: float = Field(
        1.0, ge=0, description="First backoff delay; doubles per retry, with jitter."
    )
    max_retry_delay_s: float = Field(30.0, ge=0, description="Backoff cap.")
    max_connections: int | None = Field(None, ge=1, description="Pool size; default: slime's formula.")


_LINEAR_FIELDS = ("linear_per_iteration", "linear_baseline_iterations", "linear_cap")


class RewardConfig(BaseModel):
    """The ``reward:`` section of the rollout YAML; every field has a working default."""

    model_config = ConfigDict(extra="forbid")

    shaping: Literal["strands_example", "linear", "none"] = Field(
        "none",
        description=(
            "How wrong training answers are shaped; off by default because GRPO's std normalisation "
            "turns the small differences it makes inside an all-wrong group into full-size advantages "
            "(docs/reward.md). strands_example: min(-0.6, incorrect_reward + "
            "(n - 2) / 2 * 0.1) as in slime's strands example; linear: min(linear_cap, "
            "incorrect_reward + linear_per_iteration * (n - linear_baseline_iterations)); none: no "
            "shaping. n counts tool use (see shaping_count). Evaluation samples are never shaped."
        ),
    )
    shaping_count: Literal["tool_iterations", "tool_calls"] = Field(
        "tool_iterations", description="Which metadata counter shaping reads as n."
    )
    linear_per_iteration: float = Field(0.05, description="linear shaping: reward per tool-use unit.")
    linear_baseline_iterations: float = Field(2.0, description="linear shaping: n at which nothing is added.")
    linear_cap: float = Field(-0.6, description="linear shaping: a shaped wrong answer never exceeds this.")
    correct_reward: float = Field(1.0, description="Reward of a correct answer (slime's DAPO uses 1.0).")
    incorrect_reward: float = Field(-1.0, description="Reward of a wrong or missing answer before shaping.")
    output: Literal["auto", "float", "dict"] = Field(
        "auto",
        description=(
            "float: return the reward; dict: return {score, acc, pred, ...} for --reward-key; auto: "
            "dict exactly when slime's --reward-key (--eval-reward-key for evaluation) is set."
        ),
    )
    answer_window: int = Field(300, ge=1, description="Characters at the end of the final text searched.")
    strict_box_window: int = Field(
        100, ge=1, description="Characters at the end of the final text searched for \\boxed{} (strict mode)."
    )
    reject_conflicting_answers: bool = Field(
        True,
        description=(
            "Score as wrong when the 'Answer:' line and the last \\boxed{} give different answers, "
            "so that hedging across both forms is never rewarded."
        ),
    )
    overlong_buffer_tokens: int | None = Field(
        None,
        ge=1,
        description=(
            "DAPO's soft overlong punishment (training only): a response longer than the episode budget "
            "(slime's --rollout-max-response-len) minus this many tokens loses overlong_penalty * "
            "(excess / buffer), the whole overlong_penalty at the budget, so the policy learns to finish "
            "before it is cut off instead of from a cut-off -1 alone. Counted on sample.response_length "
            "(tool output included, as the budget is). None (default): off; configs/strands_math.yaml, "
            "the training recipe, sets 4096 for its 32,768-token budget."
        ),
    )
    overlong_penalty: float = Field(
        1.0, ge=0, description="What a response that reaches the episode budget loses (DAPO: 1.0)."
    )
    math_verify: bool = Field(
        True,
        description="Use math-verify (when installed) for answers that string/number checks can't decide.",
    )
    math_verify_timeout_s: float = Field(
        2.0,
        gt=0,
        le=600,
        description="Hard deadline for one math-verify check; the worker is killed past it.",
    )
    math_verify_workers: int = Field(
        1, ge=1, le=64, description="math-verify worker processes (started lazily, kept warm)."
    )

    @model_validator(mode="after")
    def _linear_fields_need_linear_shaping(self) -> RewardConfig:
        stray = [name for name in _LINEAR_FIELDS if name in self.model_fields_set]
        if stray and self.shaping != "linear":
            raise ValueError(
                f"{', '.join(stray)} only apply with shaping: linear (shaping is {self.shaping!r})"
            )
        return self

    def budget_problem(self, max_response_len: int) -> str | None:
        """One line when the overlong punishment would hit (nearly) every response of a
        ``max_response_len``-token budget (slime's ``--rollout-max-response-len``), else None.

        Punishment starts ``overlong_buffer_tokens`` before the budget: a buffer as long as the budget
        punishes every response, even a ten-token right answer, and one over half of it most of them.
        """
        buffer = self.overlong_buffer_tokens
        if buffer is None or self.overlong_penalty == 0 or buffer * 2 <= max_response_len:
            return None
        return (
            f"reward.overlong_buffer_tokens ({buffer}) must be at most half of the episode budget "
            f"--rollout-max-response-len ({max_response_len}): punishment starts {buffer} tokens before "
            f"the budget, so {'every' if buffer >= max_response_len else 'nearly every'} response would "
            "lose reward for its length; lower it or set it to null"
        )


class FanoutConfig(BaseModel):
    """One training sample per context segment when the agent compacts its context (off by default)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        False,
        description="Return list[Sample] from generate: one prefix-chained sample per context segment, "
        "sharing rollout_id. Needs --custom-reward-post-process-path "
        "strands_slime.rollout.fanout.normalize_by_group_index; not with --partial-rollout or fully-async rollout. "
        "Training only: evaluation keeps one sample per episode.",
    )
    compaction: Literal["window", "summarize"] = Field(
        "window",
        description="How the agent compacts its context: window = Strands' SlidingWindowConversationManager "
        "(drops the oldest messages); summarize = SummarizingConversationManager (the model summarizes the "
        "oldest messages when the context overflows; the summary call is served outside the episode's "
        "trajectory, never trained, and blocks the rollout's event loop while it runs, as Strands makes "
        "it synchronously).",
    )
    window_messages: int | None = Field(
        None,
        ge=2,
        description="compaction: window only. Compact the agent's context to this many messages before every "
        "model call (the prompt stays pinned); None: compact only when the context window overflows.",
    )
    summary_ratio: float = Field(
        0.3,
        ge=0.1,
        le=0.8,
        description="compaction: summarize only. Share of the messages summarized at once.",
    )
    preserve_recent_messages: int = Field(
        4, ge=1, description="compaction: summarize only. Recent messages never summarized."
    )

    @model_validator(mode="after")
    def _options_of_the_compaction(self) -> FanoutConfig:
        if self.compaction == "summarize" and self.window_messages is not None:
            raise ValueError("window_messages applies to compaction: window, not summarize")
        stray = {"summary_ratio", "preserve_recent_messages"} & self.model_fields_set
        if self.compaction == "window" and stray:
            raise ValueError(f"{', '.join(sorted(stray))} apply to compaction: summarize, not window")
        return self


def import_function(dotted: str, where: str) -> Any:
    """The function a config names by dotted path (``pkg.module.function``: user code).

    Raises:
        ConfigError: (a ValueError, so also inside a validator) the module does not import, or the
            name is no function there; the message starts with ``where``.
    """
    module_name, _, attribute = dotted.rpartition(".")
    try:
        module = importlib.import_module(module_name) if module_name else None
    except ImportError as exc:
        raise ConfigError(f"{where}: cannot import {module_name!r} ({exc})") from exc
    function = getattr(module, attribute, None) if module is not None else None
    if not callable(function):
        raise ConfigError(f"{where}: {dotted!r} is not a function")
    return function


AGENT_NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
"""What Strands accepts as a tool name (a sub-agent is a tool of its parent under its own name)."""


class SubAgentConfig(BaseModel):
    """A sub-agent the episode builds and hands its parent as a tool (Strands' ``Agent.as_tool``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        ...,
        pattern=AGENT_NAME_PATTERN,
        description="Its name: the tool name its parent calls, and its lane in the episode's record.",
    )
    description: str = Field(..., min_length=1, description="What its parent reads about the tool.")
    system_prompt: str = Field(..., min_length=1, description="The sub-agent's system prompt.")
    parent: str = Field(
        "main", description="The agent whose tool it is: main, or another sub-agent (nesting)."
    )
    tools: list[Literal["execute_python_code"]] = Field(
        default_factory=list, description="Its own tools besides its sub-agents (the episode's sandbox)."
    )
    base_url: str | None = Field(
        None,
        description="Another SGLang server (a frozen model): never trained. None: the policy's server.",
    )
    preserve_context: bool = Field(
        False,
        description="Keep its conversation across calls (one growing context); false: every call starts "
        "from an empty history, a new context segment and sample.",
    )


class AgentsConfig(BaseModel):
    """Several agents in one episode: sub-agents built from this config, and which agents train."""

    model_config = ConfigDict(extra="forbid")

    subagents: list[SubAgentConfig] = Field(
        default_factory=list,
        description="Sub-agents handed to their parent as tools. Any: generate returns list[Sample] (one "
        "per agent segment, sharing rollout_id); needs --custom-reward-post-process-path "
        "strands_slime.rollout.fanout.normalize_by_group_index; not with --partial-rollout or fully-async.",
    )
    tool_factories: list[str] = Field(
        default_factory=list,
        description="Dotted paths of functions f(episode) -> list of Strands tools (sync or async), called "
        "once per episode with the episode running: tools that wrap sub-agents, agents as tools, a Swarm or "
        "Graph; episode.new_model(name) builds a model of the episode for them.",
    )
    train: list[str] = Field(
        default_factory=lambda: ["*"],
        min_length=1,
        description="fnmatch patterns of the agent names trained, among the agents on the policy's server "
        "(a model on another base_url never trains); must match main.",
    )
    frozen: list[str] = Field(
        default_factory=list,
        description="fnmatch patterns of agents served by the policy but never trained; must not match main.",
    )
    rewards: dict[str, str] = Field(
        default_factory=dict,
        description="agent name pattern -> dotted path of an async reward function f(args, sample) (slime's "
        "custom RM signature), scoring that agent's samples; other agents get the episode's reward.",
    )

    @model_validator(mode="after")
    def _a_tree_of_agents(self) -> AgentsConfig:
        import fnmatch

        names = [agent.name for agent in self.subagents]
        if "main" in names:
            raise ValueError("subagents: 'main' is the episode's own agent; pick another name")
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"subagents: duplicate names {', '.join(duplicates)}")
        parents = {agent.name: agent.parent for agent in self.subagents}
        for agent in self.subagents:
            if agent.parent != "main" and agent.parent not in parents:
                raise ValueError(
                    f"subagents: {agent.name}'s parent {agent.parent!r} is neither main nor a sub-agent"
                )
            seen, current = {agent.name}, agent.parent
            while current != "main":
                if current in seen:
                    raise ValueError(f"subagents: {agent.name} is its own ancestor (a cycle of parents)")
                seen.add(current)
                current = parents[current]
        if not any(fnmatch.fnmatchcase("main", pattern) for pattern in self.train):
            raise ValueError("train: the patterns must match main (the episode's own agent always trains)")
        if any(fnmatch.fnmatchcase("main", pattern) for pattern in self.frozen):
            raise ValueError(
                "frozen: the patterns must not match main (the episode's own agent always trains)"
            )
        for pattern, path in self.rewards.items():
            if fnmatch.fnmatchcase("main", pattern):
                raise ValueError(
                    f"rewards: {pattern!r} matches main, which the episode's reward (--custom-rm-path) scores"
                )
            import_function(path, "rewards")
        for path in self.tool_factories:
            import_function(path, "tool_factories")
        return self

    def trains(self, name: str) -> bool:
        """Whether the agent ``name`` (on the policy's server) trains."""
        import fnmatch

        return any(fnmatch.fnmatchcase(name, p) for p in self.train) and not any(
            fnmatch.fnmatchcase(name, p) for p in self.frozen
        )

    def reward_path(self, name: str) -> str | None:
        """The dotted path of the reward function of agent ``name``, or None (the episode's reward)."""
        import fnmatch

        return next(
            (path for pattern, path in self.rewards.items() if fnmatch.fnmatchcase(name, pattern)), None
        )


class ExecutorConfig(BaseModel):
    """Where episodes run: in slime's rollout process (default), in N local worker processes, or in N
    Ray actors anywhere on slime's cluster (``backend: ray``)."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["local", "ray"] = Field(
        "local",
        description="local: worker processes of slime's rollout process, on its node; ray: Ray actors "
        "placed on the cluster's CPU resources (slime's cluster; needs workers).",
    )
    workers: int | None = Field(
        None,
        ge=1,
        description="Workers running episodes, one event loop and one sandbox each; None: every "
        "episode runs on slime's own event loop (the default).",
    )
    oversubscribe: bool = Field(
        False,
        description="backend local: allow more workers than the CPU cores this process may use (refused "
        "otherwise).",
    )
    start_timeout_s: float = Field(
        300.0,
        gt=0,
        description="Deadline for a worker's start-up (placement on the cluster, imports, tokenizer, sandbox).",
    )
    resources: dict[str, float] | None = Field(
        None,
        description="backend ray: Ray resources of each episode actor (CPU, memory in bytes, or a custom "
        "resource that only some nodes have, e.g. rollout_cpu); default {CPU: 1}.",
    )
    strategy: Literal["SPREAD", "DEFAULT"] = Field(
        "SPREAD",
        description="backend ray: Ray's scheduling strategy of the actors (SPREAD: over every node with room).",
    )
    address: str | None = Field(
        None,
        description="backend ray: the cluster to connect to when this process is not connected yet "
        "(slime's rollout actor is; e.g. auto or ray://host:10001 elsewhere).",
    )
    placement: RayPlacement | None = Field(
        None,
        description="backend ray: which nodes the episode actors may go to (node_labels, avoid_head); "
        "checked per node at start-up, the sandbox's actors counted.",
    )
    actor_timeout_s: float | None = Field(
        None,
        gt=0,
        description="backend ray: an actor that answers no heartbeat and no abort for this long fails its "
        "episodes and is replaced (a hung or partitioned node); default 5.",
    )
    log_to_driver: bool | None = Field(
        None,
        description="backend ray with address: show the actors' stdout/stderr in this process (default "
        "true; inside slime the driver's own setting applies).",
    )

    @field_validator("resources")
    @classmethod
    def _valid_resources(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return None
        for name, amount in value.items():
            if not name or name != name.strip():
                raise ValueError(f"resources: {name!r} is not a resource name")
            if name == "GPU":
                raise ValueError("resources: episode actors use no GPU (GPU is refused)")
            if not 0 <= amount < float("inf"):
                raise ValueError(f"resources: {name} must be a finite amount >= 0, got {amount}")
        if not any(value.values()):
            raise ValueError("resources: at least one resource must be > 0 (else every actor lands anywhere)")
        return value

    @model_validator(mode="after")
    def _settings_of_the_backend(self) -> ExecutorConfig:
        ray_only = [
            name
            for name in ("resources", "address", "placement", "actor_timeout_s", "log_to_driver")
            if getattr(self, name) is not None
        ]
        ray_only += ["strategy"] if "strategy" in self.model_fields_set else []
        if self.backend == "local":
            if ray_only:
                raise ValueError(f"{', '.join(ray_only)} only apply with backend: ray")
        else:
            if self.workers is None:
                raise ValueError("backend: ray needs workers (the number of episode actors)")
            if self.oversubscribe:
                raise ValueError("oversubscribe only applies with backend: local")
            if self.resources is None:
                self.resources = {"CPU": 1.0}
            if self.placement is None:
                self.placement = RayPlacement()
            if self.actor_timeout_s is None:
                self.actor_timeout_s = DEFAULT_ACTOR_TIMEOUT_S
            if self.log_to_driver is None:
                self.log_to_driver = True
        return self


class RolloutConfig(BaseModel):
    """Everything ``generate`` needs beyond slime's own arguments."""

    model_config = ConfigDict(extra="forbid")

    system_prompt: str = Field(DEFAULT_SYSTEM_PROMPT, description="System prompt of every episode.")
    tools: list[Literal["execute_python_code"]] = Field(
        default_factory=lambda: ["execute_python_code"], description="Tools the agent may call."
    )
    max_tool_iters: int | None = Field(5, ge=0, description="Tool rounds per episode (slime example: 5).")
    max_tool_calls: int | None = Field(None, ge=0, description="Tool calls per episode in all.")
    max_model_calls: int = Field(
        DEFAULT_MAX_MODEL_CALLS,
        ge=1,
        le=MAX_MODEL_CALLS_LIMIT,
        description="Hard cap on model calls per episode (Strands' recursion fails at a few hundred).",
    )
    tool_parser: str | None = Field(
        None,
        description="Tool-call format (hermes, qwen3_coder, glm47, kimi_k2, ...); None: the chat family's.",
    )
    chat_family: str | None = Field(
        None,
        description="Chat format (qwen3, qwen35, glm47, kimi_k2, minimax_m2, deepseek_v32, deepseek_v4); None: detected "
        "from the tokenizer, and an unknown template is refused.",
    )
    enable_thinking: bool | None = Field(
        None,
        description="Passed to the chat template when set (Qwen3 hybrid thinking); None: template default.",
    )
    chat_template_path: str | None = Field(
        None, description="A Jinja chat template file replacing the tokenizer's."
    )
    tokenizer_path: str | None = Field(None, description="Tokenizer to use instead of args.hf_checkpoint.")
    routing: Literal["auto", "always", "never"] = Field(
        "auto",
        description="Send X-SMG-Routing-Key = sample.session_id (all turns of an episode on one engine's "
        "prefix cache): auto = when slime's --router-policy is consistent_hashing or manual.",
    )
    max_context_len: int | None = Field(
        None, gt=0, description="Context limit; default: args.rollout_max_context_len / the server's."
    )
    min_reply_tokens: int | None = Field(
        None,
        ge=1,
        description="Room a reply needs: a call whose prompt leaves less of the context raises the context "
        "overflow (so a compacting agent compacts) instead of sampling a reply cut to a few tokens. None: "
        "1024 or a quarter of the window with fanout (its conversation manager compacts), 1 without.",
    )
    gc_tuning: bool = Field(
        True,
        description="Once per rollout process: gc.freeze() what is alive, keep young collections small "
        "and run full collections when the last live episode ends (then freeze what survived). Without "
        "it garbage collection takes a quarter of the CPU at 1024 episodes in flight, and a full "
        "collection holds the loop for hundreds of milliseconds.",
    )
    keep_transcript: bool = Field(
        False, description="Store the parsed conversation in sample.metadata['transcript'] (drift audits)."
    )
    infra_failure_reward: float = Field(
        0.0,
        description="Reward preset on samples lost to infrastructure failures (they are removed from training).",
    )
    fanout: FanoutConfig = Field(default_factory=FanoutConfig)
    agents: AgentsConfig = Field(default_factory=AgentsConfig)
    client: ClientConfig = Field(default_factory=ClientConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)

    @field_validator("tool_parser")
    @classmethod
    def _known_parser(cls, value: str | None) -> str | None:
        from strands_slime.provider.tool_parsers import available_tool_parsers

        if value is None:
            return None
        if value.lower() not in available_tool_parsers():
            raise ValueError(f"unknown tool parser {value!r}; known: {', '.join(available_tool_parsers())}")
        return value.lower()

    @field_validator("chat_family")
    @classmethod
    def _known_family(cls, value: str | None) -> str | None:
        from strands_slime.provider.chat_families import get_chat_family

        return None if value is None else get_chat_family(value).name


class ConfigError(ValueError):
    """The rollout configuration is missing or invalid; the message says where and what."""


def _load_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"rollout config {file} does not exist")
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"rollout config {file} is not valid YAML: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ConfigError(f"rollout config {file} must be a mapping, got {type(data).__name__}")
    return dict(data)


def parse_config(data: Mapping[str, Any] | None, *, source: str = "<dict>") -> RolloutConfig:
    """Validate a mapping (top-level settings or a ``strands_slime:`` section) into a RolloutConfig.

    Args:
        data: the settings; None or empty gives the defaults.
        source: where they came from, named in errors.

    Raises:
        ConfigError: the section is not a mapping, or a setting is unknown or invalid (every problem
            is listed with its dotted path).
    """
    data = dict(data or {})
    if CONFIG_KEY in data:
        section = data[CONFIG_KEY]
        if not isinstance(section, Mapping):
            raise ConfigError(f"{source}: '{CONFIG_KEY}' must be a mapping")
        data = dict(section)
    try:
        return RolloutConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(_describe(error) for error in exc.errors())
        hint = ""
        if "eval" in data and isinstance(data["eval"], Mapping):
            hint = " (an `eval:` section belongs to slime's --eval-config file, not to this one)"
        raise ConfigError(f"invalid rollout config in {source}: {problems}{hint}") from exc


def _describe(error: Any) -> str:
    """One validation problem as ``dotted.path: message``, with the closest known key for an unknown one."""
    loc = tuple(error["loc"])
    text = f"{'.'.join(str(part) for part in loc) or '<root>'}: {error['msg']}"
    if error.get("type") == "extra_forbidden" and loc:
        known = _known_keys(loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
        if close:
            text += f" (did you mean {close[0]!r}?)"
    return text


def _known_keys(path: tuple[Any, ...]) -> list[str]:
    """The keys a section of the rollout YAML accepts (the top level for an empty ``path``)."""
    model: Any = RolloutConfig
    for part in path:
        field = model.model_fields.get(str(part)) if isinstance(model, type) else None
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def load_config(path: str | os.PathLike[str]) -> RolloutConfig:
    """Read and validate a rollout YAML file.

    Raises:
        ConfigError: the file is missing, not YAML, not a mapping, or invalid (see :func:`parse_config`).
    """
    return parse_config(_load_yaml(path), source=str(path))


def get_rollout_config(args: Any = None) -> RolloutConfig:
    """The configuration for this run (cached per source; see the module docstring for the order).

    Args:
        args: slime's args: ``args.strands_slime`` (a RolloutConfig or a mapping) wins over
            ``args.strands_slime_config`` (a YAML path), then ``$STRANDS_SLIME_CONFIG``, then the defaults.

    Raises:
        ConfigError: the chosen source is missing or invalid.
    """
    inline = getattr(args, CONFIG_KEY, None) if args is not None else None
    path = getattr(args, "strands_slime_config", None) if args is not None else None
    env_path = os.environ.get(CONFIG_ENV)
    if isinstance(inline, RolloutConfig):
        return inline
    if inline is not None:
        if not isinstance(inline, Mapping):
            raise ConfigError(f"args.{CONFIG_KEY} must be a mapping, got {type(inline).__name__}")
        key: tuple[Any, ...] = ("inline", repr(sorted(inline.items(), key=lambda kv: str(kv[0]))))
        source = f"args.{CONFIG_KEY}"
        loader = lambda: parse_config(inline, source=source)  # noqa: E731
    elif path or env_path:
        chosen = str(path or env_path)
        stat = Path(chosen).expanduser().stat() if Path(chosen).expanduser().exists() else None
        key = ("file", chosen, stat.st_mtime_ns if stat else None)
        loader = lambda: load_config(chosen)  # noqa: E731
    else:
        key = ("defaults",)
        loader = RolloutConfig
    runtime = get_runtime()
    return runtime.cached(runtime.configs, key, loader)


_EVAL_FUNCTION_KEYS = ("custom_generate_function_path", "custom_rm_path")
_EVAL_POSITIVE_INTS = ("n_samples_per_eval_prompt", "max_response_len")


def check_eval_config(data: Mapping[str, Any], *, source: str = "<dict>") -> str:
    """Check a slime ``--eval-config`` file as far as it concerns us: its datasets are listed
    with a name and a path, their function paths import, their counts are positive integers and a
    ``strands_slime:`` section (if any) is a valid rollout config. slime checks the rest itself.

    Returns:
        One line naming the datasets checked.

    Raises:
        ConfigError: the first problem found, with the dataset's name.
    """
    section = data.get("eval", data)
    if not isinstance(section, Mapping):
        raise ConfigError(f"{source}: `eval` must be a mapping")
    defaults = section.get("defaults") or {}
    datasets = section.get("datasets")
    if isinstance(datasets, Mapping):  # slime also accepts {name: settings}
        datasets = [{"name": name, **dict(entry or {})} for name, entry in datasets.items()]
    if not isinstance(defaults, Mapping) or not isinstance(datasets, list) or not datasets:
        raise ConfigError(f"{source}: `eval.datasets` must list at least one dataset")
    names = []
    for entry in datasets:
        if not isinstance(entry, Mapping) or "name" not in entry or "path" not in entry:
            raise ConfigError(f"{source}: every eval dataset needs a name and a path, got {entry!r:.200}")
        merged = {**defaults, **entry}
        name = entry["name"]
        for key in _EVAL_POSITIVE_INTS:
            value = merged.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(
                    f"{source}: dataset {name}: {key} must be a positive integer, got {value!r}"
                )
        for key in _EVAL_FUNCTION_KEYS:
            if merged.get(key):
                _check_importable(str(merged[key]), f"{source}: dataset {name}: {key}")
        overrides = merged.get("metadata_overrides")
        if overrides is not None and not isinstance(overrides, Mapping):
            raise ConfigError(f"{source}: dataset {name}: metadata_overrides must be a mapping")
        names.append(str(name))
    if CONFIG_KEY in data:
        parse_config({CONFIG_KEY: data[CONFIG_KEY]}, source=source)
    return f"slime --eval-config with {len(names)} dataset(s): {', '.join(names)}"


def _check_importable(dotted: str, where: str) -> None:
    import_function(dotted, where)


def _is_eval_config(data: Mapping[str, Any]) -> bool:
    section = data.get("eval")
    return isinstance(section, Mapping) and "datasets" in section


def main(argv: list[str] | None = None) -> int:
    """``python -m strands_slime.config PATH``: validate a rollout YAML (or a slime ``--eval-config``
    that runs our generate and reward); exit 0 when valid, else 1.

    Prints one line either way, so a launch script's dry run can stop before any GPU time is spent."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    max_response_len: int | None = None
    if len(args) == 3 and args[1] == "--max-response-len" and args[2].isdigit() and int(args[2]) > 0:
        max_response_len = int(args[2])
        args = args[:1]
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print(
            "usage: python -m strands_slime.config PATH [--max-response-len N]  "
            "(validates a strands_slime rollout YAML or a slime --eval-config; with N, slime's "
            "--rollout-max-response-len, also the reward's overlong buffer against it)"
        )
        return 0 if args and args[0] in ("-h", "--help") else 1
    try:
        data = _load_yaml(args[0])
        what = check_eval_config(data, source=args[0]) if _is_eval_config(data) else None
        if what is None:
            config = parse_config(data, source=args[0])
            problem = config.reward.budget_problem(max_response_len) if max_response_len else None
            if problem:
                raise ConfigError(problem)
    except ConfigError as exc:
        print(f"strands_slime config error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    print(f"strands_slime config OK: {args[0]}" + (f" ({what})" if what else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
