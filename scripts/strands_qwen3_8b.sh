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
    cat <<'EOF'
Usage: scripts/strands_qwen3_8b.sh [--dry-run] [-- EXTRA_TRAIN_PY_FLAGS...]

Train Qwen3-8B with slime + strands_slime. Run it on every node: rank 0 starts the Ray head and
submits train.py, other ranks join as Ray workers and block until the cluster stops.
Flags after `--` are appended to train.py's command line (the last occurrence of a flag wins).

Options
  --dry-run, DRY_RUN=1   print the resolved commands and start nothing
  -h, --help             this text

Environment (default)
  SLIME_DIR (/root/slime)  MEGATRON_DIR (/root/Megatron-LM)  STRANDS_SLIME_DIR (this repository)
  MODEL_DIR (/root/models)  HF_CHECKPOINT ($MODEL_DIR/Qwen3-8B)
  REF_LOAD ($MODEL_DIR/Qwen3-8B_torch_dist)  SAVE_DIR (/root/checkpoints/qwen3-8b-strands-slime)
  DATA_DIR (/root/data)  PROMPT_DATA ($DATA_DIR/dapo-math-17k.jsonl)
  EVAL_DATA ($DATA_DIR/aime-2024.jsonl)  EVAL_CONFIG (unset; a slime --eval-config YAML replaces
  EVAL_DATA)  ROLLOUT_CONFIG ($STRANDS_SLIME_DIR/configs/strands_math.yaml)
  NUM_NODES (1)  NODE_RANK (0)  MASTER_ADDR (127.0.0.1)  NODE_IP (unset)  GPUS_PER_NODE (8)
  RAY_PORT (6379)  RAY_DASHBOARD_PORT (8265)  RAY_WAIT_TIMEOUT (900 s)
  NUM_ROLLOUT (3000)  ROLLOUT_BATCH_SIZE (16)  N_SAMPLES_PER_PROMPT (8)  GLOBAL_BATCH_SIZE (128)
  MAX_RESPONSE_LEN (16384)  ROLLOUT_TEMPERATURE (1.0)
  EVAL_INTERVAL (20; 0 disables eval)  N_SAMPLES_PER_EVAL_PROMPT (16)  EVAL_MAX_RESPONSE_LEN (16384)
  SAVE_INTERVAL (20)  TP_SIZE (2)  MAX_TOKENS_PER_GPU (18432)  ROLLOUT_GPUS_PER_ENGINE (2)
  SGLANG_MEM_FRACTION (0.4)  ROUTER_POLICY (manual)  ROUTER_ASSIGNMENT_MODE (min_load)
  LR (1e-6)  KL_LOSS_COEF (0.00)  ENTROPY_COEF (0.00)  OFF_POLICY_CORRECTION (tis | rollout-logprobs | none)
  WANDB_API_KEY or WANDB_KEY (unset: no W&B)  WANDB_PROJECT (strands-slime)  WANDB_GROUP (qwen3-8b-strands-math)
  KILL_STALE (0; 1 = `ray stop --force` and kill leftover sglang processes on this node first)
  REUSE_RAY (0; 1 = submit to a Ray cluster that is already running instead of refusing)
  KEEP_RAY (0; 1 = leave the Ray processes this script started running when it exits)
  HAS_NVLINK (auto-detected with nvidia-smi)
EOF
}

