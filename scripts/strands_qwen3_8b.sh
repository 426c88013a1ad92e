#!/usr/bin/env bash
# GRPO training of Qwen3-8B on DAPO-math with a Python tool: slime (Megatron + SGLang) driving the
# strands_slime agent rollout. Starts Ray (head on rank 0, workers elsewhere) and submits slime's
# train.py. Every path and size is an environment variable; see --help and docs/training.md.
set -euo pipefail

SCRIPT_NAME=$(basename -- "${BASH_SOURCE[0]}")
SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd)
# shellcheck source=scripts/lib/common.sh
source "$SCRIPT_DIR/lib/common.sh"

usage() {
    cat <<'USAGE'
Usage: scripts/strands_qwen3_8b.sh [--dry-run] [--foreground] [-- EXTRA_TRAIN_PY_FLAGS...]

Train Qwen3-8B with slime + strands_slime. Run it on every node: rank 0 starts the Ray head and
submits train.py, other ranks join as Ray workers. Every check runs first, in the terminal; then
the launcher detaches (its own session, immune to a closed terminal) and logs to
$RUN_DIR/launch-node$NODE_RANK.log. `kill -TERM <its PID>` stops the job and the Ray node this
launcher started, nothing else. Flags after `--` are appended to train.py's command line (the last
occurrence of a flag wins).

Options
  --dry-run, DRY_RUN=1   print the checks' results and the resolved commands; start nothing
  --foreground           stay attached: Ctrl-C, SIGTERM or a closed terminal (SIGHUP) stop the job
  -h, --help             this text

