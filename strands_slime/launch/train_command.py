"""slime's ``train.py`` command line for the recipe: GRPO on Qwen3-8B with DAPO's choices, our rollout's
entry points, and the user's own flags last (the last occurrence of a flag wins in argparse).

slime ignores unknown flags silently: ``tests/test_scripts.py`` checks every flag built here against
the real argument parsers' lists and parses the command with slime's own argument code.
"""

from __future__ import annotations

from collections.abc import Sequence

from strands_slime.launch.checkpoints import job_steps, retain_interval
from strands_slime.launch.inputs import EvalSettings
from strands_slime.launch.settings import LaunchSettings

FILTER_KEEPING_ZERO_STD = "strands_slime.rollout.filters.drop_groups_with_infra_failures"
FILTER_DROPPING_ZERO_STD = "strands_slime.rollout.filters.drop_infra_failures_and_zero_std"


EPISODE_NORMALIZATION = "strands_slime.rollout.fanout.normalize_by_group_index"


def episode_normalization_args(settings: LaunchSettings) -> list[str]:
    """GRPO that counts an episode once, for a rollout config that returns several samples per episode
    (fan-out, sub-agents): slime's default reshapes rewards by n_samples_per_prompt, which they break,
    and generate refuses to run without it. A post-processing the user passes after ``--`` wins."""
    from strands_slime.config import ConfigError, load_config

    flag = "--custom-reward-post-process-path"
    if any(arg == flag or arg.startswith(flag + "=") for arg in settings.extra_train_args):
        return []
    try:
        config = load_config(settings.rollout_config)
    except ConfigError:
        return []  # the rollout-config check has refused the launch with the reason
    several = config.fanout.enabled or config.agents.subagents or config.agents.tool_factories
    return [flag, EPISODE_NORMALIZATION] if several else []


def checkpoint_dir(settings: LaunchSettings) -> str:
    """Where the job loads and saves: a pilot's own folder (it never resumes or overwrites the run's)."""
    return f"{settings.pilot_dir}/checkpoint" if settings.pilot else settings.save_dir


def tensorboard_dir(settings: LaunchSettings) -> str:
    """Where slime writes TensorBoard files (the pilot reads its logprob gap there)."""
    return f"{settings.pilot_dir}/tensorboard" if settings.pilot else f"{settings.save_dir}/tensorboard"


def router_args(settings: LaunchSettings) -> list[str]:
    """Session affinity: generate sends ``X-SMG-Routing-Key = sample.session_id`` and the router's
    ``manual`` policy pins each key to one engine, so every turn of an episode hits the engine that holds
    its prefix in cache; ``min_load`` places new episodes on the least-loaded engine. (slime's docs name
    consistent_hashing, which the public sglang-router 0.3.2 argument parser rejects.)"""
    args = ["--router-policy", settings.router_policy]
    if settings.router_policy == "manual":
        args += ["--router-assignment-mode", settings.router_assignment_mode]
    return args


