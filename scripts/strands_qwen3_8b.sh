#!/usr/bin/env bash
# GRPO training of Qwen3-8B on DAPO-math with a Python tool: slime (Megatron + SGLang) driving the
# strands_slime agent rollout. Starts Ray (head on rank 0, workers elsewhere) and submits slime's
# train.py. Every path and size is an environment variable; see --help and docs/training.md.
#
# The whole script is one block that ends in `exit`: bash reads all of it before running any of it,
# so changing this file (a `git pull`) while a launcher supervises a weeks-long job cannot change
# what that launcher runs (bash otherwise reads a script as it goes, at byte offsets).
{
set -euo pipefail

SCRIPT_NAME=$(basename -- "${BASH_SOURCE[0]}")
SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd)
# shellcheck source=scripts/lib/common.sh
source "$SCRIPT_DIR/lib/common.sh"

usage() {
    cat <<'USAGE'
Usage: scripts/strands_qwen3_8b.sh [--pilot] [--dry-run] [--foreground] [-- EXTRA_TRAIN_PY_FLAGS...]

Train Qwen3-8B with slime + strands_slime. Run it on every node: rank 0 starts the Ray head and
submits train.py, other ranks join as Ray workers. Every check runs first, in the terminal; then
the launcher detaches (its own session, immune to a closed terminal) and logs to
$RUN_DIR/node$NODE_RANK/launch.log. On rank 0 it supervises the job from Ray's job state: after a crash
or a hang (WATCHDOG_MINUTES) it stops the job, waits for every node, resubmits from the latest
checkpoint (MAX_RESTARTS within RESTART_WINDOW_HOURS), and records what it does and why in
$RUN_DIR/node0/state.json. `kill -TERM <its PID>` stops the job and the Ray node
this launcher started, nothing else. Flags after `--` are appended to train.py's command line (the
last occurrence of a flag wins).

Options
  --pilot, PILOT=1       first thing to run on a new cluster (on every node, like the run): PILOT_STEPS
                         steps with eval off, measured; writes $PILOT_DIR/pilot.json and pilot.md
                         (step time split, GPU memory per role, SGLang headroom, tokens/s, keep,
                         truncation and abort rates, logprob gap) and projects the full run's time,
                         GPU-hours and disk. The run then checkpoints from the pilot's step time.
  --dry-run, DRY_RUN=1   print the checks' results and the resolved commands; start nothing
  --foreground           stay attached: Ctrl-C, SIGTERM or a closed terminal (SIGHUP) stop the job
  -h, --help             this text