Environment (default). Every path must be absolute and the same on every node.
  SLIME_DIR (/root/slime)  MEGATRON_DIR (/root/Megatron-LM)  STRANDS_SLIME_DIR (this repository)
  MODEL_DIR (/root/models)  HF_CHECKPOINT ($MODEL_DIR/Qwen3-8B)
  REF_LOAD ($MODEL_DIR/Qwen3-8B_torch_dist)  SAVE_DIR (/root/checkpoints/qwen3-8b-strands-slime;
  on a filesystem every node shares when NUM_NODES > 1)
  DATA_DIR (/root/data)  PROMPT_DATA ($DATA_DIR/dapo-math-17k.jsonl)
  EVAL_CONFIG ($STRANDS_SLIME_DIR/configs/eval_aime.yaml; empty: --eval-prompt-data aime $EVAL_DATA)
  EVAL_DATA ($DATA_DIR/aime-2024.jsonl, only with EVAL_CONFIG empty)
  ROLLOUT_CONFIG ($STRANDS_SLIME_DIR/configs/strands_math.yaml)
  NUM_NODES (1)  NODE_RANK (0)  MASTER_ADDR (127.0.0.1; the head's reachable address if NUM_NODES > 1)
  NODE_IP (this node's address: MASTER_ADDR on rank 0, else the source address towards MASTER_ADDR)
  GPUS_PER_NODE (8)  RAY_PORT (6379)  RAY_DASHBOARD_PORT (8265)  RAY_DASHBOARD_HOST (127.0.0.1)
  RAY_WAIT_TIMEOUT (900 s)  RAY_STOP_TIMEOUT (60 s)  RAY_POLL_INTERVAL (5 s)
  RAY_NODE_RESOURCES (unset; a JSON object of custom Ray resources this node offers, e.g.
  '{"rollout_cpu": 32}': its spare cores for the rollout's Ray episode workers and sandbox actors,
  see docs/training.md "CPU for the rollout")
  RUN_DIR (/tmp/strands-slime-$UID-$RAY_PORT, keep it short: this node's PID files,
  launcher log and Ray temp dir)
  NUM_ROLLOUT (3000)  ROLLOUT_BATCH_SIZE (16)  OVER_SAMPLING_BATCH_SIZE (2 x ROLLOUT_BATCH_SIZE)
  N_SAMPLES_PER_PROMPT (8)  GLOBAL_BATCH_SIZE (128)  DYNAMIC_SAMPLING (1: drop zero-std groups)
  MAX_RESPONSE_LEN (16384, per episode: model and tool tokens)  ROLLOUT_TEMPERATURE (1.0)
  EVAL_INTERVAL (20; 0 disables eval)  N_SAMPLES_PER_EVAL_PROMPT and EVAL_MAX_RESPONSE_LEN (16 and
  16384; with EVAL_CONFIG set, the file's values win)
  SAVE_INTERVAL (100)  CHECKPOINT_GB (115: SAVE_DIR must have room for one)  TP_SIZE (2)  MAX_TOKENS_PER_GPU (18432)  ROLLOUT_GPUS_PER_ENGINE (2)
  SGLANG_MEM_FRACTION (0.7)  ROUTER_POLICY (manual)  ROUTER_ASSIGNMENT_MODE (min_load)
  LR (1e-6)  KL_LOSS_COEF (0; > 0 adds --use-kl-loss)  ENTROPY_COEF (0)
  OFF_POLICY_CORRECTION (tis | rollout-logprobs | none)
  WANDB_API_KEY, WANDB_KEY or WANDB_API_KEY_FILE (a file only you can read) (unset: no W&B)
  WANDB_PROJECT (strands-slime)  WANDB_GROUP (qwen3-8b-strands-math)
  KILL_STALE (0; 1 = first stop a launch of this script, and the Ray node it started, that is
  still running on this node from RUN_DIR's PID files)
  REUSE_RAY (0; 1 = submit to a Ray cluster that is already running instead of refusing)
  KEEP_RAY (0; 1 = leave the Ray node this script started running when it exits)
  HAS_NVLINK (auto-detected with nvidia-smi)
USAGE
}

FOREGROUND=0
EXTRA_TRAIN_ARGS=()
while (($# > 0)); do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --foreground) FOREGROUND=1 ;;
        -h | --help)
            usage
            exit 0
            ;;
        --)
            shift
            EXTRA_TRAIN_ARGS=("$@")
            break
            ;;
        *) die "unknown argument '$1' (see --help; train.py flags go after --)" ;;
    esac
    shift
done
dry_run || true # validates DRY_RUN early
# What the detached launcher is started with (the environment carries everything else).
DETACHED_ARGS=(--foreground)
if ((${#EXTRA_TRAIN_ARGS[@]} > 0)); then
    DETACHED_ARGS+=(-- "${EXTRA_TRAIN_ARGS[@]}")
fi

# ---------------------------------------------------------------- configuration
SLIME_DIR="${SLIME_DIR:-/root/slime}"
MEGATRON_DIR="${MEGATRON_DIR:-/root/Megatron-LM}"
STRANDS_SLIME_DIR="${STRANDS_SLIME_DIR:-$REPO_ROOT}"
MODEL_DIR="${MODEL_DIR:-/root/models}"
HF_CHECKPOINT="${HF_CHECKPOINT:-$MODEL_DIR/Qwen3-8B}"
REF_LOAD="${REF_LOAD:-$MODEL_DIR/Qwen3-8B_torch_dist}"
SAVE_DIR="${SAVE_DIR:-/root/checkpoints/qwen3-8b-strands-slime}"
DATA_DIR="${DATA_DIR:-/root/data}"
PROMPT_DATA="${PROMPT_DATA:-$DATA_DIR/dapo-math-17k.jsonl}"
EVAL_DATA="${EVAL_DATA:-$DATA_DIR/aime-2024.jsonl}"
EVAL_CONFIG="${EVAL_CONFIG-$STRANDS_SLIME_DIR/configs/eval_aime.yaml}"
ROLLOUT_CONFIG="${ROLLOUT_CONFIG:-$STRANDS_SLIME_DIR/configs/strands_math.yaml}"

NUM_NODES="${NUM_NODES:-1}"
NODE_RANK="${NODE_RANK:-0}"
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
NODE_IP="${NODE_IP:-}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
RAY_PORT="${RAY_PORT:-6379}"
RAY_DASHBOARD_PORT="${RAY_DASHBOARD_PORT:-8265}"
RAY_DASHBOARD_HOST="${RAY_DASHBOARD_HOST:-127.0.0.1}"
RAY_WAIT_TIMEOUT="${RAY_WAIT_TIMEOUT:-900}"
RAY_STOP_TIMEOUT="${RAY_STOP_TIMEOUT:-60}"
RAY_POLL_INTERVAL="${RAY_POLL_INTERVAL:-5}"
# One Megatron checkpoint of Qwen3-8B: bf16 weights + fp32 master weights + two Adam moments.
CHECKPOINT_GB="${CHECKPOINT_GB:-115}"
# Short and under /tmp: Ray's socket paths under RUN_DIR/ray must stay below the 107-byte AF_UNIX limit.
RUN_DIR="${RUN_DIR:-/tmp/strands-slime-$(id -u)-$RAY_PORT}"

NUM_ROLLOUT="${NUM_ROLLOUT:-3000}"
ROLLOUT_BATCH_SIZE="${ROLLOUT_BATCH_SIZE:-16}"
OVER_SAMPLING_BATCH_SIZE="${OVER_SAMPLING_BATCH_SIZE:-}"
N_SAMPLES_PER_PROMPT="${N_SAMPLES_PER_PROMPT:-8}"
GLOBAL_BATCH_SIZE="${GLOBAL_BATCH_SIZE:-128}"
DYNAMIC_SAMPLING="${DYNAMIC_SAMPLING:-1}"
MAX_RESPONSE_LEN="${MAX_RESPONSE_LEN:-16384}"
ROLLOUT_TEMPERATURE="${ROLLOUT_TEMPERATURE:-1.0}"
EVAL_INTERVAL="${EVAL_INTERVAL:-20}"
N_SAMPLES_PER_EVAL_PROMPT="${N_SAMPLES_PER_EVAL_PROMPT:-16}"
EVAL_MAX_RESPONSE_LEN="${EVAL_MAX_RESPONSE_LEN:-16384}"
SAVE_INTERVAL="${SAVE_INTERVAL:-100}"
TP_SIZE="${TP_SIZE:-2}"
MAX_TOKENS_PER_GPU="${MAX_TOKENS_PER_GPU:-18432}"
ROLLOUT_GPUS_PER_ENGINE="${ROLLOUT_GPUS_PER_ENGINE:-2}"
SGLANG_MEM_FRACTION="${SGLANG_MEM_FRACTION:-0.7}"
ROUTER_POLICY="${ROUTER_POLICY:-manual}"
ROUTER_ASSIGNMENT_MODE="${ROUTER_ASSIGNMENT_MODE:-min_load}"
LR="${LR:-1e-6}"
KL_LOSS_COEF="${KL_LOSS_COEF:-0}"
ENTROPY_COEF="${ENTROPY_COEF:-0}"
OFF_POLICY_CORRECTION="${OFF_POLICY_CORRECTION:-tis}"

WANDB_API_KEY="${WANDB_API_KEY:-${WANDB_KEY:-}}"
WANDB_API_KEY_FILE="${WANDB_API_KEY_FILE:-}"
WANDB_PROJECT="${WANDB_PROJECT:-strands-slime}"
WANDB_GROUP="${WANDB_GROUP:-qwen3-8b-strands-math}"

KILL_STALE="${KILL_STALE:-0}"
REUSE_RAY="${REUSE_RAY:-0}"
KEEP_RAY="${KEEP_RAY:-0}"
RAY_NODE_RESOURCES="${RAY_NODE_RESOURCES:-}"
RAY_RESOURCE_ARGS=()
if [[ -n "$RAY_NODE_RESOURCES" ]]; then
    python3 -c 'import json, sys; value = json.loads(sys.argv[1]); assert isinstance(value, dict) and all(isinstance(v, (int, float)) and v >= 0 for v in value.values())' \
        "$RAY_NODE_RESOURCES" 2>/dev/null ||
        die "RAY_NODE_RESOURCES must be a JSON object of resource amounts, e.g. '{\"rollout_cpu\": 32}', got '$RAY_NODE_RESOURCES'"
    RAY_RESOURCE_ARGS=(--resources "$RAY_NODE_RESOURCES")
fi
# Cluster-wide W&B options for the job's runtime env. Node-specific settings (SLIME_HOST_IP,
# NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, NCCL_IB_HCA, HF_HOME, proxies) and the W&B key reach each
# node's Ray processes through the environment of that node's `ray start`, never through the job's
# runtime env: that would give every node the head's values, and Ray shows runtime envs on its
# dashboard and in its logs.
RUNTIME_ENV_PASSTHROUGH=(WANDB_MODE WANDB_BASE_URL WANDB_ENTITY)

# ---------------------------------------------------------------- validation (nothing started yet)
require_int ROLLOUT_BATCH_SIZE 1
OVER_SAMPLING_BATCH_SIZE="${OVER_SAMPLING_BATCH_SIZE:-$((2 * 10#$ROLLOUT_BATCH_SIZE))}"
for name in NUM_NODES GPUS_PER_NODE NUM_ROLLOUT ROLLOUT_BATCH_SIZE OVER_SAMPLING_BATCH_SIZE \
    N_SAMPLES_PER_PROMPT GLOBAL_BATCH_SIZE MAX_RESPONSE_LEN N_SAMPLES_PER_EVAL_PROMPT \
    EVAL_MAX_RESPONSE_LEN SAVE_INTERVAL TP_SIZE MAX_TOKENS_PER_GPU ROLLOUT_GPUS_PER_ENGINE RAY_PORT \
    RAY_DASHBOARD_PORT RAY_WAIT_TIMEOUT RAY_STOP_TIMEOUT RAY_POLL_INTERVAL; do
    require_int "$name" 1
done
require_int NODE_RANK 0
require_int CHECKPOINT_GB 0
require_int EVAL_INTERVAL 0
for name in ROLLOUT_TEMPERATURE SGLANG_MEM_FRACTION LR KL_LOSS_COEF ENTROPY_COEF; do
    require_number "$name"
done
for name in KILL_STALE REUSE_RAY KEEP_RAY DYNAMIC_SAMPLING; do
    is_true "${!name}" || true
done

((NODE_RANK < NUM_NODES)) || die "NODE_RANK ($NODE_RANK) must be < NUM_NODES ($NUM_NODES)"
TOTAL_GPUS=$((NUM_NODES * GPUS_PER_NODE))
((GPUS_PER_NODE % TP_SIZE == 0)) || die "GPUS_PER_NODE ($GPUS_PER_NODE) must be a multiple of TP_SIZE ($TP_SIZE)"
((TOTAL_GPUS % ROLLOUT_GPUS_PER_ENGINE == 0)) ||
    die "NUM_NODES*GPUS_PER_NODE ($TOTAL_GPUS) must be a multiple of ROLLOUT_GPUS_PER_ENGINE ($ROLLOUT_GPUS_PER_ENGINE)"
DATA_PARALLEL_SIZE=$((TOTAL_GPUS / TP_SIZE))
((GLOBAL_BATCH_SIZE % DATA_PARALLEL_SIZE == 0)) ||
    die "GLOBAL_BATCH_SIZE ($GLOBAL_BATCH_SIZE) must be a multiple of the data-parallel size ($DATA_PARALLEL_SIZE = $TOTAL_GPUS GPUs / TP_SIZE $TP_SIZE)"
SAMPLES_PER_ROLLOUT=$((ROLLOUT_BATCH_SIZE * N_SAMPLES_PER_PROMPT))
((SAMPLES_PER_ROLLOUT % GLOBAL_BATCH_SIZE == 0)) ||
    die "ROLLOUT_BATCH_SIZE*N_SAMPLES_PER_PROMPT ($SAMPLES_PER_ROLLOUT) must be a multiple of GLOBAL_BATCH_SIZE ($GLOBAL_BATCH_SIZE)"
((OVER_SAMPLING_BATCH_SIZE >= ROLLOUT_BATCH_SIZE)) ||
    die "OVER_SAMPLING_BATCH_SIZE ($OVER_SAMPLING_BATCH_SIZE) must be >= ROLLOUT_BATCH_SIZE ($ROLLOUT_BATCH_SIZE)"
awk -v f="$SGLANG_MEM_FRACTION" 'BEGIN { exit !(f > 0 && f < 1) }' ||
    die "SGLANG_MEM_FRACTION must be between 0 and 1, got $SGLANG_MEM_FRACTION"

case "$ROUTER_POLICY" in
    manual | consistent_hashing | cache_aware | round_robin | random | power_of_two) ;;
    *) die "ROUTER_POLICY must be manual, consistent_hashing, cache_aware, round_robin, random or power_of_two, got '$ROUTER_POLICY'" ;;
esac
case "$ROUTER_ASSIGNMENT_MODE" in
    min_load | min_group | random) ;;
    *) die "ROUTER_ASSIGNMENT_MODE must be min_load, min_group or random, got '$ROUTER_ASSIGNMENT_MODE'" ;;
esac

# Every node resolves paths on its own and the job runs in another working directory: relative
# paths would name different files on different nodes.
for name in SLIME_DIR MEGATRON_DIR STRANDS_SLIME_DIR MODEL_DIR HF_CHECKPOINT REF_LOAD SAVE_DIR DATA_DIR \
    PROMPT_DATA EVAL_DATA EVAL_CONFIG ROLLOUT_CONFIG RUN_DIR WANDB_API_KEY_FILE; do
    value="${!name}"
    [[ -z "$value" || "$value" == /* ]] || die "$name must be an absolute path (the same on every node), got '$value'"
done

is_loopback_default() {
    case "$1" in
        127.0.0.1 | localhost | ::1 | 0.0.0.0 | "") return 0 ;;
        *) return 1 ;;
    esac
}

# This node's own address: it binds its Ray node and becomes SLIME_HOST_IP, which slime uses for
# the router and engines it starts on this node.
if ((NUM_NODES > 1)) && is_loopback_default "$MASTER_ADDR"; then
    die "NUM_NODES=$NUM_NODES needs MASTER_ADDR set to the head node's address that every node can reach, got '$MASTER_ADDR'"
fi
if ((NODE_RANK == 0)); then
    if [[ -n "$NODE_IP" && "$NODE_IP" != "$MASTER_ADDR" ]]; then
        die "on rank 0 NODE_IP ($NODE_IP) must equal MASTER_ADDR ($MASTER_ADDR): the head binds MASTER_ADDR"
    fi
    NODE_IP="$MASTER_ADDR"
elif [[ -z "$NODE_IP" ]]; then
    # The source address of the route to the head (a UDP connect sends nothing).
    NODE_IP=$(python3 -c '
import socket, sys
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print(s.getsockname()[0])
' "$MASTER_ADDR" "$RAY_PORT" 2>/dev/null) ||
        die "cannot tell this node's address towards MASTER_ADDR ($MASTER_ADDR); set NODE_IP"
fi
if ((NODE_RANK > 0)) && [[ "$NODE_IP" == "$MASTER_ADDR" ]]; then
    die "NODE_IP ($NODE_IP) on rank $NODE_RANK equals MASTER_ADDR: every node needs its own address"
fi
NODE_SLIME_HOST_IP="${SLIME_HOST_IP:-$NODE_IP}"

if [[ -n "$WANDB_API_KEY_FILE" ]]; then
    [[ -f "$WANDB_API_KEY_FILE" && -r "$WANDB_API_KEY_FILE" ]] ||
        die "WANDB_API_KEY_FILE is not a readable file: $WANDB_API_KEY_FILE"
    mode=$(stat -c %a -- "$WANDB_API_KEY_FILE")
    (((8#$mode & 8#077) == 0)) ||
        die "WANDB_API_KEY_FILE ($WANDB_API_KEY_FILE) is readable by others (mode $mode); chmod 600 it"
    WANDB_API_KEY=$(tr -d '[:space:]' <"$WANDB_API_KEY_FILE")
    [[ -n "$WANDB_API_KEY" ]] || die "WANDB_API_KEY_FILE ($WANDB_API_KEY_FILE) is empty"
fi

# ---------------------------------------------------------------- train.py arguments
# shellcheck source=configs/qwen3_8b_model.sh
source "$REPO_ROOT/configs/qwen3_8b_model.sh"

CLUSTER_ARGS=(
    --actor-num-nodes "$NUM_NODES"
    --actor-num-gpus-per-node "$GPUS_PER_NODE"
    --num-gpus-per-node "$GPUS_PER_NODE"
    --colocate
)

# --load and --save share one directory: a rerun resumes from the last checkpoint, and the first
# run (no checkpoint there yet) starts from --ref-load (slime loads it when --load holds none, so it
# stays even without a KL term). Each checkpoint is ~115 GB (weights, fp32 master copy, Adam).
CKPT_ARGS=(
    --hf-checkpoint "$HF_CHECKPOINT"
    --ref-load "$REF_LOAD"
    --load "$SAVE_DIR"
    --save "$SAVE_DIR"
    --save-interval "$SAVE_INTERVAL"
)

# Prompts stay chat-message lists (no --apply-chat-template): the agent applies the template itself.
ROLLOUT_ARGS=(
    --prompt-data "$PROMPT_DATA"
    --input-key prompt
    --label-key label
    --rollout-shuffle
    --num-rollout "$NUM_ROLLOUT"
    --rollout-batch-size "$ROLLOUT_BATCH_SIZE"
    --n-samples-per-prompt "$N_SAMPLES_PER_PROMPT"
    --rollout-max-response-len "$MAX_RESPONSE_LEN"
    --rollout-temperature "$ROLLOUT_TEMPERATURE"
    --global-batch-size "$GLOBAL_BATCH_SIZE"
    --balance-data
)
# DAPO dynamic sampling: slime samples OVER_SAMPLING_BATCH_SIZE prompts at a time and keeps groups
# until ROLLOUT_BATCH_SIZE pass the filter. slime takes one filter path, so ours combines slime's
# non-zero-std rule with dropping groups that lost a sample to an infrastructure failure.
ROLLOUT_ARGS+=(--over-sampling-batch-size "$OVER_SAMPLING_BATCH_SIZE")
if is_true "$DYNAMIC_SAMPLING"; then
    ROLLOUT_ARGS+=(--dynamic-sampling-filter-path strands_slime.rollout.filters.drop_infra_failures_and_zero_std)
else
    ROLLOUT_ARGS+=(--dynamic-sampling-filter-path strands_slime.rollout.filters.drop_groups_with_infra_failures)
fi

# With EVAL_CONFIG, slime reads each dataset's sampling settings from the file; the file's
# n_samples_per_eval_prompt (the k of --log-passrate's pass@k) and max_response_len also go on the
# command line, since slime groups pass@k by --n-samples-per-eval-prompt (read below, after the checks).
EVAL_ARGS=()
if ((EVAL_INTERVAL > 0)); then
    EVAL_ARGS=(--eval-interval "$EVAL_INTERVAL")
    if [[ -n "$EVAL_CONFIG" ]]; then
        EVAL_ARGS+=(--eval-config "$EVAL_CONFIG")
    else
        EVAL_ARGS+=(--eval-prompt-data aime "$EVAL_DATA" --eval-top-p 1)
    fi
    EVAL_ARGS+=(--log-passrate)
fi

PERF_ARGS=(
    --tensor-model-parallel-size "$TP_SIZE"
    --sequence-parallel
    --pipeline-model-parallel-size 1
    --context-parallel-size 1
    --expert-model-parallel-size 1
    --expert-tensor-parallel-size 1
    --recompute-granularity full
    --recompute-method uniform
    --recompute-num-layers 1
    --use-dynamic-batch-size
    --max-tokens-per-gpu "$MAX_TOKENS_PER_GPU"
)

# DAPO: token-level policy-gradient loss, clip-higher (0.2/0.28), no KL term. A KL loss at
# coefficient 0 would only cost a reference-model forward per step; KL_LOSS_COEF > 0 turns it on.
GRPO_ARGS=(
    --advantage-estimator grpo
    --calculate-per-token-loss
    --entropy-coef "$ENTROPY_COEF"
    --eps-clip 0.2
    --eps-clip-high 0.28
)
if awk -v c="$KL_LOSS_COEF" 'BEGIN { exit !(c > 0) }'; then
    GRPO_ARGS+=(--use-kl-loss --kl-loss-coef "$KL_LOSS_COEF" --kl-loss-type low_var_kl)
fi
# generate returns SGLang's logprobs for every model token, so the trainer can correct for the
# SGLang/Megatron numeric mismatch (TIS) or skip recomputing old logprobs (rollout-logprobs).
case "$OFF_POLICY_CORRECTION" in
    tis) GRPO_ARGS+=(--use-tis) ;;
    rollout-logprobs) GRPO_ARGS+=(--use-rollout-logprobs) ;;
    none) ;;
    *) die "OFF_POLICY_CORRECTION must be tis, rollout-logprobs or none, got '$OFF_POLICY_CORRECTION'" ;;
esac

OPTIMIZER_ARGS=(
    --optimizer adam
    --lr "$LR"
    --lr-decay-style constant
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.98
)

# The key itself reaches the Ray processes through the environment of `ray start` on each node,
# never a command line (`ps`, Ray's job table) or the job's runtime env (Ray's dashboard and logs).
WANDB_ARGS=()
if [[ -n "$WANDB_API_KEY" ]]; then
    WANDB_ARGS=(--use-wandb --wandb-project "$WANDB_PROJECT" --wandb-group "$WANDB_GROUP")
fi

# Session affinity: generate sends X-SMG-Routing-Key = sample.session_id, and the router's `manual`
# policy pins each key to one engine, so every turn of an episode hits the engine that already holds
# its prefix in cache; min_load places new episodes on the least-loaded engine. (slime's docs name
# consistent_hashing, which the public sglang-router 0.3.2 argument parser rejects; see
# docs/training.md.)
SGLANG_ARGS=(
    --rollout-num-gpus-per-engine "$ROLLOUT_GPUS_PER_ENGINE"
    --sglang-mem-fraction-static "$SGLANG_MEM_FRACTION"
    --router-policy "$ROUTER_POLICY"
)
if [[ "$ROUTER_POLICY" == manual ]]; then
    SGLANG_ARGS+=(--router-assignment-mode "$ROUTER_ASSIGNMENT_MODE")
fi

MISC_ARGS=(
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --accumulate-allreduce-grads-in-fp32
    --attention-softmax-in-fp32
    --attention-backend flash
)

CUSTOM_ARGS=(
    --custom-generate-function-path strands_slime.generate
    --custom-rm-path strands_slime.reward_func
    --custom-rollout-log-function-path strands_slime.rollout.metrics.log_rollout
    --custom-eval-rollout-log-function-path strands_slime.rollout.metrics.log_eval_rollout
    --custom-config-path "$ROLLOUT_CONFIG"
)

# ---------------------------------------------------------------- checks on every node
# last_line TEXT: a helper's verdict (its last line, without its own "error: ") for a one-line die.
last_line() {
    local line="${1##*$'\n'}"
    printf '%s' "${line#error: }"
}

# Ray may place the rollout manager, the trainer's ranks and the engines on any node, so every node
# checks every input it will read.
require_commands ray python3 setsid
check_dir "slime checkout (SLIME_DIR)" "$SLIME_DIR"
check_file "slime's train.py" "$SLIME_DIR/train.py"
check_dir "Megatron-LM checkout (MEGATRON_DIR)" "$MEGATRON_DIR/megatron"
check_dir "strands_slime package (STRANDS_SLIME_DIR)" "$STRANDS_SLIME_DIR/strands_slime"
check_file "Hugging Face checkpoint (HF_CHECKPOINT)" "$HF_CHECKPOINT/config.json" \
    "hf download Qwen/Qwen3-8B --local-dir $HF_CHECKPOINT"
check_file "torch_dist checkpoint (REF_LOAD)" "$REF_LOAD/latest_checkpointed_iteration.txt" \
    "run scripts/convert_qwen3_8b.sh"
check_file "training data (PROMPT_DATA)" "$PROMPT_DATA" "python -m data_prep.download --out $DATA_DIR"
check_file "rollout config (ROLLOUT_CONFIG)" "$ROLLOUT_CONFIG"
if ((EVAL_INTERVAL > 0)); then
    if [[ -z "$EVAL_CONFIG" ]]; then
        check_file "eval data (EVAL_DATA)" "$EVAL_DATA" "python -m data_prep.download --out $DATA_DIR"
    elif [[ -f "$EVAL_CONFIG" ]]; then
        # The file's k and budget, resolved as slime resolves it (DATA_DIR as the job will see it).
        settings=$(DATA_DIR="$DATA_DIR" python3 "$SCRIPT_DIR/lib/eval_settings.py" "$EVAL_CONFIG" \
            "$N_SAMPLES_PER_EVAL_PROMPT" "$EVAL_MAX_RESPONSE_LEN" 2>&1) || die "EVAL_CONFIG: $(last_line "$settings")"
        read -r N_SAMPLES_PER_EVAL_PROMPT EVAL_MAX_RESPONSE_LEN <<<"${settings%%$'\n'*}"
        while IFS= read -r dataset_path; do
            [[ "$dataset_path" == /* ]] ||
                die "EVAL_CONFIG ($EVAL_CONFIG) names a relative dataset path '$dataset_path'; make it absolute"
            check_file "eval dataset named in EVAL_CONFIG" "$dataset_path" "python -m data_prep.download --out $DATA_DIR"
        done < <(tail -n +2 <<<"$settings")
    else
        check_file "eval config (EVAL_CONFIG)" "$EVAL_CONFIG"
    fi
    EVAL_ARGS+=(--n-samples-per-eval-prompt "$N_SAMPLES_PER_EVAL_PROMPT" --eval-max-response-len "$EVAL_MAX_RESPONSE_LEN")
fi

# Disk for checkpoints: refuse when not even one fits, warn when the whole run's do not (Megatron
# keeps every checkpoint it saves).
existing="$SAVE_DIR"
while [[ ! -d "$existing" && "$existing" != / ]]; do existing=$(dirname -- "$existing"); done
free_kb=$(df -Pk -- "$existing" 2>/dev/null | awk 'NR == 2 { print $4 }') || free_kb=""
free_gb=$((${free_kb:-0} / 1024 / 1024))
checkpoints=$((NUM_ROLLOUT / SAVE_INTERVAL))
if ! [[ "$free_kb" =~ ^[0-9]+$ ]]; then
    log "note: cannot read the free space under $existing; SAVE_DIR needs ~${CHECKPOINT_GB} GB per checkpoint"
elif ((free_gb < CHECKPOINT_GB)); then
    _check_failed "SAVE_DIR ($SAVE_DIR) has ${free_gb} GB free, less than one ${CHECKPOINT_GB} GB checkpoint"
elif ((free_gb < checkpoints * CHECKPOINT_GB)); then
    log "note: $checkpoints checkpoints of ~${CHECKPOINT_GB} GB need $((checkpoints * CHECKPOINT_GB)) GB; SAVE_DIR has ${free_gb} GB free: delete old iter_* folders as it runs, or raise SAVE_INTERVAL"
fi
finish_checks

# The package's own validator: a misspelled key stops the launch, not the job an hour later.
if [[ -f "$ROLLOUT_CONFIG" && -d "$STRANDS_SLIME_DIR/strands_slime" ]]; then
    verdict=$(PYTHONPATH="$STRANDS_SLIME_DIR${PYTHONPATH:+:$PYTHONPATH}" \
        python3 -m strands_slime.config "$ROLLOUT_CONFIG" 2>&1) || die "ROLLOUT_CONFIG: $(last_line "$verdict")"
    log "$verdict"
    # Without the package the reward silently falls back to string and number checks. A real run
    # imports it (a broken install fails too); a dry run only looks for it (importing sympy is slow).
    if ! PYTHONPATH="$STRANDS_SLIME_DIR${PYTHONPATH:+:$PYTHONPATH}" python3 -c '
import importlib, importlib.util, sys
from strands_slime.config import load_config
if load_config(sys.argv[1]).reward.math_verify:
    if sys.argv[2] == "1":
        sys.exit(importlib.util.find_spec("math_verify") is None)
    importlib.import_module("math_verify")
' "$ROLLOUT_CONFIG" "$(dry_run && echo 1 || echo 0)" 2>/dev/null; then
        problem="ROLLOUT_CONFIG enables reward.math_verify but the math-verify package is not installed on this node: pip install 'math-verify>=0.7' (or set math_verify: false)"
        if dry_run; then log "note (dry run, not fatal): $problem"; else die "$problem"; fi
    fi
fi
if ! dry_run; then
    python3 "$SCRIPT_DIR/lib/check_hf_config.py" "$HF_CHECKPOINT" -- "${MODEL_ARGS[@]}" ||
        die "HF_CHECKPOINT does not hold Qwen3-8B"
fi

TRAIN_CMD=(
    python3 "$SLIME_DIR/train.py"
    "${CLUSTER_ARGS[@]}"
    "${MODEL_ARGS[@]}"
    "${CKPT_ARGS[@]}"
    "${ROLLOUT_ARGS[@]}"
    "${EVAL_ARGS[@]}"
    "${PERF_ARGS[@]}"
    "${GRPO_ARGS[@]}"
    "${OPTIMIZER_ARGS[@]}"
    "${WANDB_ARGS[@]}"
    "${SGLANG_ARGS[@]}"
    "${MISC_ARGS[@]}"
    "${CUSTOM_ARGS[@]}"
    "${EXTRA_TRAIN_ARGS[@]}"
)

# ---------------------------------------------------------------- processes this launch owns
# RUN_DIR (node-local) records the PIDs this launch started: the launcher itself and its
# `ray start --block` process, whose SIGTERM handler stops exactly the Ray processes of that node.
# Nothing else on the machine is ever signalled.
LAUNCHER_PID_FILE="$RUN_DIR/launcher.pid"
RAY_PID_FILE="$RUN_DIR/ray-node.pid"
LOG_FILE="$RUN_DIR/launch-node$NODE_RANK.log"
RAY_LOG_FILE="$RUN_DIR/ray-node.log"
RAY_TEMP_DIR="$RUN_DIR/ray"
HEAD_MARKER="$SAVE_DIR/.strands-slime-head"
RAY_NODE_PID=""
SUBMIT_PID=""
JOB_ID=""
JOB_DONE=0
RUNTIME_ENV_FILE=""

# pid_alive PID PATTERN: PID runs and its command line contains PATTERN (guards against PID reuse;
# a zombie has an empty command line and counts as gone).
pid_alive() {
    local pid="$1" pattern="$2" cmdline
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    [[ "$cmdline" == *"$pattern"* ]]
}

# stop_pid PID PATTERN WHAT: SIGTERM, then SIGKILL after RAY_STOP_TIMEOUT seconds.
stop_pid() {
    local pid="$1" pattern="$2" what="$3" deadline=$((SECONDS + RAY_STOP_TIMEOUT))
    pid_alive "$pid" "$pattern" || return 0
    log "stopping $what (PID $pid)"
    kill -TERM "$pid" 2>/dev/null || return 0
    while pid_alive "$pid" "$pattern"; do
        if ((SECONDS >= deadline)); then
            log "$what (PID $pid) still running after ${RAY_STOP_TIMEOUT}s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            return 0
        fi
        nap 0.2
    done
}

recorded_pid() {
    local pid=""
    [[ -f "$1" ]] && read -r pid <"$1"
    printf '%s' "$pid"
}

# Refuse (or, with KILL_STALE=1 and stop=1, stop) what an earlier launch from RUN_DIR left running.
check_previous_launch() {
    local stop="$1" launcher ray_node
    launcher=$(recorded_pid "$LAUNCHER_PID_FILE")
    ray_node=$(recorded_pid "$RAY_PID_FILE")
    if [[ -n "$launcher" && "$launcher" != "$$" ]] && pid_alive "$launcher" "$SCRIPT_NAME"; then
        if ! is_true "$KILL_STALE"; then
            die "a launch of this script is still running on this node (PID $launcher, RUN_DIR $RUN_DIR): kill -TERM $launcher, or set KILL_STALE=1"
        fi
        ((stop)) && stop_pid "$launcher" "$SCRIPT_NAME" "the earlier launch (KILL_STALE=1)"
    fi
    if [[ -n "$ray_node" ]] && pid_alive "$ray_node" "ray start"; then
        if ! is_true "$KILL_STALE"; then
            die "the Ray node an earlier launch started is still running (PID $ray_node, RUN_DIR $RUN_DIR): kill -TERM $ray_node, or set KILL_STALE=1"
        fi
        ((stop)) && stop_pid "$ray_node" "ray start" "the earlier launch's Ray node (KILL_STALE=1)"
    fi
    return 0
}

cleanup() {
    local status=$?
    trap - EXIT HUP INT TERM
    if [[ -n "$JOB_ID" ]] && ((JOB_DONE == 0)); then
        log "stopping Ray job $JOB_ID"
        timeout "$RAY_STOP_TIMEOUT" ray job stop --address "http://127.0.0.1:$RAY_DASHBOARD_PORT" "$JOB_ID" >&2 || true
    fi
    if [[ -n "$SUBMIT_PID" ]]; then
        stop_pid "$SUBMIT_PID" "job submit" "ray job submit"
    fi
    if [[ -n "$RAY_NODE_PID" ]]; then
        if is_true "$KEEP_RAY"; then
            log "KEEP_RAY=1: the Ray node keeps running (PID $RAY_NODE_PID; stop it with kill -TERM $RAY_NODE_PID)"
        else
            stop_pid "$RAY_NODE_PID" "ray start" "the Ray node this launch started"
            rm -f -- "$RAY_PID_FILE"
        fi
    fi
    if [[ -n "$RUNTIME_ENV_FILE" ]]; then
        rm -f -- "$RUNTIME_ENV_FILE"
    fi
    if [[ "$(recorded_pid "$LAUNCHER_PID_FILE")" == "$$" ]]; then
        rm -f -- "$LAUNCHER_PID_FILE"
    fi
    exit "$status"
}

# poll_delay DEADLINE MAX: seconds to sleep before the next poll, never past the deadline.
poll_delay() {
    local remaining=$(($1 - SECONDS))
    if ((remaining < 1)); then echo 1; elif ((remaining < $2)); then echo "$remaining"; else echo "$2"; fi
}

# nap SECONDS: sleep in the background and wait, so a signal runs the trap at once.
nap() {
    sleep "$1" &
    wait "$!" || true
}

ray_is_up() {
    ray status --address "$MASTER_ADDR:$RAY_PORT" >/dev/null 2>&1
}

# Wait until NUM_NODES nodes with GPUS_PER_NODE GPUs each have joined the cluster.
wait_for_nodes() {
    local deadline=$((SECONDS + RAY_WAIT_TIMEOUT)) counts nodes gpus
    while :; do
        counts=$(
            python3 - "$MASTER_ADDR:$RAY_PORT" <<'PY' 2>/dev/null || true
import sys
import ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
alive = sum(1 for node in ray.nodes() if node.get("Alive"))
print(alive, int(ray.cluster_resources().get("GPU", 0)))
PY
        )
        read -r nodes gpus <<<"${counts:-0 0}"
        if ((nodes >= NUM_NODES && gpus >= TOTAL_GPUS)); then
            log "Ray cluster ready: $nodes nodes, $gpus GPUs"
            return
        fi
        ((SECONDS < deadline)) ||
            die "only $nodes/$NUM_NODES nodes and $gpus/$TOTAL_GPUS GPUs joined within ${RAY_WAIT_TIMEOUT}s; start this script with NODE_RANK=1..$((NUM_NODES - 1)) on the other nodes"
        log "waiting for Ray nodes: $nodes/$NUM_NODES nodes, $gpus/$TOTAL_GPUS GPUs"
        nap "$(poll_delay "$deadline" "$RAY_POLL_INTERVAL")"
    done
}

runtime_env_json() {
    local pythonpath="$MEGATRON_DIR:$SLIME_DIR:$STRANDS_SLIME_DIR${PYTHONPATH:+:$PYTHONPATH}"
    local pairs=(
        PYTHONPATH "$pythonpath"
        CUDA_DEVICE_MAX_CONNECTIONS 1
        NCCL_NVLS_ENABLE "$(detect_nvlink)"
        PYTHONUNBUFFERED 1
        STRANDS_SLIME_CONFIG "$ROLLOUT_CONFIG"
        DATA_DIR "$DATA_DIR"
    )
    local name
    for name in "${RUNTIME_ENV_PASSTHROUGH[@]}"; do
        if [[ -n "${!name:-}" ]]; then
            pairs+=("$name" "${!name}")
        fi
    done
    json_env "${pairs[@]}"
}

# start_ray_node ARGS...: `ray start ARGS --block` in its own session (terminal signals reach only
# this launcher, which decides what stops), recorded in RAY_PID_FILE.
start_ray_node() {
    local cmd=(ray start "$@" --block)
    if dry_run; then
        print_cmd "${cmd[@]}"
        return
    fi
    print_cmd "${cmd[@]}" >&2
    # Its own log: a node kept with KEEP_RAY=1 outlives this launcher and its terminal.
    setsid "${cmd[@]}" </dev/null >>"$RAY_LOG_FILE" 2>&1 &
    RAY_NODE_PID=$!
    printf '%s\n' "$RAY_NODE_PID" >"$RAY_PID_FILE"
}

# wait_until_head_is_up WHAT: poll the head until it answers; give up if our own `ray start` died.
wait_until_head_is_up() {
    local deadline=$((SECONDS + RAY_WAIT_TIMEOUT))
    until ray_is_up; do
        if [[ -n "$RAY_NODE_PID" ]] && ! pid_alive "$RAY_NODE_PID" "ray start"; then
            RAY_NODE_PID=""
            die "ray start exited before the head came up; see $RAY_LOG_FILE"
        fi
        ((SECONDS < deadline)) || die "no Ray head at $MASTER_ADDR:$RAY_PORT after ${RAY_WAIT_TIMEOUT}s; $1"
        log "waiting for the Ray head at $MASTER_ADDR:$RAY_PORT"
        nap "$(poll_delay "$deadline" "$RAY_POLL_INTERVAL")"
    done
}

# SAVE_DIR must be one directory for every node (Megatron's ranks write their shards of a
# checkpoint from every node). The head writes a marker naming itself and the time; a worker that
# does not see a fresh marker for the same head is looking at a different filesystem.
write_head_marker() {
    if dry_run; then
        printf '# SAVE_DIR check: write %s for the workers to find\n' "$HEAD_MARKER"
        return
    fi
    mkdir -p -- "$SAVE_DIR"
    printf '%s:%s %s\n' "$MASTER_ADDR" "$RAY_PORT" "$(date +%s)" >"$HEAD_MARKER"
}

check_shared_save_dir() {
    if dry_run; then
        printf '# SAVE_DIR check: %s must exist here, written by the head within RAY_WAIT_TIMEOUT\n' "$HEAD_MARKER"
        return
    fi
    local head="" written=0 now
    [[ -f "$HEAD_MARKER" ]] && read -r head written <"$HEAD_MARKER"
    now=$(date +%s)
    if [[ "$head" != "$MASTER_ADDR:$RAY_PORT" ]] || ! [[ "$written" =~ ^[0-9]+$ ]] ||
        ((now - written > RAY_WAIT_TIMEOUT + 60)); then
        die "SAVE_DIR ($SAVE_DIR) is not shared with the head: no fresh $HEAD_MARKER from $MASTER_ADDR:$RAY_PORT here; put SAVE_DIR on a filesystem every node mounts at the same path"
    fi
}

submit_job() {
    JOB_ID="strands-qwen3-8b-$(date +%Y%m%d-%H%M%S)-$$"
    local submit=(ray job submit --address "http://127.0.0.1:$RAY_DASHBOARD_PORT" --submission-id "$JOB_ID")
    if dry_run; then
        printf '# runtime-env (written to a private file in RUN_DIR):\n'
        runtime_env_json | sed 's/^/#   /'
        print_cmd "${submit[@]}" --runtime-env RUNTIME_ENV_FILE -- "${TRAIN_CMD[@]}"
        JOB_ID=""
        return
    fi
    RUNTIME_ENV_FILE=$(mktemp "$RUN_DIR/runtime-env.XXXXXX")
    runtime_env_json >"$RUNTIME_ENV_FILE"
    log "submitting $JOB_ID (dashboard: http://$RAY_DASHBOARD_HOST:$RAY_DASHBOARD_PORT)"
    print_cmd "${submit[@]}" --runtime-env "$RUNTIME_ENV_FILE" -- "${TRAIN_CMD[@]}" >&2
    setsid "${submit[@]}" --runtime-env "$RUNTIME_ENV_FILE" -- "${TRAIN_CMD[@]}" </dev/null &
    SUBMIT_PID=$!
    # `wait` (not a foreground child) so a signal runs the trap at once, not when the job ends.
    local status=0
    wait "$SUBMIT_PID" || status=$?
    SUBMIT_PID=""
    JOB_DONE=1
    return "$status"
}

# ---------------------------------------------------------------- launch
# Node-specific settings reach this node's Ray processes through the environment of `ray start`.
export SLIME_HOST_IP="$NODE_SLIME_HOST_IP"
if [[ -n "$WANDB_API_KEY" ]]; then
    export WANDB_API_KEY
fi
if [[ -n "${http_proxy:-}${https_proxy:-}${HTTP_PROXY:-}${HTTPS_PROXY:-}" ]]; then
    direct="127.0.0.1,localhost,$NODE_IP,$MASTER_ADDR"
    export no_proxy="${no_proxy:+$no_proxy,}$direct" NO_PROXY="${NO_PROXY:+$NO_PROXY,}$direct"
    log "a proxy is set: $direct added to no_proxy (add the other nodes' addresses too, see docs/training.md)"
fi
if dry_run; then
    printf '# this node (rank %s): NODE_IP=%s, SLIME_HOST_IP=%s in the environment of ray start%s\n' \
        "$NODE_RANK" "$NODE_IP" "$SLIME_HOST_IP" "${WANDB_API_KEY:+, with WANDB_API_KEY (not printed)}"
fi

if ! dry_run; then
    (umask 077 && mkdir -p -- "$RUN_DIR")
    [[ -O "$RUN_DIR" ]] || die "RUN_DIR ($RUN_DIR) belongs to another user; set RUN_DIR"
    check_previous_launch 0
fi
if ((NODE_RANK == 0)) && ! is_true "$REUSE_RAY" && ! is_true "$KILL_STALE" && ! dry_run && ray_is_up; then
    die "a Ray cluster is already running at $MASTER_ADDR:$RAY_PORT; use another RAY_PORT, or REUSE_RAY=1 to submit to it"
fi

if ((FOREGROUND == 0)); then
    detach=(setsid bash "$SCRIPT_DIR/$SCRIPT_NAME" "${DETACHED_ARGS[@]}")
    if dry_run; then
        printf -v quoted '%q ' "${detach[@]}"
        printf '# checks passed; the launcher now detaches (a closed terminal does not stop it; --foreground stays attached):\n'
        printf '#   %s> %q\n' "$quoted" "$LOG_FILE"
    else
        "${detach[@]}" >"$LOG_FILE" 2>&1 </dev/null &
        printf '%s\n' "$!" >"$LAUNCHER_PID_FILE"
        log "checks passed; the launch runs in the background as PID $!, in its own session"
        log "log:  tail -f $LOG_FILE"
        log "stop: kill -TERM $! (stops the job and the Ray node it started, nothing else)"
        exit 0
    fi
fi

if ! dry_run; then
    trap cleanup EXIT
    trap 'exit 129' HUP
    trap 'exit 130' INT
    trap 'exit 143' TERM
    check_previous_launch 1
    printf '%s\n' "$$" >"$LAUNCHER_PID_FILE"
    if ((NODE_RANK == 0)) && ! is_true "$REUSE_RAY" && is_true "$KILL_STALE" && ray_is_up; then
        die "a Ray cluster this launch did not start is running at $MASTER_ADDR:$RAY_PORT; use another RAY_PORT, or REUSE_RAY=1 to submit to it"
    fi
elif is_true "$KILL_STALE"; then
    printf '# KILL_STALE=1: first stop the launcher and Ray node recorded in %s, if still running\n' "$RUN_DIR"
fi

if ((NODE_RANK == 0)); then
    if ((NUM_NODES > 1)); then
        write_head_marker
    fi
    if is_true "$REUSE_RAY" && ! dry_run && ray_is_up; then
        log "REUSE_RAY=1: submitting to the running Ray cluster (it will be left running)"
        if [[ -n "$WANDB_API_KEY" ]]; then
            log "REUSE_RAY=1: its Ray processes must already hold WANDB_API_KEY; this launch does not pass it"
        fi
    else
        start_ray_node --head --node-ip-address "$NODE_IP" --port "$RAY_PORT" --temp-dir "$RAY_TEMP_DIR" \
            --num-gpus "$GPUS_PER_NODE" --disable-usage-stats "${RAY_RESOURCE_ARGS[@]}" \
            --dashboard-host "$RAY_DASHBOARD_HOST" --dashboard-port "$RAY_DASHBOARD_PORT"
        dry_run || wait_until_head_is_up "ray start did not bring it up"
    fi
    if ((NUM_NODES > 1)); then
        if dry_run; then
            printf '# wait until %s nodes with %s GPUs in all have joined (up to %ss)\n' \
                "$NUM_NODES" "$TOTAL_GPUS" "$RAY_WAIT_TIMEOUT"
        else
            wait_for_nodes
        fi
    fi
    if ! dry_run; then
        mkdir -p -- "$SAVE_DIR"
    fi
    submit_job
else
    log "rank $NODE_RANK of $NUM_NODES ($NODE_IP): joining the Ray head at $MASTER_ADDR:$RAY_PORT as a worker"
    if dry_run; then
        printf '# wait for the Ray head at %s:%s (up to %ss)\n' "$MASTER_ADDR" "$RAY_PORT" "$RAY_WAIT_TIMEOUT"
    else
        wait_until_head_is_up "start rank 0 first"
    fi
    check_shared_save_dir
    start_ray_node --address "$MASTER_ADDR:$RAY_PORT" --node-ip-address "$NODE_IP" \
        --num-gpus "$GPUS_PER_NODE" --disable-usage-stats "${RAY_RESOURCE_ARGS[@]}"
    if ! dry_run; then
        status=0
        wait "$RAY_NODE_PID" || status=$?
        RAY_NODE_PID=""
        rm -f -- "$RAY_PID_FILE"
        log "the Ray node exited (status $status): the head stopped or this node lost it"
        exit "$status"
    fi
fi