EXTRA_TRAIN_ARGS=()
while (($# > 0)); do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
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
EVAL_CONFIG="${EVAL_CONFIG:-}"
ROLLOUT_CONFIG="${ROLLOUT_CONFIG:-$STRANDS_SLIME_DIR/configs/strands_math.yaml}"

NUM_NODES="${NUM_NODES:-1}"
NODE_RANK="${NODE_RANK:-0}"
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
NODE_IP="${NODE_IP:-}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
RAY_PORT="${RAY_PORT:-6379}"
RAY_DASHBOARD_PORT="${RAY_DASHBOARD_PORT:-8265}"
RAY_WAIT_TIMEOUT="${RAY_WAIT_TIMEOUT:-900}"

NUM_ROLLOUT="${NUM_ROLLOUT:-3000}"
ROLLOUT_BATCH_SIZE="${ROLLOUT_BATCH_SIZE:-16}"
N_SAMPLES_PER_PROMPT="${N_SAMPLES_PER_PROMPT:-8}"
GLOBAL_BATCH_SIZE="${GLOBAL_BATCH_SIZE:-128}"
MAX_RESPONSE_LEN="${MAX_RESPONSE_LEN:-16384}"
ROLLOUT_TEMPERATURE="${ROLLOUT_TEMPERATURE:-1.0}"
EVAL_INTERVAL="${EVAL_INTERVAL:-20}"
N_SAMPLES_PER_EVAL_PROMPT="${N_SAMPLES_PER_EVAL_PROMPT:-16}"
EVAL_MAX_RESPONSE_LEN="${EVAL_MAX_RESPONSE_LEN:-16384}"
SAVE_INTERVAL="${SAVE_INTERVAL:-20}"
TP_SIZE="${TP_SIZE:-2}"
MAX_TOKENS_PER_GPU="${MAX_TOKENS_PER_GPU:-18432}"
ROLLOUT_GPUS_PER_ENGINE="${ROLLOUT_GPUS_PER_ENGINE:-2}"
SGLANG_MEM_FRACTION="${SGLANG_MEM_FRACTION:-0.4}"
ROUTER_POLICY="${ROUTER_POLICY:-manual}"
ROUTER_ASSIGNMENT_MODE="${ROUTER_ASSIGNMENT_MODE:-min_load}"
LR="${LR:-1e-6}"
KL_LOSS_COEF="${KL_LOSS_COEF:-0.00}"
ENTROPY_COEF="${ENTROPY_COEF:-0.00}"
OFF_POLICY_CORRECTION="${OFF_POLICY_CORRECTION:-tis}"

WANDB_API_KEY="${WANDB_API_KEY:-${WANDB_KEY:-}}"
WANDB_PROJECT="${WANDB_PROJECT:-strands-slime}"
WANDB_GROUP="${WANDB_GROUP:-qwen3-8b-strands-math}"

KILL_STALE="${KILL_STALE:-0}"
REUSE_RAY="${REUSE_RAY:-0}"
KEEP_RAY="${KEEP_RAY:-0}"
# Variables passed on to every Ray worker when set here (multi-NIC hosts, caches, W&B options).
PASSTHROUGH_ENV=(SLIME_HOST_IP GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME NCCL_IB_HCA HF_HOME WANDB_MODE
    WANDB_BASE_URL WANDB_ENTITY)

# ---------------------------------------------------------------- validation (nothing started yet)
for name in NUM_NODES GPUS_PER_NODE NUM_ROLLOUT ROLLOUT_BATCH_SIZE N_SAMPLES_PER_PROMPT GLOBAL_BATCH_SIZE \
    MAX_RESPONSE_LEN N_SAMPLES_PER_EVAL_PROMPT EVAL_MAX_RESPONSE_LEN SAVE_INTERVAL TP_SIZE \
    MAX_TOKENS_PER_GPU ROLLOUT_GPUS_PER_ENGINE RAY_PORT RAY_DASHBOARD_PORT RAY_WAIT_TIMEOUT; do
    require_int "$name" 1
done
require_int NODE_RANK 0
require_int EVAL_INTERVAL 0
for name in ROLLOUT_TEMPERATURE SGLANG_MEM_FRACTION LR KL_LOSS_COEF ENTROPY_COEF; do
    require_number "$name"
done
is_true "$KILL_STALE" || true
is_true "$REUSE_RAY" || true
is_true "$KEEP_RAY" || true

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

case "$ROUTER_POLICY" in
    manual | consistent_hashing | cache_aware | round_robin | random | power_of_two) ;;
    *) die "ROUTER_POLICY must be manual, consistent_hashing, cache_aware, round_robin, random or power_of_two, got '$ROUTER_POLICY'" ;;
esac
case "$ROUTER_ASSIGNMENT_MODE" in
    min_load | min_group | random) ;;
    *) die "ROUTER_ASSIGNMENT_MODE must be min_load, min_group or random, got '$ROUTER_ASSIGNMENT_MODE'" ;;
esac

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
# run (no checkpoint there yet) starts from --ref-load.
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

EVAL_ARGS=()
if ((EVAL_INTERVAL > 0)); then
    EVAL_ARGS=(--eval-interval "$EVAL_INTERVAL")
    if [[ -n "$EVAL_CONFIG" ]]; then
        EVAL_ARGS+=(--eval-config "$EVAL_CONFIG")
    else
        EVAL_ARGS+=(--eval-prompt-data aime "$EVAL_DATA")
    fi
    # Defaults for datasets that do not set their own; --log-passrate adds eval/<name>-pass@k.
    EVAL_ARGS+=(
        --n-samples-per-eval-prompt "$N_SAMPLES_PER_EVAL_PROMPT"
        --eval-max-response-len "$EVAL_MAX_RESPONSE_LEN"
        --eval-top-p 1
        --log-passrate
    )
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