def train_command(
    settings: LaunchSettings, model_args: Sequence[str], evaluation: EvalSettings, save_interval: int
) -> list[str]:
    """``python3 $SLIME_DIR/train.py ...`` for this launch (a pilot: its steps, eval off, its own folder)."""
    steps = job_steps(settings)
    cluster = [
        *("--actor-num-nodes", str(settings.num_nodes)),
        *("--actor-num-gpus-per-node", str(settings.gpus_per_node)),
        *("--num-gpus-per-node", str(settings.gpus_per_node)),
        "--colocate",
    ]
    # --load and --save share one directory: a rerun (or the supervisor's restart after a crash) resumes
    # from the last checkpoint; the first run (none there yet) starts from --ref-load.
    folder = checkpoint_dir(settings)
    checkpoint = [
        *("--hf-checkpoint", settings.hf_checkpoint, "--ref-load", settings.ref_load),
        *("--load", folder, "--save", folder, "--save-interval", str(save_interval)),
    ]
    if settings.keep_checkpoints == "latest":
        checkpoint += ["--save-retain-interval", str(retain_interval(steps, save_interval))]
    # Prompts stay chat-message lists (no --apply-chat-template): the agent applies the template itself.
    rollout = [
        *("--prompt-data", settings.prompt_data, "--input-key", "prompt", "--label-key", "label"),
        "--rollout-shuffle",
        *("--num-rollout", str(steps), "--rollout-batch-size", str(settings.rollout_batch_size)),
        *("--n-samples-per-prompt", str(settings.n_samples_per_prompt)),
        *("--rollout-max-response-len", str(settings.max_response_len)),
        *("--rollout-temperature", settings.rollout_temperature),
        *("--global-batch-size", str(settings.global_batch_size)),
        "--balance-data",
        # DAPO dynamic sampling: slime samples this many prompts at a time and keeps groups until
        # ROLLOUT_BATCH_SIZE pass the filter; ours adds dropping groups that lost a sample to a failure.
        *("--over-sampling-batch-size", str(settings.over_sampling_batch_size)),
        "--dynamic-sampling-filter-path",
        FILTER_DROPPING_ZERO_STD if settings.dynamic_sampling else FILTER_KEEPING_ZERO_STD,
    ]
    # The groups still running when enough passed go back into the buffer and resume next step
    # (docs/rollout.md), so the slowest, hardest problems are delayed a step, not dropped.
    if settings.partial_rollout:
        rollout.append("--partial-rollout")
        if settings.mask_offpolicy_in_partial_rollout:
            rollout.append("--mask-offpolicy-in-partial-rollout")
    evaluation_args: list[str] = []
    if settings.eval_interval > 0 and not settings.pilot:
        evaluation_args = ["--eval-interval", str(settings.eval_interval)]
        if settings.eval_config:
            evaluation_args += ["--eval-config", settings.eval_config]
        else:
            evaluation_args += ["--eval-prompt-data", "aime", settings.eval_data, "--eval-top-p", "1"]
        # slime groups pass@k by the command line's k: the eval config's k and budget go here too.
        evaluation_args += [
            "--log-passrate",
            *("--n-samples-per-eval-prompt", str(evaluation.n_samples)),
            *("--eval-max-response-len", str(evaluation.max_response_len)),
        ]
    performance = [
        *("--tensor-model-parallel-size", str(settings.tp_size), "--sequence-parallel"),
        *("--pipeline-model-parallel-size", "1", "--context-parallel-size", "1"),
        *("--expert-model-parallel-size", "1", "--expert-tensor-parallel-size", "1"),
        *("--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"),
        *("--use-dynamic-batch-size", "--max-tokens-per-gpu", str(settings.max_tokens_per_gpu)),
    ]
    # DAPO: token-level policy-gradient loss, clip-higher (0.2/0.28), no KL term (a KL loss at 0 would
    # only cost a reference forward per step); KL_LOSS_COEF > 0 turns it on.
    grpo = [
        *("--advantage-estimator", "grpo", "--calculate-per-token-loss"),
        *("--entropy-coef", settings.entropy_coef, "--eps-clip", "0.2", "--eps-clip-high", "0.28"),
    ]
    if float(settings.kl_loss_coef) > 0:
        grpo += ["--use-kl-loss", "--kl-loss-coef", settings.kl_loss_coef, "--kl-loss-type", "low_var_kl"]
    # generate returns SGLang's logprobs for every model token: the trainer corrects the SGLang/Megatron
    # mismatch (TIS) or skips recomputing old logprobs (rollout-logprobs).
    grpo += {"tis": ["--use-tis"], "rollout-logprobs": ["--use-rollout-logprobs"], "none": []}[
        settings.off_policy_correction
    ]
    optimizer = [
        *("--optimizer", "adam", "--lr", settings.lr, "--lr-decay-style", "constant"),
        *("--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.98"),
    ]
    # The key itself reaches the Ray processes through the environment of `ray start` on each node,
    # never a command line (`ps`, Ray's job table) or the job's runtime env (its dashboard and logs).
    wandb = (
        ["--use-wandb", "--wandb-project", settings.wandb_project, "--wandb-group", settings.wandb_group]
        if settings.wandb_api_key
        else []
    )
    sglang = [
        *("--rollout-num-gpus-per-engine", str(settings.rollout_gpus_per_engine)),
        *("--sglang-mem-fraction-static", settings.sglang_mem_fraction),
        *router_args(settings),
    ]
    # Every metric also goes to TensorBoard files (a record on the run's own storage, and where the pilot
    # reads the logprob gap); slime's health monitor restarts an SGLang engine that stops answering.
    misc = [
        *("--attention-dropout", "0.0", "--hidden-dropout", "0.0"),
        *(
            "--accumulate-allreduce-grads-in-fp32",
            "--attention-softmax-in-fp32",
            "--attention-backend",
            "flash",
        ),
        *("--use-tensorboard", "--use-fault-tolerance"),
    ]
    # The sample hook counts every episode of a step (also those of dropped and aborted groups); the
    # rollout log function logs them with the kept groups' metrics (rollout/strands/step/*).
    custom = [
        *("--custom-generate-function-path", "strands_slime.generate"),
        *("--custom-rm-path", "strands_slime.reward_func"),
        *("--rollout-sample-hook-path", "strands_slime.rollout.metrics.count_episode"),
        *("--custom-rollout-log-function-path", "strands_slime.rollout.metrics.log_rollout"),
        *("--custom-eval-rollout-log-function-path", "strands_slime.rollout.metrics.log_eval_rollout"),
        *("--custom-config-path", settings.rollout_config),
        *episode_normalization_args(settings),
    ]
    return [
        *("python3", f"{settings.slime_dir}/train.py"),
        *cluster,
        *model_args,
        *checkpoint,
        *rollout,
        *evaluation_args,
        *performance,
        *grpo,
        *optimizer,
        *wandb,
        *sglang,
        *misc,
        *custom,
        *settings.extra_train_args,
    ]