Environment (default). Every path must be absolute and the same on every node.
  PRESET (1x8; 4x8 = four nodes of 8 GPUs, four times the episodes per rollout in four optimizer
  updates of the one-node 128 samples: NUM_NODES 4, ROLLOUT_BATCH_SIZE 64, GLOBAL_BATCH_SIZE 128,
  NUM_ROLLOUT 750; variables you set win)
  SLIME_DIR (/root/slime)  MEGATRON_DIR (/root/Megatron-LM)  STRANDS_SLIME_DIR (this repository)
  MODEL_DIR (/root/models)  HF_CHECKPOINT ($MODEL_DIR/Qwen3-8B)
  REF_LOAD ($MODEL_DIR/Qwen3-8B_torch_dist)  SAVE_DIR (/root/checkpoints/qwen3-8b-strands-slime;
  on a filesystem every node shares when NUM_NODES > 1: checkpoints, TensorBoard, the pilot)
  DATA_DIR (/root/data)  PROMPT_DATA ($DATA_DIR/dapo-math-17k.jsonl)
  EVAL_CONFIG ($STRANDS_SLIME_DIR/configs/eval_aime.yaml; empty: --eval-prompt-data aime $EVAL_DATA)
  EVAL_DATA ($DATA_DIR/aime-2024.jsonl, only with EVAL_CONFIG empty)
  ROLLOUT_CONFIG ($STRANDS_SLIME_DIR/configs/strands_math.yaml)
  NUM_NODES (1)  NODE_RANK (0)  MASTER_ADDR (127.0.0.1; the head's reachable address if NUM_NODES > 1)
  NODE_IP (this node's address: MASTER_ADDR on rank 0, else the source address towards MASTER_ADDR)
  GPUS_PER_NODE (8)  RAY_PORT (6379)  RAY_DASHBOARD_PORT (8265)  RAY_DASHBOARD_HOST (127.0.0.1)
  RAY_WAIT_TIMEOUT (900 s)  RAY_STOP_TIMEOUT (60 s)  RAY_POLL_INTERVAL (5 s)
  RAY_AUTH (auto: Ray token authentication when the installed Ray has it (>= 2.52); on; off)
  RAY_AUTH_TOKEN_FILE ($SAVE_DIR/.ray-auth-token, mode 600, written by the head)
  RUN_DIR ($SAVE_DIR/run: logs and run state, this node's under node$NODE_RANK/)
  RAY_TEMP_DIR (/tmp/strands-slime-$UID-$RAY_PORT: Ray's sockets and own logs; keep it short)
  RAY_NODE_RESOURCES (unset; a JSON object of custom Ray resources this node offers, e.g.
  '{"rollout_cpu": 32}': its spare cores for the rollout's Ray episode workers and sandbox actors,
  see docs/training.md "CPU for the rollout")
  NUM_ROLLOUT (3000)  ROLLOUT_BATCH_SIZE (16)  OVER_SAMPLING_BATCH_SIZE (2 x ROLLOUT_BATCH_SIZE)
  N_SAMPLES_PER_PROMPT (8)  GLOBAL_BATCH_SIZE (128)  DYNAMIC_SAMPLING (1: drop zero-std groups)
  PARTIAL_ROLLOUT (1: episodes the over-sampling abort cuts off resume next step instead of being
  thrown away)  MASK_OFFPOLICY_IN_PARTIAL_ROLLOUT (0)
  MAX_RESPONSE_LEN (32768, per episode: model and tool tokens)  ROLLOUT_TEMPERATURE (1.0)
  EVAL_INTERVAL (20; 0 disables eval)  N_SAMPLES_PER_EVAL_PROMPT and EVAL_MAX_RESPONSE_LEN (16 and
  16384; with EVAL_CONFIG set, the file's values win)
  SAVE_HOURS (2: most hours of steps a crash may lose)  SAVE_INTERVAL (steps; default: SAVE_HOURS
  of the pilot's p90 step time from PILOT_JSON, else of STEP_MINUTES, your estimate)
  KEEP_CHECKPOINTS (latest; all keeps every one)  CHECKPOINT_GB (115: one checkpoint's size)
  MAX_RESTARTS (5, within any RESTART_WINDOW_HOURS, 24)  MAX_RESTARTS_WITHOUT_PROGRESS (2)
  RESTART_BACKOFF (60 s, doubling while restarts bring no new checkpoint, up to RESTART_BACKOFF_MAX, 1800 s)
  WATCHDOG_MINUTES (180: no new step, rollout or checkpoint for that long stops the job; 0 = off)
  RAY_STATUS_TIMEOUT (300 s: how long Ray may fail to report the job's state before it counts as lost)
  PILOT_STEPS (8)  PILOT_DIR ($SAVE_DIR/pilot)  PILOT_JSON ($PILOT_DIR/pilot.json)
  PILOT_KEEP_CHECKPOINT (0)  GPU_HOUR_PRICE (unset: the pilot projects GPU-hours, no cost)
  RUN_HOURS (unset: the pilot also gives the NUM_ROLLOUT that fits these wall-clock hours)
  TP_SIZE (2)  MAX_TOKENS_PER_GPU (18432)  ROLLOUT_GPUS_PER_ENGINE (2)
  SGLANG_MEM_FRACTION (0.7)  ROUTER_POLICY (manual)  ROUTER_ASSIGNMENT_MODE (min_load)
  LR (1e-6)  KL_LOSS_COEF (0; > 0 adds --use-kl-loss)  ENTROPY_COEF (0)
  OFF_POLICY_CORRECTION (tis | rollout-logprobs | none)
  WANDB_API_KEY, WANDB_KEY or WANDB_API_KEY_FILE (a file only you can read) (unset: no W&B)
  WANDB_PROJECT (strands-slime)  WANDB_GROUP (qwen3-8b-strands-math)
  SANDBOX_HOST_NETWORK (0; 1 = accept a node where the sandbox cannot isolate model code from the
  network, see docs/training.md "Sandbox isolation"; the preflight refuses such a node otherwise)
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
        --pilot) PILOT=1 ;;
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
PILOT="${PILOT:-0}"
is_true "$PILOT" || true
# What the detached launcher is started with (the environment carries everything else;
# CHECKS_DONE=1 tells it that this process already ran the checks a moment ago).
DETACHED_ARGS=(--foreground)
if ((${#EXTRA_TRAIN_ARGS[@]} > 0)); then
    DETACHED_ARGS+=(-- "${EXTRA_TRAIN_ARGS[@]}")
fi

# ---------------------------------------------------------------- configuration
# A preset only fills what the environment leaves unset.
USER_SET_BATCH="${ROLLOUT_BATCH_SIZE:-}${GLOBAL_BATCH_SIZE:-}"
PRESET="${PRESET:-1x8}"
case "$PRESET" in
    1x8) ;;
    4x8)
        # Four times the GPUs: four times the episodes per rollout, in optimizer updates of the
        # one-node recipe's 128 samples (four per rollout, as DAPO takes several), at the same
        # learning rate; a quarter of the rollouts, so the run sees as many samples and updates.
        NUM_NODES="${NUM_NODES:-4}"
        ROLLOUT_BATCH_SIZE="${ROLLOUT_BATCH_SIZE:-64}"
        GLOBAL_BATCH_SIZE="${GLOBAL_BATCH_SIZE:-128}"
        NUM_ROLLOUT="${NUM_ROLLOUT:-750}"
        ;;
    *) die "PRESET must be 1x8 or 4x8, got '$PRESET'" ;;
esac

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
RAY_AUTH="${RAY_AUTH:-auto}"
RAY_AUTH_TOKEN_FILE="${RAY_AUTH_TOKEN_FILE:-$SAVE_DIR/.ray-auth-token}"
# One Megatron checkpoint of Qwen3-8B: bf16 weights + fp32 master weights + two Adam moments.
CHECKPOINT_GB="${CHECKPOINT_GB:-115}"
# Logs and run state persist with the run (SAVE_DIR is shared, so every node gets its own folder).
RUN_DIR="${RUN_DIR:-$SAVE_DIR/run}"
NODE_DIR="$RUN_DIR/node$NODE_RANK"
# Short and node-local: Ray's socket paths under it must stay below the 107-byte AF_UNIX limit.
RAY_TEMP_DIR="${RAY_TEMP_DIR:-/tmp/strands-slime-$(id -u)-$RAY_PORT}"

NUM_ROLLOUT="${NUM_ROLLOUT:-3000}"
ROLLOUT_BATCH_SIZE="${ROLLOUT_BATCH_SIZE:-16}"
OVER_SAMPLING_BATCH_SIZE="${OVER_SAMPLING_BATCH_SIZE:-}"
N_SAMPLES_PER_PROMPT="${N_SAMPLES_PER_PROMPT:-8}"
GLOBAL_BATCH_SIZE="${GLOBAL_BATCH_SIZE:-128}"
DYNAMIC_SAMPLING="${DYNAMIC_SAMPLING:-1}"
PARTIAL_ROLLOUT="${PARTIAL_ROLLOUT:-1}"
MASK_OFFPOLICY_IN_PARTIAL_ROLLOUT="${MASK_OFFPOLICY_IN_PARTIAL_ROLLOUT:-0}"
# Qwen3's recommended output length for thinking mode; tool output counts against it too.
MAX_RESPONSE_LEN="${MAX_RESPONSE_LEN:-32768}"
ROLLOUT_TEMPERATURE="${ROLLOUT_TEMPERATURE:-1.0}"
EVAL_INTERVAL="${EVAL_INTERVAL:-20}"
N_SAMPLES_PER_EVAL_PROMPT="${N_SAMPLES_PER_EVAL_PROMPT:-16}"
EVAL_MAX_RESPONSE_LEN="${EVAL_MAX_RESPONSE_LEN:-16384}"
SAVE_HOURS="${SAVE_HOURS:-2}"
SAVE_INTERVAL="${SAVE_INTERVAL:-}"
STEP_MINUTES="${STEP_MINUTES:-}"
KEEP_CHECKPOINTS="${KEEP_CHECKPOINTS:-latest}"
MAX_RESTARTS="${MAX_RESTARTS:-5}"
RESTART_WINDOW_HOURS="${RESTART_WINDOW_HOURS:-24}"
WATCHDOG_MINUTES="${WATCHDOG_MINUTES:-180}"
RAY_STATUS_TIMEOUT="${RAY_STATUS_TIMEOUT:-300}"
MAX_RESTARTS_WITHOUT_PROGRESS="${MAX_RESTARTS_WITHOUT_PROGRESS:-2}"
RESTART_BACKOFF="${RESTART_BACKOFF:-60}"
RESTART_BACKOFF_MAX="${RESTART_BACKOFF_MAX:-1800}"
PILOT_STEPS="${PILOT_STEPS:-8}"
PILOT_DIR="${PILOT_DIR:-$SAVE_DIR/pilot}"
PILOT_JSON="${PILOT_JSON:-$PILOT_DIR/pilot.json}"
PILOT_KEEP_CHECKPOINT="${PILOT_KEEP_CHECKPOINT:-0}"
GPU_HOUR_PRICE="${GPU_HOUR_PRICE:-}"
RUN_HOURS="${RUN_HOURS:-}"
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

SANDBOX_HOST_NETWORK="${SANDBOX_HOST_NETWORK:-0}"
KILL_STALE="${KILL_STALE:-0}"
REUSE_RAY="${REUSE_RAY:-0}"
KEEP_RAY="${KEEP_RAY:-0}"
# Set by this script for the launcher it detaches: the checks ran a moment ago in the same environment.
LAUNCH_CHECKED="${LAUNCH_CHECKED:-0}"
RAY_NODE_RESOURCES="${RAY_NODE_RESOURCES:-}"
RAY_RESOURCE_ARGS=()
if [[ -n "$RAY_NODE_RESOURCES" ]]; then
    python3 -c 'import json, sys; value = json.loads(sys.argv[1]); assert isinstance(value, dict) and all(isinstance(v, (int, float)) and v >= 0 for v in value.values())' \
        "$RAY_NODE_RESOURCES" 2>/dev/null ||
        die "RAY_NODE_RESOURCES must be a JSON object of resource amounts, e.g. '{\"rollout_cpu\": 32}', got '$RAY_NODE_RESOURCES'"
    RAY_RESOURCE_ARGS=(--resources "$RAY_NODE_RESOURCES")
fi
# Cluster-wide W&B options for the job's runtime env. Node-specific settings (SLIME_HOST_IP,
# NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, NCCL_IB_HCA, HF_HOME, proxies), the W&B key and Ray's
# auth token reach each node's Ray processes through the environment of that node's `ray start`,
# never through the job's runtime env: that would give every node the head's values, and Ray shows
# runtime envs on its dashboard and in its logs.
RUNTIME_ENV_PASSTHROUGH=(WANDB_MODE WANDB_BASE_URL WANDB_ENTITY)

# ---------------------------------------------------------------- validation (nothing started yet)
require_int ROLLOUT_BATCH_SIZE 1
OVER_SAMPLING_BATCH_SIZE="${OVER_SAMPLING_BATCH_SIZE:-$((2 * 10#$ROLLOUT_BATCH_SIZE))}"
for name in NUM_NODES GPUS_PER_NODE NUM_ROLLOUT ROLLOUT_BATCH_SIZE OVER_SAMPLING_BATCH_SIZE \
    N_SAMPLES_PER_PROMPT GLOBAL_BATCH_SIZE MAX_RESPONSE_LEN N_SAMPLES_PER_EVAL_PROMPT \
    EVAL_MAX_RESPONSE_LEN TP_SIZE MAX_TOKENS_PER_GPU ROLLOUT_GPUS_PER_ENGINE RAY_PORT \
    RAY_DASHBOARD_PORT RAY_WAIT_TIMEOUT RAY_STOP_TIMEOUT RAY_POLL_INTERVAL RAY_STATUS_TIMEOUT \
    MAX_RESTARTS_WITHOUT_PROGRESS; do
    require_int "$name" 1
done
for name in NODE_RANK CHECKPOINT_GB EVAL_INTERVAL MAX_RESTARTS RESTART_BACKOFF RESTART_BACKOFF_MAX WATCHDOG_MINUTES; do
    require_int "$name" 0
done
# A pilot leaves its first step out of the statistics: it needs at least two more.
require_int PILOT_STEPS 3
[[ -z "$SAVE_INTERVAL" ]] || require_int SAVE_INTERVAL 1
for name in ROLLOUT_TEMPERATURE SGLANG_MEM_FRACTION LR KL_LOSS_COEF ENTROPY_COEF SAVE_HOURS RESTART_WINDOW_HOURS; do
    require_number "$name"
done
for name in STEP_MINUTES GPU_HOUR_PRICE RUN_HOURS; do
    [[ -z "${!name}" ]] || require_number "$name"
done
for name in SANDBOX_HOST_NETWORK KILL_STALE REUSE_RAY KEEP_RAY DYNAMIC_SAMPLING PARTIAL_ROLLOUT MASK_OFFPOLICY_IN_PARTIAL_ROLLOUT \
    PILOT_KEEP_CHECKPOINT LAUNCH_CHECKED; do
    is_true "${!name}" || true
done
awk -v h="$SAVE_HOURS" 'BEGIN { exit !(h > 0) }' || die "SAVE_HOURS must be > 0, got $SAVE_HOURS"
case "$KEEP_CHECKPOINTS" in
    latest | all) ;;
    *) die "KEEP_CHECKPOINTS must be latest or all, got '$KEEP_CHECKPOINTS'" ;;
esac
case "$RAY_AUTH" in
    auto | on | off) ;;
    *) die "RAY_AUTH must be auto, on or off, got '$RAY_AUTH'" ;;
esac
if is_true "$MASK_OFFPOLICY_IN_PARTIAL_ROLLOUT" && ! is_true "$PARTIAL_ROLLOUT"; then
    die "MASK_OFFPOLICY_IN_PARTIAL_ROLLOUT=1 needs PARTIAL_ROLLOUT=1"
fi

((NODE_RANK < NUM_NODES)) || die "NODE_RANK ($NODE_RANK) must be < NUM_NODES ($NUM_NODES)"
if ((NUM_NODES > 1)) && [[ "$PRESET" == 1x8 && -z "$USER_SET_BATCH" ]]; then
    log "note: NUM_NODES=$NUM_NODES keeps the one-node batch ($ROLLOUT_BATCH_SIZE prompts, $GLOBAL_BATCH_SIZE samples per update) on $NUM_NODES times the GPUs, most of them idle each step; PRESET=4x8 scales it (or set ROLLOUT_BATCH_SIZE)"
fi
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
    PROMPT_DATA EVAL_DATA EVAL_CONFIG ROLLOUT_CONFIG RUN_DIR RAY_TEMP_DIR PILOT_DIR PILOT_JSON \
    RAY_AUTH_TOKEN_FILE WANDB_API_KEY_FILE; do
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

RUN_EVAL_INTERVAL="$EVAL_INTERVAL"
# A pilot runs PILOT_STEPS steps of the same job with eval off, into its own checkpoint folder (so
# it never resumes, or overwrites, the run's checkpoints), and saves halfway so the save is timed.
if is_true "$PILOT"; then
    JOB_STEPS="$PILOT_STEPS"
    EVAL_INTERVAL=0 # the run's (RUN_EVAL_INTERVAL) goes into the pilot's projection
    CHECKPOINT_DIR="$PILOT_DIR/checkpoint"
    TENSORBOARD_DIR="$PILOT_DIR/tensorboard"
else
    JOB_STEPS="$NUM_ROLLOUT"
    CHECKPOINT_DIR="$SAVE_DIR"
    TENSORBOARD_DIR="$SAVE_DIR/tensorboard"
fi

# --load and --save share one directory: a rerun (or the supervisor's restart after a crash)
# resumes from the last checkpoint, and the first run (no checkpoint there yet) starts from
# --ref-load (slime loads it when --load holds none, so it stays even without a KL term). Each
# checkpoint is ~115 GB (weights, fp32 master copy, Adam). Built once SAVE_INTERVAL is known (checks).
checkpoint_args() {
    CKPT_ARGS=(
        --hf-checkpoint "$HF_CHECKPOINT"
        --ref-load "$REF_LOAD"
        --load "$CHECKPOINT_DIR"
        --save "$CHECKPOINT_DIR"
        --save-interval "$SAVE_INTERVAL"
    )
    # Megatron deletes the previous checkpoint once the next is written, unless its iteration is a
    # multiple of this (it must be a multiple of --save-interval). slime saves iteration
    # rollout_id = k * SAVE_INTERVAL - 1, never such a multiple (for SAVE_INTERVAL > 1), so only the
    # latest stays; one interval past the run's end makes that hold for SAVE_INTERVAL 1 too.
    if [[ "$KEEP_CHECKPOINTS" == latest ]]; then
        CKPT_ARGS+=(--save-retain-interval "$(((JOB_STEPS / SAVE_INTERVAL + 1) * SAVE_INTERVAL))")
    fi
}

# Prompts stay chat-message lists (no --apply-chat-template): the agent applies the template itself.
ROLLOUT_ARGS=(
    --prompt-data "$PROMPT_DATA"
    --input-key prompt
    --label-key label
    --rollout-shuffle
    --num-rollout "$JOB_STEPS"
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
# Once ROLLOUT_BATCH_SIZE groups passed, slime aborts the groups still running: the slowest, i.e.
# the longest episodes and the hardest problems. Thrown away, every step would train on what
# finishes first. With --partial-rollout they go back into the data buffer and our generate resumes
# each aborted episode where it stopped (docs/rollout.md), so hard problems are delayed a step,
# not dropped. rollout/strands/step/aborted and .../resumed count them every step.
if is_true "$PARTIAL_ROLLOUT"; then
    ROLLOUT_ARGS+=(--partial-rollout)
    if is_true "$MASK_OFFPOLICY_IN_PARTIAL_ROLLOUT"; then
        ROLLOUT_ARGS+=(--mask-offpolicy-in-partial-rollout)
    fi
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
ROUTER_ARGS=(--router-policy "$ROUTER_POLICY")
if [[ "$ROUTER_POLICY" == manual ]]; then
    ROUTER_ARGS+=(--router-assignment-mode "$ROUTER_ASSIGNMENT_MODE")
fi
SGLANG_ARGS=(
    --rollout-num-gpus-per-engine "$ROLLOUT_GPUS_PER_ENGINE"
    --sglang-mem-fraction-static "$SGLANG_MEM_FRACTION"
    "${ROUTER_ARGS[@]}"
)

MISC_ARGS=(
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --accumulate-allreduce-grads-in-fp32
    --attention-softmax-in-fp32
    --attention-backend flash
)

# The sample hook counts every episode of a step (also those of dropped and aborted groups); the
# rollout log function logs them with the kept groups' metrics (rollout/strands/step/*).
CUSTOM_ARGS=(
    --custom-generate-function-path strands_slime.generate
    --custom-rm-path strands_slime.reward_func
    --rollout-sample-hook-path strands_slime.rollout.metrics.count_episode
    --custom-rollout-log-function-path strands_slime.rollout.metrics.log_rollout
    --custom-eval-rollout-log-function-path strands_slime.rollout.metrics.log_eval_rollout
    --custom-config-path "$ROLLOUT_CONFIG"
)

# Every metric also goes to TensorBoard files under SAVE_DIR (TENSORBOARD_DIR in the runtime env): a
# record on the run's own storage, and the only place slime logs train/* (the pilot reads the
# logprob gap there). slime's rollout health monitor restarts an SGLang engine that stops answering.
MISC_ARGS+=(--use-tensorboard --use-fault-tolerance)

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
# count_prompts FILE: lines of a JSONL dataset (0 if unreadable): the pilot projects evaluation from them.
count_prompts() {
    [[ -r "$1" ]] && EVAL_PROMPTS=$((EVAL_PROMPTS + $(wc -l <"$1"))) || true
}
EVAL_PROMPTS=0
if ((RUN_EVAL_INTERVAL > 0)); then
    if [[ -z "$EVAL_CONFIG" ]]; then
        check_file "eval data (EVAL_DATA)" "$EVAL_DATA" "python -m data_prep.download --out $DATA_DIR"
        count_prompts "$EVAL_DATA"
    elif [[ -f "$EVAL_CONFIG" ]]; then
        # The file's k and budget, resolved as slime resolves it (DATA_DIR as the job will see it).
        settings=$(DATA_DIR="$DATA_DIR" python3 "$SCRIPT_DIR/lib/eval_settings.py" "$EVAL_CONFIG" \
            "$N_SAMPLES_PER_EVAL_PROMPT" "$EVAL_MAX_RESPONSE_LEN" 2>&1) || die "EVAL_CONFIG: $(last_line "$settings")"
        read -r N_SAMPLES_PER_EVAL_PROMPT EVAL_MAX_RESPONSE_LEN <<<"${settings%%$'\n'*}"
        while IFS= read -r dataset_path; do
            [[ "$dataset_path" == /* ]] ||
                die "EVAL_CONFIG ($EVAL_CONFIG) names a relative dataset path '$dataset_path'; make it absolute"
            check_file "eval dataset named in EVAL_CONFIG" "$dataset_path" "python -m data_prep.download --out $DATA_DIR"
            count_prompts "$dataset_path"
        done < <(tail -n +2 <<<"$settings")
    else
        check_file "eval config (EVAL_CONFIG)" "$EVAL_CONFIG"
    fi
    ((EVAL_INTERVAL > 0)) && EVAL_ARGS+=(--n-samples-per-eval-prompt "$N_SAMPLES_PER_EVAL_PROMPT" --eval-max-response-len "$EVAL_MAX_RESPONSE_LEN")
fi

# Settings that decide a step's time: a pilot.json measured under others does not size this run.
PILOT_SETTINGS=(
    "NUM_NODES=$NUM_NODES" "GPUS_PER_NODE=$GPUS_PER_NODE" "ROLLOUT_BATCH_SIZE=$ROLLOUT_BATCH_SIZE"
    "OVER_SAMPLING_BATCH_SIZE=$OVER_SAMPLING_BATCH_SIZE" "N_SAMPLES_PER_PROMPT=$N_SAMPLES_PER_PROMPT"
    "GLOBAL_BATCH_SIZE=$GLOBAL_BATCH_SIZE" "MAX_RESPONSE_LEN=$MAX_RESPONSE_LEN" "TP_SIZE=$TP_SIZE"
    "ROLLOUT_GPUS_PER_ENGINE=$ROLLOUT_GPUS_PER_ENGINE" "MAX_TOKENS_PER_GPU=$MAX_TOKENS_PER_GPU"
    "SGLANG_MEM_FRACTION=$SGLANG_MEM_FRACTION" "PARTIAL_ROLLOUT=$PARTIAL_ROLLOUT"
    "DYNAMIC_SAMPLING=$DYNAMIC_SAMPLING" "OFF_POLICY_CORRECTION=$OFF_POLICY_CORRECTION"
    "EXTRA_TRAIN_ARGS=${EXTRA_TRAIN_ARGS[*]}"
)
strands_python() {
    PYTHONPATH="$STRANDS_SLIME_DIR${PYTHONPATH:+:$PYTHONPATH}" python3 "$@"
}

# Checkpoint cadence: at most SAVE_HOURS of steps between saves, from the pilot's p90 step time.
if is_true "$PILOT"; then
    SAVE_INTERVAL=$((PILOT_STEPS / 2))
elif [[ -n "$SAVE_INTERVAL" ]]; then
    log "checkpoints every $SAVE_INTERVAL steps (SAVE_INTERVAL)"
elif [[ -f "$PILOT_JSON" ]]; then
    if interval=$(strands_python -m strands_slime.launch.pilot save-interval "$PILOT_JSON" --hours "$SAVE_HOURS" \
        --num-rollout "$NUM_ROLLOUT" "${PILOT_SETTINGS[@]/#/--setting=}" 2>&1); then
        read -r SAVE_INTERVAL step_p90 <<<"$interval"
        log "checkpoints every $SAVE_INTERVAL steps: $SAVE_HOURS h at the pilot's p90 step time of ${step_p90} s ($PILOT_JSON)"
    else
        _check_failed "PILOT_JSON: $(last_line "$interval") (or set SAVE_INTERVAL)"
        SAVE_INTERVAL=1
    fi
elif [[ -n "$STEP_MINUTES" ]]; then
    SAVE_INTERVAL=$(awk -v h="$SAVE_HOURS" -v m="$STEP_MINUTES" 'BEGIN { n = int(h * 60 / m); print (n < 1 ? 1 : n) }')
    log "checkpoints every $SAVE_INTERVAL steps: $SAVE_HOURS h at STEP_MINUTES=$STEP_MINUTES (an estimate; --pilot measures it)"
else
    _check_failed "no step time to size checkpoints by ($SAVE_HOURS h of steps at most): run --pilot first (it writes $PILOT_JSON), or set STEP_MINUTES (your estimate) or SAVE_INTERVAL"
    dry_run && log "note (dry run): the command below saves every step in place of a sized SAVE_INTERVAL"
    SAVE_INTERVAL=1
fi
((SAVE_INTERVAL <= JOB_STEPS)) || SAVE_INTERVAL="$JOB_STEPS"
checkpoint_args

# free_gb PATH: GB free on the filesystem that holds PATH (its nearest existing folder); empty if unknown.
free_gb() {
    local existing="$1" kb
    while [[ ! -d "$existing" && "$existing" != / ]]; do existing=$(dirname -- "$existing"); done
    kb=$(df -Pk -- "$existing" 2>/dev/null | awk 'NR == 2 { print $4 }') || kb=""
    [[ "$kb" =~ ^[0-9]+$ ]] && printf '%s' "$((kb / 1024 / 1024))"
}

# require_room WHAT PATH GB WHY: a failed check (or, for WHAT starting with "note:", a note) below GB.
require_room() {
    local what="$1" path="$2" need="$3" why="$4" free
    free=$(free_gb "$path" || true)
    if [[ -z "$free" ]]; then
        log "note: cannot read the free space under $path; $what needs ~$need GB ($why)"
    elif ((free < need)); then
        if [[ "$what" == note:* ]]; then
            log "note: ${what#note: } ($path) has $free GB free, less than $need GB ($why)"
        else
            _check_failed "$what ($path) has $free GB free, less than $need GB ($why)"
        fi
    fi
}

# Megatron writes the next checkpoint before it deletes the previous one: two at once.
if [[ "$KEEP_CHECKPOINTS" == latest ]]; then
    kept=2
    why="two ${CHECKPOINT_GB} GB checkpoints at once: the next is written before the previous goes"
else
    kept=$(((JOB_STEPS + SAVE_INTERVAL - 1) / SAVE_INTERVAL))
    why="KEEP_CHECKPOINTS=all: $kept checkpoints of ${CHECKPOINT_GB} GB; KEEP_CHECKPOINTS=latest needs two"
fi
if is_true "$PILOT"; then
    require_room "PILOT_DIR" "$PILOT_DIR" "$((kept * CHECKPOINT_GB))" "the pilot's own checkpoint: $why"
else
    require_room "SAVE_DIR" "$SAVE_DIR" "$((kept * CHECKPOINT_GB))" "$why"
fi
require_room "RUN_DIR" "$RUN_DIR" 1 "logs and run state"
require_room "note: RAY_TEMP_DIR" "$RAY_TEMP_DIR" 20 "Ray's session logs and object spilling"
if ((${#RAY_TEMP_DIR} > 40)); then
    log "note: RAY_TEMP_DIR ($RAY_TEMP_DIR) is ${#RAY_TEMP_DIR} characters: Ray's socket paths under it may pass the 107-byte limit; keep it under 40"
fi
finish_checks

# The package's own validator: a misspelled key stops the launch, not the job an hour later. The
# detached launcher skips what its parent checked a moment ago (importing math-verify takes seconds).
if [[ -f "$ROLLOUT_CONFIG" && -d "$STRANDS_SLIME_DIR/strands_slime" ]] && ! is_true "$LAUNCH_CHECKED"; then
    # DAPO's overlong punishment counts back from the episode budget train.py gets (MAX_RESPONSE_LEN,
    # or the last --rollout-max-response-len after --): a buffer as long as the budget punishes every
    # response for its length, so the config is checked against that budget.
    budget="$MAX_RESPONSE_LEN"
    for ((i = 0; i < ${#EXTRA_TRAIN_ARGS[@]}; i++)); do
        case "${EXTRA_TRAIN_ARGS[i]}" in
            --rollout-max-response-len) budget="${EXTRA_TRAIN_ARGS[i + 1]:-$budget}" ;;
            --rollout-max-response-len=*) budget="${EXTRA_TRAIN_ARGS[i]#*=}" ;;
        esac
    done
    verdict=$(strands_python -m strands_slime.config "$ROLLOUT_CONFIG" --max-response-len "$budget" 2>&1) ||
        die "ROLLOUT_CONFIG: $(last_line "$verdict")"
    log "$verdict"
    # Without math-verify the reward silently falls back to string and number checks: a real run
    # imports it (a broken install fails too), a dry run only looks for it (importing sympy is slow).
    status=0
    verdict=$(strands_python -c '
import importlib, importlib.util, sys
from strands_slime.config import load_config
reward = load_config(sys.argv[1]).reward
if reward.math_verify:
    if sys.argv[2] == "1":
        sys.exit(4 if importlib.util.find_spec("math_verify") is None else 0)
    try:
        importlib.import_module("math_verify")
    except Exception:
        sys.exit(4)
' "$ROLLOUT_CONFIG" "$(dry_run && echo 1 || echo 0)" 2>&1) || status=$?
    if ((status == 4)); then
        problem="ROLLOUT_CONFIG enables reward.math_verify but the math-verify package is not installed on this node: pip install 'math-verify>=0.7' (or set math_verify: false)"
        if dry_run; then log "note (dry run, not fatal): $problem"; else die "$problem"; fi
    elif ((status != 0)); then
        die "ROLLOUT_CONFIG: $(last_line "$verdict")"
    fi
fi
if ! dry_run && ! is_true "$LAUNCH_CHECKED"; then
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
# NODE_DIR ($RUN_DIR/node<rank>) holds this node's logs and, on rank 0, the run's state, and records
# the PIDs this launch started: the launcher itself, its `ray start --block` process, whose SIGTERM
# handler stops exactly the Ray processes of that node, and a pilot's GPU sampler. Nothing else on
# the machine is ever signalled.
LAUNCHER_PID_FILE="$NODE_DIR/launcher.pid"
RAY_PID_FILE="$NODE_DIR/ray-node.pid"
SAMPLER_PID_FILE="$NODE_DIR/gpu-sampler.pid"
LOG_FILE="$NODE_DIR/launch.log"
RAY_LOG_FILE="$NODE_DIR/ray-node.log"
STATE_FILE="$NODE_DIR/state.json"
HEAD_MARKER="$SAVE_DIR/.strands-slime-head"
RAY_NODE_PID=""
HEAD_CMD=()
JOB_ID=""
SUPERVISOR_PID=""
SAMPLER_PID=""
RUNTIME_ENV_FILE=""
RAY_VERSION=""

# Ray's ports, pinned so that the network rule can name them (docs/training.md, "Exposure"); derived
# from RAY_PORT so that two clusters on one machine (different RAY_PORTs) do not collide.
RAY_NODE_PORT_ARGS=(
    --node-manager-port "$((RAY_PORT + 1))" --object-manager-port "$((RAY_PORT + 2))"
    --runtime-env-agent-port "$((RAY_PORT + 3))" --dashboard-agent-grpc-port "$((RAY_PORT + 4))"
    --metrics-export-port "$((RAY_PORT + 5))" --dashboard-agent-listen-port "$((RAY_PORT + 6))"
    --min-worker-port 10002 --max-worker-port 19999
)

# pid_alive PID PATTERN: PID runs and its command line contains PATTERN (guards against PID reuse;
# a zombie has an empty command line and counts as gone).
pid_alive() {
    local pid="$1" pattern="$2" cmdline
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    cmdline=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || return 1
    [[ "$cmdline" == *"$pattern"* ]]
}

# stop_pid PID PATTERN WHAT [SECONDS [SIGNAL]]: SIGNAL (TERM), then SIGKILL after SECONDS (RAY_STOP_TIMEOUT).
stop_pid() {
    local pid="$1" pattern="$2" what="$3" deadline=$((SECONDS + ${4:-$RAY_STOP_TIMEOUT}))
    pid_alive "$pid" "$pattern" || return 0
    log "stopping $what (PID $pid)"
    kill "-${5:-TERM}" "$pid" 2>/dev/null || return 0
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

# Refuse (or, with KILL_STALE=1 and stop=1, stop) what an earlier launch from NODE_DIR left running.
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

# shellcheck disable=SC2329  # run by the EXIT trap
cleanup() {
    local status=$?
    set +e # every step of the clean-up runs, whatever an earlier one returned
    trap - EXIT HUP INT TERM
    # The supervisor stops the job it submitted (and records why) before this launch stops its Ray node.
    if [[ -n "$SUPERVISOR_PID" ]]; then
        # the signal this launcher got, so that state.json names it
        stop_pid "$SUPERVISOR_PID" "launch.supervisor" "the job's supervisor" "$((2 * RAY_STATUS_TIMEOUT + 60))" \
            "$( ((status > 128)) && echo $((status - 128)) || echo 15)"
    fi
    if [[ -n "$SAMPLER_PID" ]]; then
        stop_pid "$SAMPLER_PID" "gpu_sampler" "the GPU sampler"
        rm -f -- "$SAMPLER_PID_FILE"
    fi
    if ((NODE_RANK == 0)); then
        reason="the launcher stopped (exit status $status)"
        ((status > 128)) && reason="the launcher stopped by signal $((status - 128)) (exit status $status)"
        [[ -f "$STATE_FILE" ]] && strands_python -m strands_slime.launch.supervisor mark-stopped \
            --state-file "$STATE_FILE" --reason "$reason"
        if ((NUM_NODES > 1)) && [[ -f "$HEAD_MARKER" ]]; then
            write_head_marker ended || true
        fi
    fi
    # The supervisor records the head it started again, if it had to.
    [[ -n "$RAY_NODE_PID" ]] && RAY_NODE_PID=$(recorded_pid "$RAY_PID_FILE")
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

# version_at_least VERSION MINIMUM
version_at_least() {
    [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" == "$2" ]]
}

# Ray token authentication (Ray >= 2.52): every Ray process, CLI call and API client of the cluster
# must present the token. decide_ray_auth (before detaching, so a refusal reaches the terminal) reads
# the installed Ray's version; setup_ray_auth then has the head write the token once into SAVE_DIR
# (mode 600; every node shares SAVE_DIR). RAY_AUTH_MODE and RAY_AUTH_TOKEN_PATH reach this node's Ray
# processes through the environment of `ray start`, like the W&B key, and are scrubbed from the
# sandbox's environment.
RAY_AUTH_ENABLED=0
decide_ray_auth() {
    RAY_VERSION=$(ray --version 2>/dev/null | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -n 1 || true)
    local supported=0
    if [[ -n "$RAY_VERSION" ]] && version_at_least "$RAY_VERSION" 2.52.0; then supported=1; fi
    if [[ "$RAY_AUTH" == off ]] || { [[ "$RAY_AUTH" == auto ]] && ((supported == 0)); }; then
        log "note: Ray token authentication is off (RAY_AUTH=$RAY_AUTH, Ray ${RAY_VERSION:-unknown}; it needs 2.52+): anyone who reaches the cluster's ports can run code on it; see docs/training.md, Exposure"
        return 0
    fi
    ((supported)) || die "RAY_AUTH=on needs Ray 2.52 or newer for token authentication; this node has Ray ${RAY_VERSION:-unknown}"
    RAY_AUTH_ENABLED=1
}

setup_ray_auth() {
    ((RAY_AUTH_ENABLED)) || return 0
    if dry_run; then
        printf '# Ray token authentication: on (Ray %s); token in %s (mode 600, written by the head)\n' \
            "$RAY_VERSION" "$RAY_AUTH_TOKEN_FILE"
        return 0
    fi
    if [[ ! -s "$RAY_AUTH_TOKEN_FILE" ]]; then
        if ((NODE_RANK > 0)); then
            die "RAY_AUTH_TOKEN_FILE ($RAY_AUTH_TOKEN_FILE) is missing: the head writes it into SAVE_DIR, which every node must share"
        fi
        mkdir -p -- "$(dirname -- "$RAY_AUTH_TOKEN_FILE")"
        (umask 077 && python3 -c 'import secrets; print(secrets.token_urlsafe(32))' >"$RAY_AUTH_TOKEN_FILE")
    fi
    local mode
    mode=$(stat -c %a -- "$RAY_AUTH_TOKEN_FILE")
    (((8#$mode & 8#077) == 0)) ||
        die "RAY_AUTH_TOKEN_FILE ($RAY_AUTH_TOKEN_FILE) is readable by others (mode $mode); chmod 600 it"
    export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$RAY_AUTH_TOKEN_FILE"
    log "Ray token authentication on (Ray $RAY_VERSION, token in $RAY_AUTH_TOKEN_FILE)"
}

# run_preflight [--ray-version V] [--wandb-key-required]: this node's GPUs, Ray, W&B key, the
# installed router's acceptance of our router options and writable shared folders.
run_preflight() {
    local args=(--gpus "$GPUS_PER_NODE" "$@") token
    for token in "${ROUTER_ARGS[@]}"; do args+=("--router-arg=$token"); done
    if dry_run; then # a dry run creates no folder
        strands_python -m strands_slime.launch.preflight "${args[@]}" --notes-only >/dev/null || true
        return 0
    fi
    args+=(--writable "$SAVE_DIR" --writable "$RUN_DIR" --sandbox-config "$ROLLOUT_CONFIG")
    is_true "$SANDBOX_HOST_NETWORK" && args+=(--allow-host-network)
    is_true "$PILOT" && args+=(--writable "$PILOT_DIR")
    local verdict
    verdict=$(strands_python -m strands_slime.launch.preflight "${args[@]}" 2>&1) || {
        printf '%s\n' "$verdict" | sed 's/^preflight error: /  - /' >&2
        die "preflight failed on rank $NODE_RANK ($NODE_IP): see the lines above"
    }
    log "$verdict"
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
        TENSORBOARD_DIR "$TENSORBOARD_DIR"
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
    local cmd=(ray start "$@" "${RAY_NODE_PORT_ARGS[@]}" --block)
    HEAD_CMD=("${cmd[@]}")
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

start_head() {
    start_ray_node --head --node-ip-address "$NODE_IP" --port "$RAY_PORT" --temp-dir "$RAY_TEMP_DIR" \
        --num-gpus "$GPUS_PER_NODE" --disable-usage-stats --ray-client-server-port "$((RAY_PORT + 7))" \
        "${RAY_RESOURCE_ARGS[@]}" \
        --dashboard-host "$RAY_DASHBOARD_HOST" --dashboard-port "$RAY_DASHBOARD_PORT"
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
# checkpoint from every node). The head writes a marker naming itself, the time, whether its run
# goes on, its Ray version and whether it logs to W&B; a worker that does not see a fresh marker for
# the same head is looking at a different filesystem, and checks its own Ray and W&B key against it.
write_head_marker() {
    if dry_run; then
        printf '# SAVE_DIR check: write %s for the workers to find\n' "$HEAD_MARKER"
        return
    fi
    mkdir -p -- "$SAVE_DIR"
    printf '%s:%s %s %s %s %s\n' "$MASTER_ADDR" "$RAY_PORT" "$(date +%s)" "$1" "${RAY_VERSION:-unknown}" \
        "$([[ -n "$WANDB_API_KEY" ]] && echo 1 || echo 0)" >"$HEAD_MARKER.tmp"
    mv -f -- "$HEAD_MARKER.tmp" "$HEAD_MARKER"
}

# read_head_marker: HEAD_STATE, HEAD_RAY_VERSION, HEAD_HAS_WANDB from the marker (empty if none).
read_head_marker() {
    HEAD_ADDRESS="" HEAD_WRITTEN=0 HEAD_STATE="" HEAD_RAY_VERSION="" HEAD_HAS_WANDB=0
    [[ -f "$HEAD_MARKER" ]] || return 0
    read -r HEAD_ADDRESS HEAD_WRITTEN HEAD_STATE HEAD_RAY_VERSION HEAD_HAS_WANDB <"$HEAD_MARKER" || true
    [[ "$HEAD_WRITTEN" =~ ^[0-9]+$ ]] || HEAD_WRITTEN=0
}

# wait_for_head_marker: a fresh marker of this run's head, whose run goes on, appears in SAVE_DIR
# within RAY_WAIT_TIMEOUT (the head writes it before it starts Ray, and before its auth token).
wait_for_head_marker() {
    if dry_run; then
        printf '# SAVE_DIR check: %s must appear here, written by the head within RAY_WAIT_TIMEOUT\n' "$HEAD_MARKER"
        return
    fi
    local deadline=$((SECONDS + RAY_WAIT_TIMEOUT))
    while :; do
        read_head_marker
        if [[ "$HEAD_ADDRESS" == "$MASTER_ADDR:$RAY_PORT" && "$HEAD_STATE" == running ]] &&
            (($(date +%s) - HEAD_WRITTEN <= RAY_WAIT_TIMEOUT + 60)); then
            return 0
        fi
        ((SECONDS < deadline)) ||
            die "SAVE_DIR ($SAVE_DIR) is not shared with the head: no fresh $HEAD_MARKER from $MASTER_ADDR:$RAY_PORT here within ${RAY_WAIT_TIMEOUT}s (start rank 0 too); put SAVE_DIR on a filesystem every node mounts at the same path"
        log "waiting for the head's marker $HEAD_MARKER"
        nap "$(poll_delay "$deadline" "$RAY_POLL_INTERVAL")"
    done
}

# start_gpu_sampler: a pilot's nvidia-smi sampling on this node, into the shared PILOT_DIR.
start_gpu_sampler() {
    local cmd=(python3 -m strands_slime.launch.gpu_sampler --out "$PILOT_DIR/gpu-node$NODE_RANK.jsonl"
        --node "$NODE_RANK" --interval 2)
    if dry_run; then
        print_cmd "${cmd[@]}"
        return
    fi
    mkdir -p -- "$PILOT_DIR"
    PYTHONPATH="$STRANDS_SLIME_DIR${PYTHONPATH:+:$PYTHONPATH}" setsid "${cmd[@]}" </dev/null \
        >>"$NODE_DIR/gpu-sampler.log" 2>&1 &
    SAMPLER_PID=$!
    printf '%s\n' "$SAMPLER_PID" >"$SAMPLER_PID_FILE"
}

# supervise: submit train.py and supervise it (strands_slime.launch.supervisor): Ray's job state, never
# the submit client's exit code; the old job stopped before any resubmit; the nodes waited for; a
# progress watchdog; restarts within a window. The run's state goes to STATE_FILE.
supervise() {
    local submit=(ray job submit --address "http://127.0.0.1:$RAY_DASHBOARD_PORT" --submission-id JOB_ID --no-wait)
    local cmd=(python3 -m strands_slime.launch.supervisor run --state-file "$STATE_FILE" --node-dir "$NODE_DIR"
        --checkpoint-dir "$CHECKPOINT_DIR" --save-dir "$SAVE_DIR" --address "http://127.0.0.1:$RAY_DASHBOARD_PORT"
        --gcs-address "$MASTER_ADDR:$RAY_PORT" --job-steps "$JOB_STEPS" --save-interval "$SAVE_INTERVAL"
        --nodes "$NUM_NODES" --gpus "$TOTAL_GPUS" --max-restarts "$MAX_RESTARTS"
        --restart-window-hours "$RESTART_WINDOW_HOURS" --max-restarts-without-progress "$MAX_RESTARTS_WITHOUT_PROGRESS"
        --restart-backoff "$RESTART_BACKOFF" --restart-backoff-max "$RESTART_BACKOFF_MAX"
        --watchdog-seconds "$((WATCHDOG_MINUTES * 60))" --poll-interval "$RAY_POLL_INTERVAL"
        --status-timeout "$RAY_STATUS_TIMEOUT" --node-wait-timeout "$RAY_WAIT_TIMEOUT" --checkpoint-gb "$CHECKPOINT_GB")
    is_true "$PILOT" && cmd+=(--pilot)
    # Megatron keeps every checkpoint whose iteration is a multiple of --save-retain-interval, and 0
    # is one: with SAVE_INTERVAL=1 the first save (iteration 0) would stay forever.
    [[ "$KEEP_CHECKPOINTS" == latest ]] && ((SAVE_INTERVAL == 1)) && cmd+=(--remove-first-checkpoint)
    if dry_run; then
        printf '# runtime-env (written to a private file in RUN_DIR):\n'
        runtime_env_json | sed 's/^/#   /'
        printf '# the supervisor waits until %s nodes with %s GPUs in all have joined (up to %ss), then submits, each attempt:\n' \
            "$NUM_NODES" "$TOTAL_GPUS" "$RAY_WAIT_TIMEOUT"
        print_cmd "${submit[@]}" --runtime-env RUNTIME_ENV_FILE -- "${TRAIN_CMD[@]}"
        printf '# and supervises it with:\n'
        print_cmd "${cmd[@]}" --runtime-env RUNTIME_ENV_FILE -- TRAIN_CMD
        return
    fi
    RUNTIME_ENV_FILE=$(mktemp "$NODE_DIR/runtime-env.XXXXXX")
    runtime_env_json >"$RUNTIME_ENV_FILE"
    cmd+=(--runtime-env "$RUNTIME_ENV_FILE")
    if [[ -n "$RAY_NODE_PID" ]]; then # this launch started the head: the supervisor may start it again
        cmd+=(--head-command "$(python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "${HEAD_CMD[@]}")"
            --head-pid-file "$RAY_PID_FILE" --head-log "$RAY_LOG_FILE")
    fi
    log "supervising the job (dashboard: http://$RAY_DASHBOARD_HOST:$RAY_DASHBOARD_PORT; state: $STATE_FILE)"
    print_cmd "${submit[@]}" --runtime-env "$RUNTIME_ENV_FILE" -- "${TRAIN_CMD[@]}" >&2
    PYTHONPATH="$STRANDS_SLIME_DIR${PYTHONPATH:+:$PYTHONPATH}" "${cmd[@]}" -- "${TRAIN_CMD[@]}" </dev/null &
    SUPERVISOR_PID=$!
    # `wait` (not a foreground child) so a signal runs the trap at once.
    local status=0
    wait "$SUPERVISOR_PID" || status=$?
    SUPERVISOR_PID=""
    JOB_ID=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get("job_id", ""))' "$STATE_FILE" 2>/dev/null || true)
    return "$status"
}

# analyze_pilot: measure what the pilot wrote and project the full run (pilot.json, pilot.md).
analyze_pilot() {
    local samples=("$PILOT_DIR"/gpu-node*.jsonl) extra=()
    [[ -n "$GPU_HOUR_PRICE" ]] && extra+=(--gpu-hour-price "$GPU_HOUR_PRICE")
    [[ -n "$RUN_HOURS" ]] && extra+=(--run-hours "$RUN_HOURS")
    ((RUN_EVAL_INTERVAL > 0)) && extra+=(--eval-interval "$RUN_EVAL_INTERVAL" --eval-prompts "$EVAL_PROMPTS"
        --eval-samples-per-prompt "$N_SAMPLES_PER_EVAL_PROMPT" --eval-max-response-len "$EVAL_MAX_RESPONSE_LEN")
    local cmd=(python3 -m strands_slime.launch.pilot analyze --log "$NODE_DIR/job-$JOB_ID.log"
        --out "$PILOT_DIR" --tensorboard "$TENSORBOARD_DIR" --checkpoint-dir "$CHECKPOINT_DIR"
        --num-rollout "$NUM_ROLLOUT" --gpus "$TOTAL_GPUS" --nodes "$NUM_NODES" --retain "$KEEP_CHECKPOINTS"
        --checkpoint-gb "$CHECKPOINT_GB" --max-hours-at-risk "$SAVE_HOURS" --max-tokens-per-gpu "$MAX_TOKENS_PER_GPU"
        "${extra[@]}"
        "${PILOT_SETTINGS[@]/#/--setting=}")
    if dry_run; then
        printf '# after the pilot: stop the GPU samplers, then measure and project:\n'
        print_cmd "${cmd[@]}" --gpu-samples "$PILOT_DIR/gpu-node*.jsonl"
        return 0
    fi
    if [[ -n "$SAMPLER_PID" ]]; then
        stop_pid "$SAMPLER_PID" "gpu_sampler" "the GPU sampler"
        SAMPLER_PID=""
        rm -f -- "$SAMPLER_PID_FILE"
    fi
    [[ -e "${samples[0]}" ]] || samples=()
    local status=0
    PYTHONPATH="$STRANDS_SLIME_DIR${PYTHONPATH:+:$PYTHONPATH}" "${cmd[@]}" --gpu-samples "${samples[@]}" >&2 ||
        status=$?
    if ! is_true "$PILOT_KEEP_CHECKPOINT" && [[ -d "$CHECKPOINT_DIR" ]]; then
        log "removing the pilot's checkpoint ($CHECKPOINT_DIR; PILOT_KEEP_CHECKPOINT=1 keeps it)"
        rm -rf -- "$CHECKPOINT_DIR"
    fi
    log "pilot report: $PILOT_DIR/pilot.md; the run sizes its checkpoints from $PILOT_JSON"
    return "$status"
}

# A pilot starts in a fresh PILOT_DIR; an earlier pilot's folder is kept beside it, renamed.
fresh_pilot_dir() {
    if dry_run; then
        printf '# pilot: %s starts empty (an earlier pilot there is moved to %s.<time>)\n' "$PILOT_DIR" "$PILOT_DIR"
        return
    fi
    if [[ -d "$PILOT_DIR" ]] && [[ -n "$(ls -A -- "$PILOT_DIR")" ]]; then
        local kept
        kept="$PILOT_DIR.$(date -r "$PILOT_DIR" +%Y%m%d-%H%M%S)"
        mv -- "$PILOT_DIR" "$kept"
        log "the earlier pilot's folder is now $kept"
    fi
    mkdir -p -- "$PILOT_DIR"
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
    printf '# run state and logs: %s; Ray temp dir: %s\n' "$NODE_DIR" "$RAY_TEMP_DIR"
fi

if ! dry_run; then
    (umask 077 && mkdir -p -- "$NODE_DIR")
    [[ -O "$NODE_DIR" ]] || die "RUN_DIR ($NODE_DIR) belongs to another user; set RUN_DIR"
    check_previous_launch 0
fi
if ((NODE_RANK == 0)) && ! is_true "$REUSE_RAY" && ! is_true "$KILL_STALE" && ! dry_run && ray_is_up; then
    die "a Ray cluster is already running at $MASTER_ADDR:$RAY_PORT; use another RAY_PORT, or REUSE_RAY=1 to submit to it"
fi
# The head checks its own node now; a worker checks itself against the head's marker once it sees
# it (in the launcher that stays, after detaching).
if dry_run || { ((NODE_RANK == 0)) && ! is_true "$LAUNCH_CHECKED"; }; then
    run_preflight
fi
decide_ray_auth

if ((FOREGROUND == 0)); then
    detach=(env LAUNCH_CHECKED=1 setsid bash "$SCRIPT_DIR/$SCRIPT_NAME" "${DETACHED_ARGS[@]}")
    if dry_run; then
        printf -v quoted '%q ' "${detach[@]}"
        printf '# checks passed; the launcher now detaches (a closed terminal does not stop it; --foreground stays attached):\n'
        printf '#   %s> %q\n' "$quoted" "$LOG_FILE"
    else
        "${detach[@]}" >>"$LOG_FILE" 2>&1 </dev/null &
        printf '%s\n' "$!" >"$LAUNCHER_PID_FILE"
        log "checks passed; the launch runs in the background as PID $!, in its own session"
        log "log:  tail -f $LOG_FILE"
        ((NODE_RANK == 0)) && log "state: $STATE_FILE"
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
    printf '# KILL_STALE=1: first stop the launcher and Ray node recorded in %s, if still running\n' "$NODE_DIR"
fi

if ((NODE_RANK == 0)); then
    setup_ray_auth
    if is_true "$PILOT"; then
        fresh_pilot_dir
    fi
    if ((NUM_NODES > 1)); then
        write_head_marker running
    fi
    if is_true "$REUSE_RAY" && ! dry_run && ray_is_up; then
        log "REUSE_RAY=1: submitting to the running Ray cluster (it will be left running)"
        if [[ -n "$WANDB_API_KEY" ]]; then
            log "REUSE_RAY=1: its Ray processes must already hold WANDB_API_KEY; this launch does not pass it"
        fi
    else
        start_head
        dry_run || wait_until_head_is_up "ray start did not bring it up"
    fi
    if is_true "$PILOT"; then
        start_gpu_sampler
    fi
    if dry_run; then
        supervise
        is_true "$PILOT" && analyze_pilot
        exit 0
    fi
    mkdir -p -- "$SAVE_DIR"
    status=0
    supervise || status=$?
    if is_true "$PILOT"; then
        analyze_pilot || status=$((status == 0 ? 1 : status))
    fi
    exit "$status"
else
    log "rank $NODE_RANK of $NUM_NODES ($NODE_IP): joining the Ray head at $MASTER_ADDR:$RAY_PORT as a worker"
    if dry_run; then
        wait_for_head_marker
        setup_ray_auth
        printf '# wait for the Ray head at %s:%s (up to %ss), then check this node against the head\n' \
            "$MASTER_ADDR" "$RAY_PORT" "$RAY_WAIT_TIMEOUT"
        is_true "$PILOT" && start_gpu_sampler
        start_ray_node --address "$MASTER_ADDR:$RAY_PORT" --node-ip-address "$NODE_IP" --temp-dir "$RAY_TEMP_DIR" \
            --num-gpus "$GPUS_PER_NODE" --disable-usage-stats "${RAY_RESOURCE_ARGS[@]}"
        exit 0
    fi
    # A worker follows the head's run: it rejoins after its node exits while the head's marker says
    # the run goes on (the head restarted it), and stops when the run is over.
    joins=0
    while :; do
        joins=$((joins + 1))
        if ((joins == 1)); then
            wait_for_head_marker
            setup_ray_auth
            wait_until_head_is_up "start rank 0 first"
            preflight_args=()
            [[ -n "$HEAD_RAY_VERSION" && "$HEAD_RAY_VERSION" != unknown ]] && preflight_args+=(--ray-version "$HEAD_RAY_VERSION")
            [[ "$HEAD_HAS_WANDB" == 1 ]] && preflight_args+=(--wandb-key-required)
            run_preflight "${preflight_args[@]}"
            is_true "$PILOT" && start_gpu_sampler
        else
            wait_until_head_is_up "the head did not come back"
        fi
        start_ray_node --address "$MASTER_ADDR:$RAY_PORT" --node-ip-address "$NODE_IP" --temp-dir "$RAY_TEMP_DIR" \
            --num-gpus "$GPUS_PER_NODE" --disable-usage-stats "${RAY_RESOURCE_ARGS[@]}"
        status=0
        wait "$RAY_NODE_PID" || status=$?
        RAY_NODE_PID=""
        rm -f -- "$RAY_PID_FILE"
        read_head_marker
        if [[ "$HEAD_STATE" != running ]]; then
            log "the Ray node exited (status $status) and the head's run is over (${HEAD_STATE:-no state}): this worker stops"
            [[ "$HEAD_STATE" == ended ]] && exit 0
            exit "$status"
        fi
        if ((joins > MAX_RESTARTS)); then
            die "the Ray node exited $joins times while the head's run goes on (MAX_RESTARTS=$MAX_RESTARTS): this worker gives up"
        fi
        log "the Ray node exited (status $status) while the head's run goes on: rejoining"
        nap "$RAY_POLL_INTERVAL"
    done
fi
exit
}