# The KL loss is computed (and logged) even at coefficient 0, which needs the reference model.
GRPO_ARGS=(
    --advantage-estimator grpo
    --use-kl-loss
    --kl-loss-coef "$KL_LOSS_COEF"
    --kl-loss-type low_var_kl
    --entropy-coef "$ENTROPY_COEF"
    --eps-clip 0.2
    --eps-clip-high 0.28
)
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

# The key itself goes to the workers through the runtime environment (WANDB_API_KEY), never on a
# command line where `ps` and Ray's job table would show it.
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
    --custom-rollout-log-function-path strands_slime.metrics.log_rollout
    --custom-eval-rollout-log-function-path strands_slime.metrics.log_eval_rollout
    --custom-config-path "$ROLLOUT_CONFIG"
)

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

# ---------------------------------------------------------------- environment checks
require_commands ray python3
check_dir "slime checkout (SLIME_DIR)" "$SLIME_DIR"
check_file "slime's train.py" "$SLIME_DIR/train.py"
check_dir "Megatron-LM checkout (MEGATRON_DIR)" "$MEGATRON_DIR/megatron"
check_dir "strands_slime package (STRANDS_SLIME_DIR)" "$STRANDS_SLIME_DIR/strands_slime"
if ((NODE_RANK == 0)); then
    check_file "Hugging Face checkpoint (HF_CHECKPOINT)" "$HF_CHECKPOINT/config.json" \
        "hf download Qwen/Qwen3-8B --local-dir $HF_CHECKPOINT"
    check_file "torch_dist checkpoint (REF_LOAD)" "$REF_LOAD/latest_checkpointed_iteration.txt" \
        "run scripts/convert_qwen3_8b.sh"
    check_file "training data (PROMPT_DATA)" "$PROMPT_DATA" "python -m data_prep.download --out $DATA_DIR"
    if ((EVAL_INTERVAL > 0)); then
        if [[ -n "$EVAL_CONFIG" ]]; then
            check_file "eval config (EVAL_CONFIG)" "$EVAL_CONFIG"
        else
            check_file "eval data (EVAL_DATA)" "$EVAL_DATA" "python -m data_prep.download --out $DATA_DIR"
        fi
    fi
    check_file "rollout config (ROLLOUT_CONFIG)" "$ROLLOUT_CONFIG"
fi
finish_checks
if ((NODE_RANK == 0)) && ! dry_run; then
    python3 "$SCRIPT_DIR/lib/check_hf_config.py" "$HF_CHECKPOINT" -- "${MODEL_ARGS[@]}" ||
        die "HF_CHECKPOINT does not hold Qwen3-8B"
fi

# ---------------------------------------------------------------- Ray lifecycle
STARTED_RAY=0
JOB_ID=""
JOB_DONE=0
RUNTIME_ENV_FILE=""

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    if [[ -n "$JOB_ID" ]] && ((JOB_DONE == 0)); then
        log "stopping Ray job $JOB_ID"
        ray job stop --address "http://127.0.0.1:$RAY_DASHBOARD_PORT" "$JOB_ID" >&2 || true
    fi
    if ((STARTED_RAY == 1)) && ! is_true "$KEEP_RAY"; then
        log "stopping the Ray node this script started (KEEP_RAY=1 keeps it)"
        ray stop >&2 || true
    fi
    if [[ -n "$RUNTIME_ENV_FILE" ]]; then
        rm -f -- "$RUNTIME_ENV_FILE"
    fi
    exit "$status"
}

# poll_delay DEADLINE MAX: seconds to sleep before the next poll, never past the deadline.
poll_delay() {
    local remaining=$(($1 - SECONDS))
    if ((remaining < 1)); then echo 1; elif ((remaining < $2)); then echo "$remaining"; else echo "$2"; fi
}

ray_is_up() {
    ray status --address "$MASTER_ADDR:$RAY_PORT" >/dev/null 2>&1
}

kill_stale() {
    log "KILL_STALE=1: stopping every Ray process and sglang process on this node"
    run ray stop --force
    if dry_run; then
        print_cmd pkill -9 -f sglang
    else
        print_cmd pkill -9 -f sglang >&2
        pkill -9 -f sglang || true
    fi
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
        sleep "$(poll_delay "$deadline" 10)"
    done
}

runtime_env_json() {
    local redact="$1" pythonpath="$MEGATRON_DIR:$SLIME_DIR:$STRANDS_SLIME_DIR${PYTHONPATH:+:$PYTHONPATH}"
    local pairs=(
        PYTHONPATH "$pythonpath"
        CUDA_DEVICE_MAX_CONNECTIONS 1
        NCCL_NVLS_ENABLE "$(detect_nvlink)"
        PYTHONUNBUFFERED 1
        STRANDS_SLIME_CONFIG "$ROLLOUT_CONFIG"
        DATA_DIR "$DATA_DIR"
    )
    local name
    for name in "${PASSTHROUGH_ENV[@]}"; do
        if [[ -n "${!name:-}" ]]; then
            pairs+=("$name" "${!name}")
        fi
    done
    if [[ -n "$WANDB_API_KEY" ]]; then
        if ((redact)); then pairs+=(WANDB_API_KEY "<redacted>"); else pairs+=(WANDB_API_KEY "$WANDB_API_KEY"); fi
    fi
    json_env "${pairs[@]}"
}

start_ray_head() {
    local cmd=(ray start --head --node-ip-address "$MASTER_ADDR" --port "$RAY_PORT" --num-gpus "$GPUS_PER_NODE"
        --disable-usage-stats --dashboard-host 0.0.0.0 --dashboard-port "$RAY_DASHBOARD_PORT")
    if dry_run; then
        print_cmd "${cmd[@]}"
        return
    fi
    if ray_is_up; then
        is_true "$REUSE_RAY" ||
            die "a Ray cluster is already running at $MASTER_ADDR:$RAY_PORT; stop it (ray stop), or set REUSE_RAY=1 to use it or KILL_STALE=1 to kill it"
        log "REUSE_RAY=1: submitting to the running Ray cluster (it will be left running)"
        return
    fi
    STARTED_RAY=1
    run "${cmd[@]}"
}

submit_job() {
    JOB_ID="strands-qwen3-8b-$(date +%Y%m%d-%H%M%S)-$$"
    local submit=(ray job submit --address "http://127.0.0.1:$RAY_DASHBOARD_PORT" --submission-id "$JOB_ID")
    if dry_run; then
        printf '# runtime-env (written to a private temporary file):\n'
        runtime_env_json 1 | sed 's/^/#   /'
        print_cmd "${submit[@]}" --runtime-env RUNTIME_ENV_FILE -- "${TRAIN_CMD[@]}"
        JOB_ID=""
        return
    fi
    RUNTIME_ENV_FILE=$(mktemp "${TMPDIR:-/tmp}/strands-slime-runtime-env.XXXXXX")
    chmod 600 "$RUNTIME_ENV_FILE"
    runtime_env_json 0 >"$RUNTIME_ENV_FILE"
    log "submitting $JOB_ID (dashboard: http://$MASTER_ADDR:$RAY_DASHBOARD_PORT)"
    local status=0
    run "${submit[@]}" --runtime-env "$RUNTIME_ENV_FILE" -- "${TRAIN_CMD[@]}" || status=$?
    JOB_DONE=1
    return "$status"
}

start_ray_worker() {
    local cmd=(ray start --address "$MASTER_ADDR:$RAY_PORT" --num-gpus "$GPUS_PER_NODE" --disable-usage-stats)
    if [[ -n "$NODE_IP" ]]; then
        cmd+=(--node-ip-address "$NODE_IP")
    fi
    # --block keeps this script (and so its cleanup) alive as long as the worker runs.
    cmd+=(--block)
    if dry_run; then
        print_cmd "${cmd[@]}"
        return
    fi
    local deadline=$((SECONDS + RAY_WAIT_TIMEOUT))
    until ray_is_up; do
        ((SECONDS < deadline)) || die "no Ray head at $MASTER_ADDR:$RAY_PORT after ${RAY_WAIT_TIMEOUT}s; start rank 0 first"
        log "waiting for the Ray head at $MASTER_ADDR:$RAY_PORT"
        sleep "$(poll_delay "$deadline" 5)"
    done
    STARTED_RAY=1
    run "${cmd[@]}"
}

if ! dry_run; then
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
fi
if is_true "$KILL_STALE"; then
    kill_stale
fi

if ((NODE_RANK == 0)); then
    if [[ -n "$NODE_IP" && "$NODE_IP" != "$MASTER_ADDR" ]]; then
        log "note: NODE_IP is ignored on rank 0; the head binds MASTER_ADDR ($MASTER_ADDR)"
    fi
    start_ray_head
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
    log "rank $NODE_RANK of $NUM_NODES: joining the Ray head at $MASTER_ADDR:$RAY_PORT as a worker"
    start_ray_worker
fi
